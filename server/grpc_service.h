// The gRPC face of RequestHandler: unpacks, delegates, maps absl::Status to
// grpc::Status. Nothing else.
#ifndef HOSTKV_SERVER_GRPC_SERVICE_H_
#define HOSTKV_SERVER_GRPC_SERVICE_H_

#include <string>
#include <utility>

#include "hostkv/v1/hostkv.grpc.pb.h"
#include "server/daemon_metrics.h"
#include "server/request_handler.h"

namespace hostkv {

class GrpcService final : public v1::HostKV::Service {
 public:
  // With a non-empty `auth_token`, every call must carry the metadata
  // "authorization: Bearer <auth_token>" (else UNAUTHENTICATED).
  // `metrics` may be null.
  GrpcService(RequestHandler* handler, std::string auth_token,
              DaemonMetrics* metrics)
      : handler_(handler),
        auth_token_(std::move(auth_token)),
        metrics_(metrics) {}

#define HOSTKV_RPC(Method, Request, Response)                          \
  grpc::Status Method(grpc::ServerContext* context, const v1::Request* \
                      request, v1::Response* response) override;
  HOSTKV_RPC(OpenSession, OpenSessionRequest, OpenSessionResponse)
  HOSTKV_RPC(RenewSession, RenewSessionRequest, RenewSessionResponse)
  HOSTKV_RPC(CloseSession, CloseSessionRequest, CloseSessionResponse)
  HOSTKV_RPC(CreatePool, CreatePoolRequest, Pool)
  HOSTKV_RPC(GetPool, GetPoolRequest, Pool)
  HOSTKV_RPC(ListPools, ListPoolsRequest, ListPoolsResponse)
  HOSTKV_RPC(DeletePool, DeletePoolRequest, DeletePoolResponse)
  HOSTKV_RPC(RegisterDeviceBuffers, RegisterDeviceBuffersRequest,
             RegisterDeviceBuffersResponse)
  HOSTKV_RPC(UnregisterDeviceBuffers, UnregisterDeviceBuffersRequest,
             UnregisterDeviceBuffersResponse)
  HOSTKV_RPC(Alloc, AllocRequest, AllocResponse)
  HOSTKV_RPC(Free, FreeRequest, FreeResponse)
  HOSTKV_RPC(HandOverPages, HandOverPagesRequest, HandOverPagesResponse)
  HOSTKV_RPC(Load, TransferRequest, TransferResponse)
  HOSTKV_RPC(Backup, TransferRequest, TransferResponse)
  HOSTKV_RPC(ReadPages, ReadPagesRequest, ReadPagesResponse)
  HOSTKV_RPC(WritePages, WritePagesRequest, WritePagesResponse)
  HOSTKV_RPC(GetPageBufferMeta, GetPageBufferMetaRequest,
             GetPageBufferMetaResponse)
  HOSTKV_RPC(GetPoolStats, GetPoolStatsRequest, GetPoolStatsResponse)
#undef HOSTKV_RPC

 private:
  // OK, or UNAUTHENTICATED if a token is required and not presented.
  grpc::Status Authorize(const grpc::ServerContext& context) const;

  RequestHandler* const handler_;
  const std::string auth_token_;
  DaemonMetrics* const metrics_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_GRPC_SERVICE_H_
