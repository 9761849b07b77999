// Executes the hostkv.v1 requests against the daemon's state: validates
// every field, then acts. No gRPC here (see grpc_service.h), so tests and
// fuzzers drive it directly.
#ifndef HOSTKV_SERVER_SERVICE_REQUEST_HANDLER_H_
#define HOSTKV_SERVER_SERVICE_REQUEST_HANDLER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/copy_plan.h"
#include "server/operations/daemon_metrics.h"
#include "server/transfer/gpu_backend.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_registry.h"
#include "server/service/request_validation.h"
#include "server/sessions/session_registry.h"
#include "server/tier/cache_tier.h"
#include "server/transfer/transfer_engine.h"

namespace hostkv {

class DigestWorker;  // server/cache/digest_worker.h

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
  // Per session: device-buffer imports (and passed descriptors), and the
  // device bytes they cover (the daemon maps them: address space).
  uint32_t max_imports_per_session = 64;
  uint64_t max_import_bytes_per_session = 1ull << 40;
  // Imports of all attached sessions of one uid together.
  uint32_t max_imports_per_uid = 1024;
  // Descriptors passed over session sockets that the daemon holds, all
  // sessions together (main.cc: a quarter of the descriptor limit, so that
  // gRPC never runs out).
  uint32_t max_passed_fds = 4096;
  // ... and the sessions of one uid together (--max_passed_fds_per_uid).
  uint32_t max_passed_fds_per_uid = 1024;
  // Who may use the pools sessions create (PoolOwner.access).
  v1::PoolAccess pool_access = v1::POOL_ACCESS_OWNER;
  // How long an Alloc waits for a filling pool's pages when the request
  // does not say (--pool_fill_wait).
  absl::Duration fill_wait = absl::Seconds(60);
  // Shared-memory names may also belong to another uid if the segment is
  // group read-write in this group and the session's peer is a member;
  // unset: only the peer's own segments.
  std::optional<uint32_t> shm_group;
  // The page cache: how long a Publish waits for copies in flight on its
  // pages (a backup filling them); references one session may hold on
  // cached pages (each pins a page against eviction); bytes one CopyPages
  // call may copy (it runs on the request's thread).
  absl::Duration cache_publish_wait = absl::Seconds(30);
  uint64_t max_cache_refs_per_session = uint64_t{1} << 22;
  // ... and all sessions of one uid (the unverified ones count as one), in
  // all pools.
  uint64_t max_cache_refs_per_uid = uint64_t{1} << 24;
  uint64_t max_copy_bytes = uint64_t{1} << 30;
};

// A session opened or attached over the session socket, with the read-only
// descriptor of its signal segment for the client.
struct AttachedSession {
  std::shared_ptr<Session> session;
  ScopedFd signal_fd;
};

// A descriptor of a pool's segment for an engine's zero-copy view.
struct PoolSegmentFd {
  ScopedFd fd;
  bool writable = false;
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

  // The page cache (cache_requests.cc).
  absl::StatusOr<v1::PublishResponse> Publish(const v1::PublishRequest& request);
  // Publish waiting at most `copy_wait` (not --cache_publish_wait) for
  // copies in flight on its pages: DEADLINE_EXCEEDED after it, changing
  // nothing. The command ring passes zero, so that its thread never waits.
  absl::StatusOr<v1::PublishResponse> PublishWithin(
      const v1::PublishRequest& request, absl::Duration copy_wait);
  // With a storage tier, a miss asks the tier for the keys that follow and
  // waits for them until `deadline` (the caller's, less a margin) or the
  // tier's fetch_wait, whichever is first.
  absl::StatusOr<v1::LookupResponse> Lookup(
      const v1::LookupRequest& request,
      absl::Time deadline = absl::InfiniteFuture());
  absl::StatusOr<v1::ReleaseResponse> Release(const v1::ReleaseRequest& request);
  // The keys of a namespace the cache evicted (PageCache::ListEvictions),
  // with Lookup's access check.
  absl::StatusOr<v1::ListEvictionsResponse> ListEvictions(
      const v1::ListEvictionsRequest& request);
  // Why lookups of a namespace miss (PageCache::ExplainKeys, RecentMisses).
  absl::StatusOr<v1::ExplainMissesResponse> ExplainMisses(
      const v1::ExplainMissesRequest& request);
  absl::StatusOr<v1::CopyPagesResponse> CopyPages(
      const v1::CopyPagesRequest& request);

