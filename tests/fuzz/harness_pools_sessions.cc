// Harness: CreatePool, DeletePool, OpenSession, CloseSession/EndSession,
// AttachSession, the idle-session sweep and GetPoolStats.
#include <unistd.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/contract/op_signal.h"
#include "proto/contract/session_socket.h"
#include "server/pool/pool_spec.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

void Harness::DoCreatePool() {
  v1::CreatePoolRequest r;
  v1::PoolSpec& spec = *r.mutable_spec();
  const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
  if (sel < 32) {  // a base pool again, maybe changed
    spec = BaseSpec(sel % 2);
    if (sel & 4) spec.set_page_size(spec.page_size() + 1);
    r.set_attach_if_exists(sel & 8);
  } else {
    spec.set_name(sel < 240 ? kFuzzPools[sel % 3] : PickPoolName());
    auto* geo = spec.mutable_geometry();
    geo->set_dtype(
        static_cast<v1::Dtype>(fdp_->ConsumeIntegralInRange<int>(0, 6)));
    auto small = [&](uint32_t max) {
      return OneIn(12) ? static_cast<uint32_t>(PickU64(max))
                       : fdp_->ConsumeIntegralInRange<uint32_t>(1, max);
    };
    if (OneIn(2)) {
      auto* mha = geo->mutable_mha();
      mha->set_num_layers(small(4));
      mha->set_num_kv_heads(small(4));
      mha->set_head_dim(small(16));
    } else if (!OneIn(16)) {
      auto* mla = geo->mutable_mla();
      mla->set_num_layers(small(4));
      mla->set_kv_lora_rank(small(16));
      mla->set_qk_rope_head_dim(fdp_->ConsumeIntegralInRange<uint32_t>(0, 8));
    }
    static constexpr uint32_t kPageSizes[] = {1, 2, 3, 4, 8, 16};
    spec.set_page_size(
        OneIn(12) ? static_cast<uint32_t>(PickU64(16))
                  : kPageSizes[fdp_->ConsumeIntegralInRange<int>(0, 5)]);
    spec.set_layout(
        static_cast<v1::Layout>(fdp_->ConsumeIntegralInRange<int>(0, 6)));
    switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        spec.set_capacity_bytes(PickU64(1 << 16));
        break;
      case 1:
        spec.set_capacity_tokens(PickU64(512));
        break;
      case 2:
        break;  // none
      default:
        spec.set_capacity_tokens(
            fdp_->ConsumeIntegralInRange<uint64_t>(1, 512));
        break;
    }
    if (OneIn(4)) spec.set_device_pool_tokens(PickU64(512));
    spec.set_default_mechanism(static_cast<v1::CopyMechanism>(
        fdp_->ConsumeIntegralInRange<int>(0, 4)));
    r.set_attach_if_exists(OneIn(2));
  }
  r.set_session_id(PickSessionId());
  const bool existed = FindPool(spec.name()) != nullptr;
  auto s = handler_.CreatePool(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "CreatePool")) return;
  CheckCreatePool(r, s, *FindLive(r.session_id()), existed);
}

// The answer to CreatePool from session `m`, given whether the pool
// `existed` before: the spec's errors, then ALREADY_EXISTS or (attaching)
// PERMISSION_DENIED, then the owner's quota, then the memory budget.
void Harness::CheckCreatePool(const v1::CreatePoolRequest& r,
                              const absl::StatusOr<v1::Pool>& s,
                              const SessionModel& m, bool existed) {
  const v1::PoolSpec& spec = r.spec();
  const absl::StatusOr<PoolGeometry> resolved = ResolvePoolSpec(spec);
  if (!resolved.ok()) {
    FUZZ_CHECK(s.status().code() == resolved.status().code(),
               "CreatePool of a bad spec ", spec.ShortDebugString(), ": ",
               s.status().ToString(), ", the spec's error is ",
               resolved.status().ToString());
    return;
  }
  if (existed) {
    auto pool = FindPool(spec.name());
    const bool same = google::protobuf::util::MessageDifferencer::Equals(
        pool->info().spec(), NormalizePoolSpec(spec));
    if (!r.attach_if_exists() || !same) {
      FUZZ_CHECK(absl::IsAlreadyExists(s.status()), "CreatePool of existing ",
                 spec.name(), ": ", s.status().ToString());
    } else if (MayUsePool(pool_owners_.at(spec.name()), m)) {
      FUZZ_CHECK(s.ok() && s->owner().SerializeAsString() ==
                               pool_owners_.at(spec.name()).SerializeAsString(),
                 "attach to usable pool ", spec.name(), ": ",
                 s.status().ToString());
    } else {
      FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "attach of uid ", m.uid,
                 " to pool ", spec.name(), " owned by ",
                 pool_owners_.at(spec.name()).ShortDebugString(), ": ",
                 s.status().ToString());
    }
    return;
  }
  const v1::PoolOwner owner = OwnerOf(m);
  uint32_t owned = 0;
  uint64_t held = 0;
  for (const auto& [name, o] : pool_owners_) {
    if (!SameQuotaOwner(o, owner)) continue;
    ++owned;
    held += FindPool(name)->geometry().total_bytes();
  }
  const uint64_t bytes = resolved->total_bytes();
  const bool too_many = owned >= kMaxPoolsPerUid;
  CheckExhausted(s.status(), too_many, "--max_pools_per_uid", "CreatePool");
  if (too_many) return;
  const bool too_big = bytes > kMaxPoolBytesPerUid - held;
  CheckExhausted(s.status(), too_big, "--max_pool_bytes_per_uid", "CreatePool");
  if (too_big) return;
  const bool no_room =
      bytes > budget_.budget_bytes() - budget_.reserved_bytes();
  CheckExhausted(s.status(), no_room, "--memory_budget", "CreatePool");
  if (no_room) return;
  FUZZ_CHECK(s.ok(), "CreatePool of ", spec.ShortDebugString(),
             " refused: ", s.status().ToString());
  auto pool = FindPool(spec.name());
  FUZZ_CHECK(pool != nullptr, "created pool ", spec.name(), " not found");
  const PoolGeometry& g = pool->geometry();
  FUZZ_CHECK(g.page_size != 0 && g.token_slots % g.page_size == 0 &&
             s->num_pages() == g.num_pages() &&
             s->total_bytes() == g.total_bytes() && g.total_bytes() == bytes &&
             g.total_bytes() <= kBudgetBytes);
  pool_owners_[spec.name()] = owner;
}

