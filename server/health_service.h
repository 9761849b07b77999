// grpc.health.v1.Health as a synchronous service. (gRPC's default health
// service is callback-based; mixed with the synchronous hostkv service it
// adds polling threads and context switches to every call.)
#ifndef HOSTKV_SERVER_HEALTH_SERVICE_H_
#define HOSTKV_SERVER_HEALTH_SERVICE_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace hostkv {

// Thread-safe.
class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // Publishes `service` ("" is the whole server) as SERVING or NOT_SERVING.
  void SetServing(const std::string& service, bool serving)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every service NOT_SERVING from now on; later SetServing calls are
  // ignored.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // NOT_FOUND for a service never published.
  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  // Streams the status (SERVICE_UNKNOWN if never published) and every change
  // until the client cancels or the server shuts down.
  grpc::Status Watch(
      grpc::ServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request,
      grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status Lookup(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped on every change
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_HEALTH_SERVICE_H_