  absl::StatusOr<v1::GetPoolStatsResponse> GetPoolStats(
      const v1::GetPoolStatsRequest& request);

  // The pools (the command ring sizes Alloc's answers with them) and the
  // metrics (null: none).
  const PoolRegistry& pools() const { return *pools_; }
  // Whether a storage tier is set (a Lookup's miss may then wait for it).
  bool has_tier() const { return tier_ != nullptr; }
  DaemonMetrics* metrics() const { return metrics_; }
  // The memory budget (command rings charge their segments to it).
  MemoryBudget* budget() const { return budget_; }

  // The storage tier under every pool's page cache (null: none). Set once,
  // before requests are served; it must outlive the requests.
  void set_tier(CacheTier* tier) { tier_ = tier; }
  // Where published pages get their digests (null: --page_digests=false),
  // and the share of hits Lookup checks against them (0..1). Set once,
  // before requests are served; the worker must outlive the requests.
  void set_digests(DigestWorker* worker, double verify_hits) {
    digests_ = worker;
    verify_hits_ = verify_hits;
  }
  // What this daemon adopted at start (GetPoolStats' restart). Set once,
  // before requests are served.
  void set_restart_stats(v1::RestartStats stats) { restart_ = std::move(stats); }

  // Between HoldRequests() and Open(), every request waits (up to a minute,
  // then Unavailable): a daemon taking over from another (--takeover)
  // listens first and serves once it has adopted the state. Requests are
  // not held otherwise.
  void HoldRequests() { held_.store(true); }
  void Open() { open_.Notify(); }
  absl::Status AwaitOpen() const;

  // From now on, requests that would change state fail with Unavailable.
  // Refuses new work, and lets every backup waiting for an engine's "KV
  // written" proceed so that draining the copies cannot hang.
  void BeginShutdown();

  // The session socket (SessionMonitor):
  // Opens a session bound to `peer` from the start. Errors of
  // SessionRegistry::Open.
  absl::StatusOr<AttachedSession> OpenAttachedSession(
      const std::string& client_name, const PeerCredentials& peer);
  // Binds session `id` to the peer of its session socket. NotFound for an
  // unknown session; FailedPrecondition if already attached;
  // ResourceExhausted at the peer uid's session limit.
  absl::StatusOr<AttachedSession> AttachSession(const SessionId& id,
                                                const PeerCredentials& peer);
  // Resumes, for `peer`, the session with secret `id` that a previous
  // daemon left (SessionRegistry::Resume).
  absl::StatusOr<AttachedSession> ResumeSession(const SessionId& id,
                                                const PeerCredentials& peer);
  // Keeps a memfd the peer passed; returns its handle. InvalidArgument if it
  // is not a read-write memfd sealed against shrinking; PermissionDenied if
  // `sender` is not the session's peer; ResourceExhausted at the limit.
  // `wanted`: 0, or the handle to give it (a client passing its buffers
  // again after a restart).
  absl::StatusOr<uint64_t> AcceptPassedFd(const SessionId& id,
                                          const PeerCredentials& sender,
                                          ScopedFd fd, uint64_t wanted = 0);
  // The memfd of CUDA import `import_id`'s "KV written" page (a duplicate
  // the caller passes to the engine). NotFound if the session has no such
  // import; FailedPrecondition if it is not a CUDA import with gpu_signals;
  // PermissionDenied if `sender` is not the session's peer.
  absl::StatusOr<ScopedFd> FetchKvWord(const SessionId& id,
                                       const PeerCredentials& sender,
                                       uint64_t import_id);
  // A descriptor of pool `pool`'s segment for the session's peer: read-write
  // if the peer may administer the pool (CheckPoolAdmin), read-only if it
  // may only use it. NotFound, PermissionDenied (not admitted, or `sender`
  // is not the session's peer).
  absl::StatusOr<PoolSegmentFd> FetchPoolSegment(const SessionId& id,
                                                 const PeerCredentials& sender,
                                                 const std::string& pool);
  // Ends session `id` as CloseSession does; `reason` ("disconnected", ...)
  // goes to the log and the metrics. NotFound if it already ended.
  absl::Status EndSession(const SessionId& id, const char* reason);
  // Ends every unattached session idle for longer than `lease`.
  void ExpireIdleSessions(absl::Duration lease);

