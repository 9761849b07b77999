// Harness: keeping the session model in step with the daemon (attach,
// open, close, the idle sweep) and the invariants checked after each request.
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/contract/session_socket.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

// Attaches session `id` to `peer` (what the session socket does with
// SCM_CREDENTIALS), checks the answer against the model and notes it.
absl::Status Harness::Attach(const SessionId& id, const PeerCredentials& peer) {
  absl::StatusOr<AttachedSession> s = handler_.AttachSession(id, peer);
  if (!CheckSessionAnswer(id, s.status(), "AttachSession")) {
    return s.status();
  }
  SessionModel* m = FindLive(id);
  if (m->attached) {
    FUZZ_CHECK(absl::IsFailedPrecondition(s.status()),
               "attach of an attached session: ", s.status().ToString());
    return s.status();
  }
  const bool full = AttachedOfUid(peer.uid) >= kMaxSessionsPerUid;
  CheckExhausted(s.status(), full, "--max_sessions_per_uid", "AttachSession");
  if (full) return s.status();
  FUZZ_CHECK(s.ok(), "attach refused: ", s.status().ToString());
  FUZZ_CHECK(s->signal_fd.get() >= 0 && s->session != nullptr &&
                 s->session->tag() == m->tag,
             "attach handed out no signal descriptor");
  // The segment's name is gone: only the descriptor reaches it now.
  FUZZ_CHECK(!ShmSegment::Open(s->session->signals()->name()).ok(),
             "the signal segment of an attached session still has a name");
  m->attached = true;
  m->uid = peer.uid;
  m->gid = peer.gid;
  return absl::OkStatus();
}

// Whether `m` may register device_ and small_device_ by name: it is
// attached by a peer whose uid owns them. Root is no exception (root's
// sessions register root's segments).
bool Harness::OwnsDeviceSegments(const SessionModel* m) const {
  return m != nullptr && m->attached && m->uid == device_.owner_uid();
}

// For a request naming session `id`: if the model has no such session,
// checks the answer is INVALID_ARGUMENT (not 16 bytes) or NOT_FOUND, and
// returns false; true if the session is open (the caller checks the rest).
bool Harness::CheckSessionAnswer(const SessionId& id, const absl::Status& s,
                                 const char* what) {
  if (id.size() != kSessionIdBytes) {
    FUZZ_CHECK(absl::IsInvalidArgument(s), what, " with a ", id.size(),
               "-byte session id: ", s.ToString());
    return false;
  }
  if (FindLive(id) == nullptr) {
    FUZZ_CHECK(absl::IsNotFound(s), what,
               " for an unknown session: ", s.ToString());
    return false;
  }
  FUZZ_CHECK(!absl::IsNotFound(s) ||
                 !absl::StartsWith(s.message(), "no open session with this id"),
             what, " did not find an open session: ", s.ToString());
  return true;
}

// RESOURCE_EXHAUSTED naming `flag` exactly when `limit_hit`.
void Harness::CheckExhausted(const absl::Status& s, bool limit_hit,
                             const char* flag, const char* what) {
  const bool named =
      absl::IsResourceExhausted(s) && absl::StrContains(s.message(), flag);
  FUZZ_CHECK(named == limit_hit, what, ": ", flag,
             limit_hit ? " reached, answer " : " not reached, answer ",
             s.ToString());
}

uint32_t Harness::AttachedOfUid(uint32_t uid) const {
  uint32_t n = 0;
  for (const SessionModel& m : live_) n += m.attached && m.uid == uid;
  return n;
}

uint32_t Harness::UnattachedCount() const {
  uint32_t n = 0;
  for (const SessionModel& m : live_) n += !m.attached;
  return n;
}

uint32_t Harness::ImportsOfUid(uint32_t uid) const {
  uint32_t n = 0;
  for (const SessionModel& m : live_) {
    if (m.attached && m.uid == uid) n += m.imports.size();
  }
  return n;
}

uint32_t Harness::PassedOfUid(uint32_t uid) const {
  uint32_t n = 0;
  for (const SessionModel& m : live_) {
    if (m.attached && m.uid == uid) n += m.passed.size();
  }
  return n;
}

