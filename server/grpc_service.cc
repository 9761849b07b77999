#include "server/grpc_service.h"

#include <utility>

#include "proto/contract/grpc_status.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// Moves a handler result into the gRPC response; logs refused requests at
// debug level (a client's mistake is not the daemon's news).
template <typename Response>
grpc::Status Respond(const char* method, grpc::ServerContext* context,
                     DaemonMetrics* metrics, absl::StatusOr<Response> result,
                     Response* response) {
  if (metrics != nullptr) metrics->RecordRpc(method, result.status().code());
  if (!result.ok()) {
    spdlog::debug("{} from {} refused: {}", method, context->peer(),
                  result.status().ToString());
    return ToGrpcStatus(result.status());
  }
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status GrpcService::Authorize(const grpc::ServerContext& context) const {
  if (auth_token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it != metadata.end() &&
      std::string(it->second.data(), it->second.size()) ==
          "Bearer " + auth_token_) {
    return grpc::Status::OK;
  }
  spdlog::warn("refused a call from {}: missing or wrong token",
               context.peer());
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this daemon requires 'authorization: Bearer <token>'");
}

#define HOSTKV_RPC(Method, Request, Response)                              \
  grpc::Status GrpcService::Method(grpc::ServerContext* context,           \
                                   const v1::Request* request,             \
                                   v1::Response* response) {               \
    if (grpc::Status auth = Authorize(*context); !auth.ok()) return auth;  \
    return Respond(#Method, context, metrics_, handler_->Method(*request), \
                   response);                                              \
  }
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

}  // namespace hostkv
