#include "server/service/grpc_service.h"

#include <chrono>
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

// The handler's method for a request; those that take the caller's
// deadline (Lookup waits for a storage tier) get it.
template <typename Request, typename Response>
absl::StatusOr<Response> Dispatch(
    RequestHandler* handler, grpc::ServerContext*, const Request& request,
    absl::StatusOr<Response> (RequestHandler::*method)(const Request&)) {
  return (handler->*method)(request);
}
template <typename Request, typename Response>
absl::StatusOr<Response> Dispatch(
    RequestHandler* handler, grpc::ServerContext* context,
    const Request& request,
    absl::StatusOr<Response> (RequestHandler::*method)(const Request&,
                                                       absl::Time)) {
  const auto deadline = context->deadline();
  const absl::Time until =
      deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365)
          ? absl::InfiniteFuture()
          : absl::FromChrono(deadline);
  return (handler->*method)(request, until);
}

}  // namespace

#define HOSTKV_DEFINE_RPC(Method, Request, Response)                       \
  grpc::Status GrpcService::Method(grpc::ServerContext* context,           \
                                   const v1::Request* request,             \
                                   v1::Response* response) {               \
    if (grpc::Status auth = authorizer_.Check(*context); !auth.ok()) {     \
      return auth;                                                         \
    }                                                                      \
    if (absl::Status open = handler_->AwaitOpen(); !open.ok()) {           \
      return ToGrpcStatus(open);                                           \
    }                                                                      \
    return Respond(#Method, context, metrics_,                             \
                   Dispatch(handler_, context, *request,                   \
                            &RequestHandler::Method),                      \
                   response);                                              \
  }
HOSTKV_V1_RPCS(HOSTKV_DEFINE_RPC)
#undef HOSTKV_DEFINE_RPC

}  // namespace hostkv