// Drops from the model the sessions that are no longer open (ended by
// ExpireIdleSessions), after checking they were allowed to end.
void Harness::Reconcile() {
  std::set<SessionId> open;
  for (const auto& session : sessions_.List()) open.insert(session->id());
  for (size_t i = 0; i < live_.size();) {
    if (open.count(live_[i].id)) {
      ++i;
      continue;
    }
    FUZZ_CHECK(!live_[i].attached, "attached session ", live_[i].tag,
               " ended by the idle sweep");
    closed_ids_.push_back(live_[i].id);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  FUZZ_CHECK(open.size() == live_.size(), "registry has ", open.size(),
             " sessions, model ", live_.size());
}

void Harness::AllocFor(size_t live_index, const std::string& pool,
                       uint64_t pages) {
  v1::AllocRequest r;
  r.set_session_id(live_[live_index].id);
  r.set_pool(pool);
  r.set_num_tokens(pages * FindPool(pool)->geometry().page_size);
  auto s = handler_.Alloc(r);
  FUZZ_CHECK(s.ok(), "setup: alloc: ", s.status().ToString());
  for (const v1::PageRun& run : s->pages()) {
    for (uint64_t p = run.first_page(); p < run.first_page() + run.num_pages();
         ++p) {
      live_[live_index].pages[pool].insert(p);
    }
  }
}

bool Harness::IsBasePool(const std::string& name) {
  return name == kBasePools[0] || name == kBasePools[1];
}

// Notes a session the handler opened (attached if it was opened so).
void Harness::AddLive(const std::shared_ptr<Session>& session) {
  FUZZ_CHECK(session->id().size() == kSessionIdBytes, "session id of ",
             session->id().size(), " bytes");
  FUZZ_CHECK(FindLive(session->id()) == nullptr, "session id reused");
  for (const SessionModel& m : live_) {
    FUZZ_CHECK(m.tag != session->tag(), "session number reused");
  }
  SessionModel m;
  m.id = session->id();
  m.tag = session->tag();
  if (const std::optional<PeerCredentials> peer = session->peer()) {
    m.attached = true;
    m.uid = peer->uid;
    m.gid = peer->gid;
  }
  live_.push_back(std::move(m));
}

SessionModel* Harness::FindLive(const SessionId& id) {
  for (SessionModel& s : live_) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

// Closes live_[index] through the handler (CloseSession, or EndSession as
// the session monitor does when the socket closes) and checks the answer.
void Harness::CloseLive(size_t index, bool expect_ok, bool end) {
  const SessionModel m = live_[index];
  if (end) {
    const absl::Status s = handler_.EndSession(m.id, "fuzz");
    Note(s.ok());
    FUZZ_CHECK(s.ok() || !expect_ok, "end session: ", s.ToString());
    if (!s.ok()) return;
  } else {
    v1::CloseSessionRequest r;
    r.set_session_id(m.id);
    auto s = handler_.CloseSession(r);
    Note(s.ok());
    if (!s.ok()) {
      FUZZ_CHECK(!expect_ok, "close session: ", s.status().ToString());
      return;
    }
    FUZZ_CHECK(s->pages_freed() == m.TotalPages(), "close freed ",
               s->pages_freed(), " pages, model says ", m.TotalPages());
    FUZZ_CHECK(s->imports_closed() == m.imports.size(), "close closed ",
               s->imports_closed(), " imports, model says ", m.imports.size());
  }
  live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(index));
  // Its id is dead for good.
  v1::RenewSessionRequest renew;
  renew.set_session_id(m.id);
  FUZZ_CHECK(absl::IsNotFound(handler_.RenewSession(renew).status()),
             "a closed session's id still works");
  closed_ids_.push_back(m.id);
  if (closed_ids_.size() > 4) closed_ids_.erase(closed_ids_.begin());
}

void Harness::CheckInvariants() {
  std::map<OwnerTag, const SessionModel*> by_tag;
  for (const SessionModel& s : live_) by_tag[s.tag] = &s;
  const auto pools = pools_.List();
  FUZZ_CHECK(pools.size() == pool_owners_.size(), "registry has ", pools.size(),
             " pools, model ", pool_owners_.size());
  for (const auto& pool : pools) {
    auto owner = pool_owners_.find(pool->name());
    FUZZ_CHECK(owner != pool_owners_.end(), "pool ", pool->name(),
               " unknown to the model");
    FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(
                   pool->owner(), owner->second) &&
                   google::protobuf::util::MessageDifferencer::Equals(
                       pool->Describe().owner(), owner->second),
               "pool ", pool->name(), " owner ",
               pool->owner().ShortDebugString(), ", model says ",
               owner->second.ShortDebugString());
    const SlotAllocator& a = pool->allocator();
    const uint64_t free_pages = a.free_pages();
    const auto usage = a.UsageByOwner();
    uint64_t used = 0;
    for (const auto& [tag, pages] : usage) {
      used += pages;
      FUZZ_CHECK(tag != kNoOwner && pages != 0, "pool ", pool->name(),
                 ": usage entry tag=", tag, " pages=", pages);
      FUZZ_CHECK(by_tag.count(tag), "pool ", pool->name(), ": ", pages,
                 " pages owned by tag ", tag, ", which is no open session");
    }
    const uint64_t cached = a.cached_pages();
    FUZZ_CHECK(free_pages + used + cached == a.num_pages(), "pool ",
               pool->name(), ": free ", free_pages, " + used ", used,
               " + cached ", cached, " != ", a.num_pages());
    CheckCacheInvariants(*pool);
    for (const SessionModel& s : live_) {
      auto it = s.pages.find(pool->name());
      const uint64_t want = it == s.pages.end() ? 0 : it->second.size();
      FUZZ_CHECK(a.pages_owned_by(s.tag) == want, "pool ", pool->name(),
                 ": session tag ", s.tag, " owns ", a.pages_owned_by(s.tag),
                 " pages, model says ", want);
    }
  }
}

// After Quiesce: every owned page can be read (no pin left behind).
void Harness::CheckOwnedPagesReadable() {
  for (const SessionModel& s : live_) {
    for (const auto& [pool_name, pages] : s.pages) {
      auto pool = pools_.Get(pool_name);
      FUZZ_CHECK(pool.ok(), "pool ", pool_name, " with owned pages is gone");
      const uint64_t per_call = std::max<uint64_t>(
          1, kMaxPageIoBytes / (*pool)->geometry().page_bytes());
      std::vector<uint64_t> list(pages.begin(), pages.end());
      for (size_t i = 0; i < list.size(); i += per_call) {
        v1::ReadPagesRequest r;
        r.set_session_id(s.id);
        r.set_pool(pool_name);
        for (size_t j = i; j < std::min(list.size(), i + per_call); ++j) {
          auto* run = r.add_pages();
          run->set_first_page(list[j]);
          run->set_num_pages(1);
        }
        auto got = handler_.ReadPages(r);
        if ((*pool)->geometry().page_bytes() > kMaxPageIoBytes) {
          FUZZ_CHECK(!got.ok());
        } else {
          FUZZ_CHECK(got.ok(),
                     "idle owned pages unreadable: ", got.status().ToString());
        }
      }
    }
  }
}

}  // namespace hostkv::fuzz
