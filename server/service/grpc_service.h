// The gRPC face of RequestHandler: unpacks, delegates, maps absl::Status to
// grpc::Status. Nothing else.
#ifndef HOSTKV_SERVER_SERVICE_GRPC_SERVICE_H_
#define HOSTKV_SERVER_SERVICE_GRPC_SERVICE_H_

#include <string>

#include "hostkv/v1/hostkv.grpc.pb.h"
#include "server/service/auth_token.h"
#include "server/operations/daemon_metrics.h"
#include "server/service/request_handler.h"

namespace hostkv {

// Every hostkv.v1.HostKV method: X(Method, Request, Response).
#define HOSTKV_V1_RPCS(X)                                                   \
  X(OpenSession, OpenSessionRequest, OpenSessionResponse)                   \
  X(RenewSession, RenewSessionRequest, RenewSessionResponse)                \
  X(CloseSession, CloseSessionRequest, CloseSessionResponse)                \
  X(CreatePool, CreatePoolRequest, Pool)                                    \
  X(GetPool, GetPoolRequest, Pool)                                          \
  X(ListPools, ListPoolsRequest, ListPoolsResponse)                         \
  X(DeletePool, DeletePoolRequest, DeletePoolResponse)                      \
  X(RegisterDeviceBuffers, RegisterDeviceBuffersRequest,                    \
    RegisterDeviceBuffersResponse)                                          \
  X(UnregisterDeviceBuffers, UnregisterDeviceBuffersRequest,                \
    UnregisterDeviceBuffersResponse)                                        \
  X(Alloc, AllocRequest, AllocResponse)                                     \
  X(Free, FreeRequest, FreeResponse)                                        \
  X(HandOverPages, HandOverPagesRequest, HandOverPagesResponse)             \
  X(Load, TransferRequest, TransferResponse)                                \
  X(Backup, TransferRequest, TransferResponse)                              \
  X(ReadPages, ReadPagesRequest, ReadPagesResponse)                         \
  X(WritePages, WritePagesRequest, WritePagesResponse)                      \
  X(GetPageBufferMeta, GetPageBufferMetaRequest, GetPageBufferMetaResponse) \
  X(Publish, PublishRequest, PublishResponse)                                \
  X(Lookup, LookupRequest, LookupResponse)                                   \
  X(ListEvictions, ListEvictionsRequest, ListEvictionsResponse)              \
  X(ExplainMisses, ExplainMissesRequest, ExplainMissesResponse)              \
  X(Release, ReleaseRequest, ReleaseResponse)                                \
  X(CopyPages, CopyPagesRequest, CopyPagesResponse)                          \
  X(GetPoolStats, GetPoolStatsRequest, GetPoolStatsResponse)

class GrpcService final : public v1::HostKV::Service {
 public:
  // With a non-empty `auth_token`, every call must carry the metadata
  // "authorization: Bearer <auth_token>" (else UNAUTHENTICATED).
  // `metrics` may be null.
  GrpcService(RequestHandler* handler, const std::string& auth_token,
              DaemonMetrics* metrics)
      : handler_(handler), authorizer_(auth_token), metrics_(metrics) {}

#define HOSTKV_DECLARE_RPC(Method, Request, Response)                 \
  grpc::Status Method(grpc::ServerContext* context,                    \
                      const v1::Request* request, v1::Response* response) \
      override;
  HOSTKV_V1_RPCS(HOSTKV_DECLARE_RPC)
#undef HOSTKV_DECLARE_RPC

 private:
  RequestHandler* const handler_;
  const TokenAuthorizer authorizer_;
  DaemonMetrics* const metrics_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_GRPC_SERVICE_H_
