// Sessions, pools, device-buffer registrations and stats. The data-path
// requests (slots, transfers, pages) are in data_requests.cc.
#include "server/service/request_handler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/contract/status_macros.h"
#include "server/operations/descriptor_shares.h"
#include "server/pool/pool_access.h"
#include "server/service/request_validation.h"
#include "server/operations/stats_report.h"
#include "server/operations/tier_report.h"
#include "spdlog/spdlog.h"

namespace hostkv {

RequestHandler::RequestHandler(RequestLimits limits, MemoryBudget* budget,
                               PoolRegistry* pools, SessionRegistry* sessions,
                               TransferEngine* transfers, DaemonMetrics* metrics,
                               GpuBackend* gpu)
    : limits_(std::move(limits)),
      budget_(budget),
      pools_(pools),
      sessions_(sessions),
      transfers_(transfers),
      metrics_(metrics),
      gpu_(gpu) {}

void RequestHandler::BeginShutdown() {
  shutting_down_.store(true);
  for (const std::shared_ptr<Session>& session : sessions_->List()) {
    for (const std::shared_ptr<DeviceImport>& import : session->Imports()) {
      if (import->gpu() != nullptr) import->gpu()->ReleaseWaits();
    }
  }
}

absl::Status RequestHandler::AwaitOpen() const {
  if (!held_.load() || open_.HasBeenNotified() ||
      open_.WaitForNotificationWithTimeout(absl::Minutes(1))) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      "hostkvd is still taking over from the daemon before it");
}

absl::Status RequestHandler::CheckServing() const {
  if (shutting_down_.load()) {
    return absl::UnavailableError("hostkvd is shutting down");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::OpenSessionResponse> RequestHandler::OpenSession(
    const v1::OpenSessionRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Open(request.client_name(), request.pid()));
  spdlog::info("session {} opened: client='{}' pid={} (no session socket yet)",
               session->tag(), session->client_name(), session->pid());
  v1::OpenSessionResponse response;
  response.set_session_id(session->id());
  response.set_session_number(session->tag());
  response.set_lease_seconds(static_cast<uint32_t>(
      absl::ToInt64Seconds(limits_.session_lease)));
  response.set_signal_segment(session->signals()->name());
  response.set_signal_segment_id(session->signals()->id());
  response.set_signal_slots(session->signals()->records());
  return response;
}

absl::StatusOr<AttachedSession> RequestHandler::HandOutSignals(
    std::shared_ptr<Session> session) {
  AttachedSession attached;
  ASSIGN_OR_RETURN(attached.signal_fd, session->signals()->TakeReadOnlyFd());
  attached.session = std::move(session);
  return attached;
}

absl::StatusOr<AttachedSession> RequestHandler::OpenAttachedSession(
    const std::string& client_name, const PeerCredentials& peer) {
  RETURN_IF_ERROR(AwaitOpen());
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Open(client_name, peer.pid, peer));
  spdlog::info("session {} opened on the session socket: client='{}' pid={} "
               "uid={} gid={}",
               session->tag(), session->client_name(), peer.pid, peer.uid,
               peer.gid);
  absl::StatusOr<AttachedSession> attached = HandOutSignals(session);
  if (!attached.ok()) EndSession(session->id(), "closed").IgnoreError();
  return attached;
}

absl::StatusOr<v1::RenewSessionResponse> RequestHandler::RenewSession(
    const v1::RenewSessionRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));  // touches it
  v1::RenewSessionResponse response;
  response.set_lease_seconds(static_cast<uint32_t>(
      absl::ToInt64Seconds(limits_.session_lease)));
  return response;
}

absl::StatusOr<v1::CloseSessionResponse> RequestHandler::CloseSession(
    const v1::CloseSessionRequest& request) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      sessions_->Remove(request.session_id());
  if (!session.ok()) {
    // One the previous daemon left, closed before its resume: whoever
    // knows its secret may.
    std::optional<OwnerTag> adopted = sessions_->DropAdopted(request.session_id());
    if (!adopted.has_value()) return session.status();
    v1::CloseSessionResponse response;
    uint64_t pages = 0;
    for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
      pages += pool->allocator().FreeAllOwnedBy(*adopted);
    }
    response.set_pages_freed(pages);
    spdlog::info("session {} (adopted, not resumed) closed: freed {} pages",
                 *adopted, pages);
    return response;
  }
  return ReleaseSession(**session, "closed");
}