// The answer to DeletePool: NOT_FOUND, then PERMISSION_DENIED unless the
// session's uid owns the pool (or is root), then FAILED_PRECONDITION while
// it is in use.
void Harness::DoDeletePool() {
  v1::DeletePoolRequest r;
  r.set_pool(PickPoolName());
  r.set_session_id(PickSessionId());
  const bool existed = FindPool(r.pool()) != nullptr;
  bool in_use = false;
  for (const SessionModel& s : live_) {
    auto it = s.pages.find(r.pool());
    if (it != s.pages.end() && !it->second.empty()) in_use = true;
    // Cached pages a session references keep the pool; unreferenced ones
    // go with it.
    auto held = s.refs.find(r.pool());
    if (held != s.refs.end() && !held->second.empty()) in_use = true;
    for (const ImportModel& i : s.imports) in_use |= i.pool == r.pool();
  }
  const bool engine_idle = transfers_.queued() == 0;
  auto s = handler_.DeletePool(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "DeletePool")) return;
  const SessionModel& m = *FindLive(r.session_id());
  if (!existed) {
    FUZZ_CHECK(IsUnknownPoolAnswer(r.pool(), s.status()), "DeletePool of unknown ", r.pool(),
               ": ", s.status().ToString());
    return;
  }
  if (!MayAdminPool(pool_owners_.at(r.pool()), m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "DeletePool of ", r.pool(),
               " owned by ", pool_owners_.at(r.pool()).ShortDebugString(),
               " by uid ", m.uid, m.attached ? "" : " (unattached)", ": ",
               s.status().ToString());
    return;
  }
  if (in_use) {
    FUZZ_CHECK(absl::IsFailedPrecondition(s.status()), "DeletePool of ",
               r.pool(), " in use: ", s.status().ToString());
    return;
  }
  if (s.ok()) {
    for (SessionModel& l : live_) {
      l.pages.erase(r.pool());
      l.refs.erase(r.pool());
    }
    pool_owners_.erase(r.pool());
    return;
  }
  FUZZ_CHECK(!engine_idle && absl::IsFailedPrecondition(s.status()),
             "DeletePool of unused ", r.pool(),
             " refused: ", s.status().ToString());
}

