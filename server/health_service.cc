#include "server/health_service.h"

#include "absl/time/time.h"

namespace hostkv {

using grpc::health::v1::HealthCheckResponse;

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
    grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
    HealthCheckResponse* response) {
  absl::MutexLock lock(&mu_);
  const Status status = Lookup(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown");
  }
  response->set_status(status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* context,
    const grpc::health::v1::HealthCheckRequest* request,
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
      status = Lookup(request->service());
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
