#include "server/service/health_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace hostkv {

using grpc::health::v1::HealthCheckResponse;

HealthService::HealthService(const HealthOptions& options)
    : authorizer_(options.auth_token),
      probe_without_token_(options.probe_without_token),
      max_watches_(options.max_watches) {}

void HealthService::SetServing(const std::string& service, bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  serving_[service] = serving;
  ++generation_;
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (auto& [name, serving] : serving_) serving = false;
  ++generation_;
}

HealthService::Status HealthService::Lookup(const std::string& service) const {
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING
                    : HealthCheckResponse::NOT_SERVING;
}

grpc::Status HealthService::Check(
    grpc::ServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request,
    HealthCheckResponse* response) {
  // Only the whole server's status may go to a probe without the token: a
  // pool's SERVING vs NOT_FOUND would tell its name.
  const bool probe = probe_without_token_ && request->service().empty();
  if (!probe) {
    grpc::Status auth = authorizer_.Check(*context);
    if (!auth.ok()) return auth;
  }
  absl::MutexLock lock(&mu_);
  const Status status = Lookup(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown");
  }
  response->set_status(status);
  return grpc::Status::OK;
}

bool HealthService::BeginWatch() {
  absl::MutexLock lock(&mu_);
  if (watches_ >= max_watches_) return false;
  ++watches_;
  return true;
}

void HealthService::EndWatch() {
  absl::MutexLock lock(&mu_);
  --watches_;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  if (grpc::Status auth = authorizer_.Check(*context); !auth.ok()) return auth;
  if (!BeginWatch()) {
    if (uint64_t held_back = 0; watch_warnings_.Allow(&held_back)) {
      spdlog::warn("refused a health Watch from {}: {} streams already run "
                   "(--max_health_watches; {} more refused not logged)",
                   context->peer(), max_watches_, held_back);
    }
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("too many health Watch streams (--max_health_watches=",
                     max_watches_, "); use Check, or retry later"));
  }
  grpc::Status status = StreamChanges(context, request->service(), writer);
  EndWatch();
  return status;
}

grpc::Status HealthService::StreamChanges(
    grpc::ServerContext* context, const std::string& service,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  uint64_t seen = UINT64_MAX;
  Status last = HealthCheckResponse::UNKNOWN;
  while (!context->IsCancelled()) {
    Status status;
    bool shut_down;
    {
      absl::MutexLock lock(&mu_);
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return generation_ != seen;
      };
      // Wake up now and then to notice a cancelled watch.
      mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Seconds(1));
      seen = generation_;
      status = Lookup(service);
      shut_down = shut_down_;
    }
    if (status != last) {
      HealthCheckResponse response;
      response.set_status(status);
      if (!writer->Write(response)) break;
      last = status;
    }
    if (shut_down) break;
  }
  return grpc::Status::OK;
}

}  // namespace hostkv