absl::Status RequestHandler::EndSession(const SessionId& id,
                                        const char* reason) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_->Remove(id));
  ReleaseSession(*session, reason);
  return absl::OkStatus();
}

void RequestHandler::ExpireIdleSessions(absl::Duration lease) {
  for (OwnerTag tag : sessions_->ExpireAdopted(absl::Now() - lease)) {
    uint64_t pages = 0;
    for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
      pages += pool->allocator().FreeAllOwnedBy(tag);
    }
    spdlog::info("session {} (adopted from the previous hostkvd) was not "
                 "resumed within --session_lease: freed its {} pages",
                 tag, pages);
    if (metrics_ != nullptr) metrics_->RecordSessionEnd("not_resumed");
  }
  for (const std::shared_ptr<Session>& session :
       sessions_->IdleSince(absl::Now() - lease)) {
    // A request may have touched it since; Remove only what is still idle.
    if (session->last_active() >= absl::Now() - lease) continue;
    if (sessions_->Remove(session->id()).ok()) {
      ReleaseSession(*session, "lease_expired");
    }
  }
}

absl::StatusOr<AttachedSession> RequestHandler::ResumeSession(
    const SessionId& id, const PeerCredentials& peer) {
  RETURN_IF_ERROR(AwaitOpen());
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Resume(id, peer));
  uint64_t pages = 0;
  for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
    pages += pool->allocator().pages_owned_by(session->tag());
  }
  spdlog::info("session {} resumed after the restart: client='{}' pid={} "
               "uid={}, {} pages kept",
               session->tag(), session->client_name(), peer.pid, peer.uid,
               pages);
  if (metrics_ != nullptr) metrics_->RecordSessionResumed();
  sessions_resumed_.fetch_add(1);
  absl::StatusOr<AttachedSession> attached = HandOutSignals(session);
  if (!attached.ok()) EndSession(session->id(), "closed").IgnoreError();
  return attached;
}

absl::StatusOr<AttachedSession> RequestHandler::AttachSession(
    const SessionId& id, const PeerCredentials& peer) {
  RETURN_IF_ERROR(AwaitOpen());
  RETURN_IF_ERROR(sessions_->Attach(id, peer));
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_->Get(id));
  spdlog::info("session {} attached: pid={} uid={} gid={}", session->tag(),
               peer.pid, peer.uid, peer.gid);
  return HandOutSignals(std::move(session));
}

absl::StatusOr<std::shared_ptr<Session>> RequestHandler::SessionOfSender(
    const SessionId& id, const PeerCredentials& sender, const char* refusal) const {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_->Get(id));
  const std::optional<PeerCredentials> peer = session->peer();
  if (!peer.has_value() || peer->uid != sender.uid) {
    return absl::PermissionDeniedError(refusal);
  }
  return session;
}

absl::StatusOr<uint64_t> RequestHandler::AcceptPassedFd(
    const SessionId& id, const PeerCredentials& sender, ScopedFd fd,
    uint64_t wanted) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOfSender(id, sender, "descriptors are taken only from the session's own peer"));
  RETURN_IF_ERROR(CheckSealedMemfd(fd.get()));
  uint64_t held = 0, of_uid = 0;
  for (const std::shared_ptr<Session>& s : sessions_->List()) {
    const uint32_t passed = s->passed_fds();
    held += passed;
    const std::optional<PeerCredentials> peer = s->peer();
    if (peer.has_value() && peer->uid == sender.uid) of_uid += passed;
  }
  // Per uid first: one user holding every slot must not be the reason
  // another user's pass is refused.
  if (of_uid >= limits_.max_passed_fds_per_uid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", sender.uid, " holds ", of_uid,
                     " passed descriptors in its "
                     "sessions, the most --max_passed_fds_per_uid allows"));
  }
  if (held >= limits_.max_passed_fds) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon holds ", held, " passed descriptors, the most its "
        "descriptor limit leaves room for; raise `ulimit -n` for hostkvd"));
  }
  if (!MayTakeShared(of_uid, held, limits_.max_passed_fds)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon holds ", held, " passed descriptors; the last of the ",
        limits_.max_passed_fds, " it takes are kept for users holding few, "
        "and uid ", sender.uid, " holds ", of_uid));
  }
  ASSIGN_OR_RETURN(const uint64_t handle,
                   session->AddPassedFd(std::move(fd),
                                        limits_.max_imports_per_session,
                                        wanted));
  spdlog::debug("session {}: descriptor {} passed", session->tag(), handle);
  return handle;
}

