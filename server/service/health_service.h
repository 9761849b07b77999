// grpc.health.v1.Health as a synchronous service. (gRPC's default health
// service is callback-based; mixed with the synchronous hostkv service it
// adds polling threads and context switches to every call.) Behind the
// daemon's token like every other service, and with a bound on the Watch
// streams, each of which holds a server thread.
#ifndef HOSTKV_SERVER_SERVICE_HEALTH_SERVICE_H_
#define HOSTKV_SERVER_SERVICE_HEALTH_SERVICE_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/service/auth_token.h"
#include "server/operations/logging.h"

namespace hostkv {

struct HealthOptions {
  std::string auth_token;  // empty: no token required
  // With a token: Check of "" (the whole server) answers without it, for
  // kubelet/docker probes; every other name still needs it.
  bool probe_without_token = false;
  int max_watches = 64;  // concurrent Watch streams
};

// Thread-safe.
class HealthService final : public grpc::health::v1::Health::Service {
 public:
  explicit HealthService(const HealthOptions& options);

  // Publishes `service` ("" is the whole server) as SERVING or NOT_SERVING.
  void SetServing(const std::string& service, bool serving)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every service NOT_SERVING from now on; later SetServing calls are
  // ignored.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // UNAUTHENTICATED without the token (see HealthOptions); NOT_FOUND for a
  // service never published.
  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  // Streams the status (SERVICE_UNKNOWN if never published) and every change
  // until the client cancels or the server shuts down. UNAUTHENTICATED
  // without the token; RESOURCE_EXHAUSTED while max_watches streams run.
  grpc::Status Watch(
      grpc::ServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request,
      grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status Lookup(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a Watch slot; false if all max_watches are taken.
  bool BeginWatch() ABSL_LOCKS_EXCLUDED(mu_);
  void EndWatch() ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status StreamChanges(
      grpc::ServerContext* context, const std::string& service,
      grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Const after construction.
  const TokenAuthorizer authorizer_;
  const bool probe_without_token_;
  const int max_watches_;
  WarningThrottle watch_warnings_{absl::Seconds(10)};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped on every change
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;  // Watch streams running
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_HEALTH_SERVICE_H_
