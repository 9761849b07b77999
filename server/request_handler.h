// Executes the hostkv.v1 requests against the daemon's state: validates
// every field, then acts. No gRPC here (see grpc_service.h), so tests and
// fuzzers drive it directly.
#ifndef HOSTKV_SERVER_REQUEST_HANDLER_H_
#define HOSTKV_SERVER_REQUEST_HANDLER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/copy_plan.h"
#include "server/daemon_metrics.h"
#include "server/gpu_backend.h"
#include "server/memory_budget.h"
#include "server/pool_registry.h"
#include "server/session_registry.h"
#include "server/transfer_engine.h"

namespace hostkv {

struct RequestLimits {
  // Most bytes one ReadPages/WritePages call may move.
  uint64_t max_page_io_bytes = 64ull << 20;
  // Shared-memory names with this prefix belong to the daemon and cannot be
  // registered as device buffers.
  std::string reserved_segment_prefix = "/hostkv.";
  // Without an attached session socket the daemon cannot tell who the
  // client is; registering shm buffers by name is then refused unless this
  // is set (trusted single-user setups and TCP clients).
  bool allow_unverified_shm_names = false;
  // An unattached session ends after this long without a request.
  absl::Duration session_lease = absl::Seconds(30);
};

// Thread-safe. Borrows its collaborators, which must outlive it.
class RequestHandler {
 public:
  // `metrics` and `gpu` may be null (without `gpu`, CUDA registrations are
  // refused).
  RequestHandler(RequestLimits limits, MemoryBudget* budget,
                 PoolRegistry* pools, SessionRegistry* sessions,
                 TransferEngine* transfers, DaemonMetrics* metrics = nullptr,
                 GpuBackend* gpu = nullptr);

  absl::StatusOr<v1::OpenSessionResponse> OpenSession(
      const v1::OpenSessionRequest& request);
  // Abandons the session's copies not yet started, waits for the running
  // one, closes its imports and frees its pages.
  absl::StatusOr<v1::RenewSessionResponse> RenewSession(
      const v1::RenewSessionRequest& request);
  absl::StatusOr<v1::CloseSessionResponse> CloseSession(
      const v1::CloseSessionRequest& request);

  absl::StatusOr<v1::Pool> CreatePool(const v1::CreatePoolRequest& request);
  absl::StatusOr<v1::Pool> GetPool(const v1::GetPoolRequest& request);
  absl::StatusOr<v1::ListPoolsResponse> ListPools(
      const v1::ListPoolsRequest& request);
  absl::StatusOr<v1::DeletePoolResponse> DeletePool(
      const v1::DeletePoolRequest& request);

  absl::StatusOr<v1::RegisterDeviceBuffersResponse> RegisterDeviceBuffers(
      const v1::RegisterDeviceBuffersRequest& request);
  absl::StatusOr<v1::UnregisterDeviceBuffersResponse> UnregisterDeviceBuffers(
      const v1::UnregisterDeviceBuffersRequest& request);

  absl::StatusOr<v1::AllocResponse> Alloc(const v1::AllocRequest& request);
  absl::StatusOr<v1::FreeResponse> Free(const v1::FreeRequest& request);
  absl::StatusOr<v1::HandOverPagesResponse> HandOverPages(
      const v1::HandOverPagesRequest& request);

  absl::StatusOr<v1::TransferResponse> Load(const v1::TransferRequest& request);
  absl::StatusOr<v1::TransferResponse> Backup(
      const v1::TransferRequest& request);

  absl::StatusOr<v1::ReadPagesResponse> ReadPages(
      const v1::ReadPagesRequest& request);
  absl::StatusOr<v1::WritePagesResponse> WritePages(
      const v1::WritePagesRequest& request);
  absl::StatusOr<v1::GetPageBufferMetaResponse> GetPageBufferMeta(
      const v1::GetPageBufferMetaRequest& request);

  absl::StatusOr<v1::GetPoolStatsResponse> GetPoolStats(
      const v1::GetPoolStatsRequest& request);

  // From now on, requests that would change state fail with Unavailable.
  // Refuses new work, and lets every backup waiting for an engine's "KV
  // written" proceed so that draining the copies cannot hang.
  void BeginShutdown();

  // Session liveness (SessionMonitor):
  // Binds session `id` to the peer of its session socket. NotFound for an
  // unknown session; FailedPrecondition if already attached.
  absl::Status AttachSession(uint64_t id, const PeerCredentials& peer);
  // Ends session `id` as CloseSession does; `reason` ("disconnected", ...)
  // goes to the log and the metrics. NotFound if it already ended.
  absl::Status EndSession(uint64_t id, const char* reason);
  // Ends every unattached session idle for longer than `lease`.
  void ExpireIdleSessions(absl::Duration lease);

 private:
  // Cancels the session's pending copies, waits for the running one, closes
  // its imports, frees its pages. The session is out of the registry.
  v1::CloseSessionResponse Release(Session& session, const char* reason);
  absl::Status CheckServing() const;
  // Waits until `import` (already out of its session) is used by no
  // operation, then closes it. DeadlineExceeded if copies run on too long.
  absl::Status AwaitLastUse(std::shared_ptr<DeviceImport>& import);
  absl::StatusOr<v1::TransferResponse> Transfer(
      const v1::TransferRequest& request, CopyDirection direction);
  // The CUDA side of a transfer: the pool is pinned, the mechanism can reach
  // it, wait_kv_written is only used where it means something.
  absl::Status CheckGpuTransfer(const v1::TransferRequest& request,
                                const HostPool& pool, const DeviceImport& import,
                                CopyDirection direction,
                                CopyMechanism mechanism) const;
  // The session, the pool, and the pages it owns in `runs`, with no copy in
  // flight.
  struct OwnedPages {
    std::shared_ptr<Session> session;
    std::shared_ptr<HostPool> pool;
    std::vector<PageRun> runs;
  };
  absl::StatusOr<OwnedPages> ResolveOwnedPages(
      uint64_t session_id, const std::string& pool_name,
      const google::protobuf::RepeatedPtrField<v1::PageRun>& pages);
  absl::StatusOr<uint64_t> CheckPageIoSize(const HostPool& pool,
                                           uint64_t pages) const;

  const RequestLimits limits_;
  MemoryBudget* const budget_;
  PoolRegistry* const pools_;
  SessionRegistry* const sessions_;
  TransferEngine* const transfers_;
  DaemonMetrics* const metrics_;
  GpuBackend* const gpu_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_REQUEST_HANDLER_H_