absl::StatusOr<ScopedFd> RequestHandler::FetchKvWord(
    const SessionId& id, const PeerCredentials& sender, uint64_t import_id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOfSender(id, sender, "the KV-written page goes only to the session's own peer"));
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceImport> import,
                   session->GetImport(import_id));
  if (import->gpu() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "import ", import_id, " is a shared-memory import: it has no "
        "KV-written word (only CUDA imports with gpu_signals do)"));
  }
  return import->gpu()->FetchKvWord();
}

absl::StatusOr<PoolSegmentFd> RequestHandler::FetchPoolSegment(
    const SessionId& id, const PeerCredentials& sender, const std::string& pool_name) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOfSender(id, sender, "a pool segment goes only to the session's own peer"));
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(pool_name));
  const Principal who = Principal::Of(*session);
  RETURN_IF_ERROR(CheckPoolUse(pool_name, pool->owner(), who));
  const bool writable = CheckPoolAdmin(pool_name, pool->owner(), who).ok();
  ASSIGN_OR_RETURN(ScopedFd fd, pool->OpenSegment(writable));
  spdlog::debug("session {}: {} descriptor of pool '{}' segment", session->tag(),
                writable ? "read-write" : "read-only", pool_name);
  return PoolSegmentFd{std::move(fd), writable};
}

void RequestHandler::DeletePoolsOf(const Session& session) {
  for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
    if (pool->owner().delete_with_session() != session.tag()) continue;
    const absl::Status deleted =
        pools_->Delete(pool->name(), Principal::Of(session));
    if (deleted.ok()) {
      spdlog::info("pool '{}' deleted with its session {}", pool->name(),
                   session.tag());
    } else {
      spdlog::warn("pool '{}' outlives its session {}: {}", pool->name(),
                   session.tag(), std::string(deleted.message()));
    }
  }
}

v1::CloseSessionResponse RequestHandler::ReleaseSession(Session& session,
                                                        const char* reason) {
  session.MarkEnding();
  sessions_->RecordEnd(session.id(), reason);
  if (metrics_ != nullptr) metrics_->RecordSessionEnd(reason);
  session.signals()->Cancel();
  // Its queued CPU operations end now rather than when their turn comes.
  transfers_->Abandon(session.tag());
  std::vector<std::shared_ptr<DeviceImport>> imports = session.TakeImports();
  // GPU operations cannot be stopped, only let through: none may keep
  // waiting for a "KV written" signal from an engine that is gone.
  for (const std::shared_ptr<DeviceImport>& import : imports) {
    if (import->gpu() != nullptr) import->gpu()->ReleaseWaits();
  }
  session.signals()->AwaitIdle();
  v1::CloseSessionResponse response;
  response.set_imports_closed(static_cast<uint32_t>(imports.size()));
  imports.clear();
  uint64_t pages = 0;
  uint64_t references = 0;
  for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
    pages += pool->allocator().FreeAllOwnedBy(session.tag());
    references += pool->cache().ReleaseAll(session.tag());
  }
  response.set_pages_freed(pages);
  if (references != 0) {
    spdlog::info("session {}: dropped its {} references on cached pages",
                 session.tag(), references);
  }
  DeletePoolsOf(session);
  spdlog::info("session {} ended ({}): client='{}' freed {} pages, closed {} "
               "imports, open for {}",
               session.tag(), reason, session.client_name(), pages,
               response.imports_closed(),
               absl::FormatDuration(absl::Now() - session.opened()));
  return response;
}