// OpenSession (no peer) or, one time in three, OpenAttachedSession (as the
// session socket opens one): the session limits, then the budget for the
// signal segment.
void Harness::DoOpenSession() {
  const bool attached = OneIn(3);
  std::string name =
      OneIn(8)
          ? std::string(fdp_->ConsumeIntegralInRange<size_t>(190, 210), 'c')
          : fdp_->ConsumeRandomLengthString(32);
  const uint32_t pid = fdp_->ConsumeIntegral<uint32_t>();
  const PeerCredentials peer = attached ? PickPeer() : PeerCredentials{};
  if (live_.size() >= kMaxSessions && !OneIn(4)) {
    CloseLive(0, /*expect_ok=*/true);
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t signal_bytes =
      (uint64_t{kSignalRecords} * sizeof(OpSignal) + page - 1) / page * page;
  const bool no_room =
      signal_bytes > budget_.budget_bytes() - budget_.reserved_bytes();
  std::shared_ptr<Session> opened;
  absl::Status status;
  if (attached) {
    auto s = handler_.OpenAttachedSession(name, peer);
    status = s.status();
    if (s.ok()) {
      FUZZ_CHECK(s->signal_fd.get() >= 0, "no signal descriptor");
      opened = s->session;
    }
  } else {
    v1::OpenSessionRequest r;
    r.set_client_name(name);
    r.set_pid(pid);
    auto s = handler_.OpenSession(r);
    status = s.status();
    if (s.ok()) {
      FUZZ_CHECK(s->signal_slots() == kSignalRecords &&
                 s->session_id().size() == kSessionIdBytes);
      auto session = sessions_.Get(s->session_id());
      FUZZ_CHECK(session.ok(), "opened session not found");
      opened = *session;
      FUZZ_CHECK(s->session_number() == opened->tag());
    }
  }
  Note(status.ok());
  if (name.size() > 200) {  // both ways of opening have the limit
    FUZZ_CHECK(absl::IsInvalidArgument(status), "OpenSession of a ",
               name.size(), "-byte name: ", status.ToString());
    return;
  }
  const bool too_many = live_.size() >= kMaxSessions;
  CheckExhausted(status, too_many, "--max_sessions allows", "OpenSession");
  if (too_many) return;
  const bool uid_full = attached ? AttachedOfUid(peer.uid) >= kMaxSessionsPerUid
                                 : UnattachedCount() >= kMaxUnattachedSessions;
  CheckExhausted(
      status, uid_full,
      attached ? "--max_sessions_per_uid" : "--max_unattached_sessions",
      "OpenSession");
  if (uid_full) return;
  CheckExhausted(status, no_room, "--memory_budget", "OpenSession");
  if (no_room) return;
  FUZZ_CHECK(status.ok(), "OpenSession: ", status.ToString());
  AddLive(opened);
  FUZZ_CHECK(live_.back().attached == attached &&
             (!attached || live_.back().uid == peer.uid));
}

void Harness::DoCloseSession() {
  const SessionId id = PickSessionId();
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].id == id) {
      CloseLive(i, /*expect_ok=*/true, /*end=*/OneIn(3));
      if (outstanding_ != 0) Quiesce();
      return;
    }
  }
  v1::CloseSessionRequest r;
  r.set_session_id(id);
  CheckSessionAnswer(id, handler_.CloseSession(r).status(), "CloseSession");
  CheckSessionAnswer(id, handler_.EndSession(id, "fuzz"), "EndSession");
}

void Harness::DoAttachSession() {
  const SessionId id = PickSessionId();
  Note(Attach(id, PickPeer()).ok());
}

// Ends the unattached sessions (a lease of zero), as the session monitor
// does for those idle longer than the lease; copies may be in flight.
void Harness::DoExpireIdle() {
  handler_.ExpireIdleSessions(absl::ZeroDuration());
  Note(true);
  Reconcile();
}

void Harness::DoGetPoolStats() {
  v1::GetPoolStatsRequest r;
  if (!OneIn(3)) r.set_pool(PickPoolName());
  auto s = handler_.GetPoolStats(r);
  Note(s.ok());
  if (!s.ok()) return;
  FUZZ_CHECK(s->open_sessions() == live_.size());
  FUZZ_CHECK(s->memory_reserved_bytes() <= kBudgetBytes);
  for (const v1::PoolStats& p : s->pools()) {
    FUZZ_CHECK(p.used_pages() + p.free_pages() == p.capacity_pages(),
               p.ShortDebugString());
    uint64_t model = 0;
    for (const SessionModel& m : live_) {
      auto it = m.pages.find(p.name());
      if (it != m.pages.end()) model += it->second.size();
    }
    uint64_t listed = 0;
    for (const v1::SessionUsage& u : p.sessions()) listed += u.pages();
    // Used pages are the sessions' plus the page cache's.
    auto pool = FindPool(p.name());
    FUZZ_CHECK(pool != nullptr);
    uint64_t referenced = 0;
    for (const SessionModel& m : live_) {
      auto it = m.refs.find(p.name());
      if (it != m.refs.end()) referenced += std::set<uint64_t>(it->second.begin(),
                                                               it->second.end()).size();
    }
    FUZZ_CHECK(p.used_pages() == model + p.cached_pages() && listed == model &&
                   p.cached_pages() == pool->allocator().cached_pages() &&
                   p.cache().referenced_pages() == referenced &&
                   p.cache().cached_pages() <= p.cached_pages(),
               "stats of ", p.name(), ": used ", p.used_pages(), " listed ",
               listed, " model ", model, " cached ", p.cached_pages(),
               " referenced ", p.cache().referenced_pages(), " model ",
               referenced);
  }
  FUZZ_CHECK(s->sessions_size() == static_cast<int>(live_.size()));
  for (const v1::SessionInfo& info : s->sessions()) {
    const SessionModel* m = nullptr;
    for (const SessionModel& l : live_) {
      if (l.tag == info.session_number()) m = &l;
    }
    FUZZ_CHECK(m != nullptr, "stats list unknown session ",
               info.session_number());
    FUZZ_CHECK(info.attached() == m->attached &&
                   info.pages() == m->TotalPages() &&
                   info.imports() == m->imports.size() &&
                   (!m->attached || info.uid() == m->uid),
               "stats of session ", info.ShortDebugString(),
               " vs model: attached ", m->attached, " pages ", m->TotalPages(),
               " imports ", m->imports.size());
  }
}

}  // namespace hostkv::fuzz