 private:
  // Session `id`, if `sender` is its attached peer (session-socket
  // records); else PermissionDenied saying `refusal`. Errors of CheckServing
  // and of the registry (NotFound).
  absl::StatusOr<std::shared_ptr<Session>> SessionOfSender(
      const SessionId& id, const PeerCredentials& sender,
      const char* refusal) const;
  // Deletes the pools created with delete_with_session by `session` (which
  // has freed its pages); one still used by others stays, with a warning.
  void DeletePoolsOf(const Session& session);
  // Cancels the session's pending copies, waits for the running one, closes
  // its imports, frees its pages, drops its cache references. The session
  // is out of the registry.
  v1::CloseSessionResponse ReleaseSession(Session& session, const char* reason);
  // The session of a cache request and its pool, which it may use.
  struct CacheTarget {
    std::shared_ptr<Session> session;
    std::shared_ptr<HostPool> pool;
  };
  absl::StatusOr<CacheTarget> ResolveCacheTarget(const SessionId& session_id,
                                                 const std::string& pool_name);
  // ResourceExhausted if `more` references would take the session past
  // max_cache_refs_per_session, or its uid's sessions (all pools) past
  // max_cache_refs_per_uid.
  absl::Status CheckReferenceLimit(const CacheTarget& target,
                                   uint64_t more) const;
  // Publish's items that are not cached yet (`items`, from `request`):
  // waits for copies filling their pages, caches them, gives back the pages
  // the cache did not take. One result per item.
  absl::StatusOr<std::vector<PublishResult>> PublishFresh(
      const CacheTarget& target, const v1::PublishRequest& request,
      const std::vector<PublishItem>& items, absl::Duration copy_wait);
  // A request that took references or pages for a session that ended
  // meanwhile (its release may have run already): drop them again.
  void UndoForEndedSession(const CacheTarget& target) const;
  // Lookup's miss with a tier: fetches the keys after found.hits (up to
  // fetch_pages), waits up to the deadline, and looks up what follows the
  // hits again (acquiring as the request says), adding to `found`. Counts
  // no miss (Lookup counts them once its hits are checked).
  absl::Status LookupInTier(const CacheTarget& target,
                            const v1::LookupRequest& request,
                            absl::Span<const absl::string_view> keys,
                            absl::Time deadline, LookupResult& found);
  // Lookup's check of a sampled share (--verify_hits) of its hits against
  // their digests, before any is loaded: from the first page that does not
  // match, the hits are not served (PageCache::RejectHits; the engine
  // recomputes) and the page leaves the cache. A log line, rate-limited.
  void VerifyHits(const CacheTarget& target, const v1::LookupRequest& request,
                  absl::Span<const absl::string_view> keys, LookupResult& found);
  absl::Status CheckServing() const;
  // Waits until `import` (already out of its session) is used by no
  // operation, then closes it. DeadlineExceeded if copies run on too long.
  absl::Status AwaitLastUse(std::shared_ptr<DeviceImport>& import);
  absl::StatusOr<v1::TransferResponse> Transfer(
      const v1::TransferRequest& request, CopyDirection direction);
  // The CUDA side of a transfer: the pool is pinned, the mechanism can reach
  // it, wait_kv_written, signal_value and gpu_waits_only are only used where
  // they mean something (an import with GPU signals; loads and backups), the
  // values at most 2^63 - 1. Whether signal_value is above the import's last value is
  // checked by TransferEngine::Submit.
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
      const SessionId& session_id, const std::string& pool_name,
      const google::protobuf::RepeatedPtrField<v1::PageRun>& pages);
  absl::StatusOr<uint64_t> CheckPageIoSize(const HostPool& pool,
                                           uint64_t pages) const;
  // Opens the CPU import of `spec` for `session` (names or passed fds).
  absl::StatusOr<std::unique_ptr<DeviceImport>> OpenShmImport(
      const Session& session, std::shared_ptr<HostPool> pool,
      const RegistrationSpec& spec) const;
  // The session of `id` with its signal descriptor.
  absl::StatusOr<AttachedSession> HandOutSignals(
      std::shared_ptr<Session> session);

  const RequestLimits limits_;
  MemoryBudget* const budget_;
  PoolRegistry* const pools_;
  SessionRegistry* const sessions_;
  TransferEngine* const transfers_;
  DaemonMetrics* const metrics_;
  GpuBackend* const gpu_;
  CacheTier* tier_ = nullptr;
  DigestWorker* digests_ = nullptr;
  double verify_hits_ = 0;
  v1::RestartStats restart_;
  std::atomic<uint64_t> sessions_resumed_{0};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> held_{false};
  absl::Notification open_;
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_SERVICE_REQUEST_HANDLER_H_