absl::StatusOr<v1::Pool> RequestHandler::CreatePool(
    const v1::CreatePoolRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));
  const Principal who = Principal::Of(*session);
  v1::PoolOwner owner = OwnerFor(who, limits_.pool_access);
  if (request.delete_with_session()) owner.set_delete_with_session(session->tag());
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool,
                   pools_->Create(request.spec(), request.attach_if_exists(),
                                  owner, who));
  return pool->Describe();
}

absl::StatusOr<v1::Pool> RequestHandler::GetPool(
    const v1::GetPoolRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
  return pool->Describe();
}

absl::StatusOr<v1::ListPoolsResponse> RequestHandler::ListPools(
    const v1::ListPoolsRequest&) {
  v1::ListPoolsResponse response;
  for (const auto& pool : pools_->List()) *response.add_pools() = pool->Describe();
  return response;
}

absl::StatusOr<v1::DeletePoolResponse> RequestHandler::DeletePool(
    const v1::DeletePoolRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));
  RETURN_IF_ERROR(pools_->Delete(request.pool(), Principal::Of(*session)));
  spdlog::info("pool '{}' deleted by session {}", request.pool(), session->tag());
  return v1::DeletePoolResponse();
}

absl::StatusOr<std::unique_ptr<DeviceImport>> RequestHandler::OpenShmImport(
    const Session& session, std::shared_ptr<HostPool> pool,
    const RegistrationSpec& spec) const {
  const std::optional<PeerCredentials> peer = session.peer();
  ShmAccessPolicy policy;
  policy.reserved_prefix = limits_.reserved_segment_prefix;
  if (peer.has_value()) {
    policy.peer_uid = peer->uid;
    if (limits_.shm_group.has_value() && peer->InGroup(*limits_.shm_group)) {
      policy.shared_group = limits_.shm_group;
    }
  } else if (!limits_.allow_unverified_shm_names) {
    return absl::FailedPreconditionError(
        "registering shared-memory buffers needs an attached session socket "
        "(the client library attaches on unix: targets), or a daemon "
        "started with --allow_unverified_shm_names");
  }
  policy.passed_fd = [&session](uint64_t handle) {
    return session.DupPassedFd(handle);
  };
  return DeviceImport::OpenShm(std::move(pool), spec.shm, policy);
}

absl::StatusOr<v1::RegisterDeviceBuffersResponse>
RequestHandler::RegisterDeviceBuffers(
    const v1::RegisterDeviceBuffersRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
  RETURN_IF_ERROR(CheckPoolUse(pool->name(), pool->owner(), Principal::Of(*session)));
  ASSIGN_OR_RETURN(RegistrationSpec spec, ToRegistrationSpec(request));
  if (const std::optional<PeerCredentials> peer = session->peer();
      peer.has_value() &&
      sessions_->ImportsOfUid(peer->uid) >= limits_.max_imports_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", peer->uid, " holds ", limits_.max_imports_per_uid,
        " device-buffer imports, the most --max_imports_per_uid allows"));
  }
  std::unique_ptr<DeviceImport> import;
  if (spec.cuda) {
    if (gpu_ == nullptr) {
      return absl::FailedPreconditionError(
          "this daemon has no CUDA backend (no GPU, or built without CUDA; "
          "see its start-up log): register shared-memory buffers (shm_name)");
    }
    ASSIGN_OR_RETURN(import, gpu_->OpenImport(pool, spec.gpu));
  } else {
    ASSIGN_OR_RETURN(import, OpenShmImport(*session, pool, spec));
  }
  const bool on_gpu = import->gpu() != nullptr;
  const int device = on_gpu ? import->gpu()->device() : -1;
  const bool gpu_signals = on_gpu && import->gpu()->has_signals();
  // token_slots * token_stride <= 2^50 per buffer (CheckImportShape); the
  // product with the buffer count saturates rather than wrap.
  const PoolGeometry& g = pool->geometry();
  const uint64_t per_buffer = request.token_slots() * g.token_stride();
  const uint64_t buffers = uint64_t{g.num_layers} * g.kv_planes();
  const uint64_t bytes = per_buffer > UINT64_MAX / buffers ? UINT64_MAX
                                                           : per_buffer * buffers;
  ASSIGN_OR_RETURN(const uint64_t id,
                   session->AddImport(std::move(import), bytes,
                                      limits_.max_imports_per_session,
                                      limits_.max_import_bytes_per_session,
                                      request.import_id()));
  spdlog::info("session {}: import {} opened for pool '{}' ({} layers, "
               "{} token slots, {})",
               session->tag(), id, pool->name(), pool->geometry().num_layers,
               request.token_slots(),
               on_gpu ? absl::StrCat("CUDA device ", device,
                                     gpu_signals ? ", GPU signals" : "")
                      : std::string("shared memory"));
  v1::RegisterDeviceBuffersResponse response;
  response.set_import_id(id);
  return response;
}

absl::Status RequestHandler::AwaitLastUse(std::shared_ptr<DeviceImport>& import) {
  // Nobody can take a new reference once the session dropped its own, so
  // the count only falls; the last one closes the import on this thread.
  constexpr absl::Duration kPoll = absl::Milliseconds(1);
  constexpr absl::Duration kPatience = absl::Seconds(60);
  const absl::Time deadline = absl::Now() + kPatience;
  while (import.use_count() > 1) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "copies through this import still run after ",
          absl::FormatDuration(kPatience), "; it closes when they finish"));
    }
    absl::SleepFor(kPoll);
  }
  import.reset();
  return absl::OkStatus();
}

absl::StatusOr<v1::UnregisterDeviceBuffersResponse>
RequestHandler::UnregisterDeviceBuffers(
    const v1::UnregisterDeviceBuffersRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(std::shared_ptr<DeviceImport> import,
                   session->GetImport(request.import_id()));
  RETURN_IF_ERROR(session->RemoveImport(request.import_id()));
  // Its operations (queued or in flight) hold it; none of them may wait for
  // "KV written" any more. Returning only once they are done means the
  // engine may free its buffers as soon as this call returns.
  if (import->gpu() != nullptr) import->gpu()->ReleaseWaits();
  RETURN_IF_ERROR(AwaitLastUse(import));
  spdlog::info("session {}: import {} closed", session->tag(),
               request.import_id());
  return v1::UnregisterDeviceBuffersResponse();
}

absl::StatusOr<v1::GetPoolStatsResponse> RequestHandler::GetPoolStats(
    const v1::GetPoolStatsRequest& request) {
  const std::vector<std::shared_ptr<HostPool>> all_pools = pools_->List();
  std::vector<std::shared_ptr<HostPool>> pools = all_pools;
  if (!request.pool().empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
    pools = {std::move(pool)};
  }
  const std::vector<std::shared_ptr<Session>> sessions = sessions_->List();
  v1::GetPoolStatsResponse response;
  for (const std::shared_ptr<HostPool>& pool : pools) {
    FillPoolStats(*pool, sessions, response.add_pools());
  }
  const absl::Time now = absl::Now();
  for (const std::shared_ptr<Session>& session : sessions) {
    FillSessionInfo(*session, all_pools, now, response.add_sessions());
  }
  response.set_memory_budget_bytes(budget_->budget_bytes());
  response.set_memory_reserved_bytes(budget_->reserved_bytes());
  response.set_open_sessions(static_cast<uint32_t>(sessions.size()));
  if (tier_ != nullptr) FillTierStats(*tier_, response.mutable_tier());
  *response.mutable_restart() = restart_;
  response.mutable_restart()->set_sessions_waiting(
      static_cast<uint32_t>(sessions_->adopted_waiting()));
  response.mutable_restart()->set_sessions_resumed(sessions_resumed_.load());
  return response;
}

}  // namespace hostkv
