// Harness: keeping the session model in step with the daemon (attach,
// open, close, the idle sweep) and the invariants checked after each request.
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

// Attaches session `id` as a peer of this process with `uid` (what the
// session socket does with SO_PEERCRED) and notes it in the model.
absl::Status Harness::Attach(uint64_t id, uint32_t uid) {
  const absl::Status s = handler_.AttachSession(
      id, PeerCredentials{static_cast<uint32_t>(getpid()), uid,
                          static_cast<uint32_t>(getegid())});
  SessionModel* m = FindLive(id);
  if (s.ok()) {
    FUZZ_CHECK(m != nullptr && !m->attached, "attached session ", id,
               " twice or unknown");
    m->attached = true;
    m->uid = uid;
  } else {
    FUZZ_CHECK(m == nullptr || m->attached, "attach refused: ", s.ToString());
  }
  return s;
}

// Whether a well-formed registration of device_ by `m` must succeed: the
// session is attached by a peer whose uid owns the segment (or is root).
bool Harness::MayRegister(const SessionModel* m) const {
  return m != nullptr && m->attached && (m->uid == 0 || m->uid == geteuid());
}

// Drops from the model the sessions that are no longer open (ended by
// ExpireIdleSessions), after checking they were allowed to end.
void Harness::Reconcile() {
  std::set<uint64_t> open;
  for (const auto& session : sessions_.List()) open.insert(session->id());
  for (size_t i = 0; i < live_.size();) {
    if (open.count(live_[i].id)) {
      ++i;
      continue;
    }
    FUZZ_CHECK(!live_[i].attached, "attached session ", live_[i].id,
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

void Harness::AddLive(uint64_t id) {
  auto session = sessions_.Get(id);
  FUZZ_CHECK(session.ok(), "opened session ", id, " not found");
  SessionModel m;
  m.id = id;
  m.tag = (*session)->tag();
  live_.push_back(std::move(m));
}

SessionModel* Harness::FindLive(uint64_t id) {
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
  closed_ids_.push_back(m.id);
  if (closed_ids_.size() > 4) closed_ids_.erase(closed_ids_.begin());
}

void Harness::CheckInvariants() {
  std::map<OwnerTag, const SessionModel*> by_tag;
  for (const SessionModel& s : live_) by_tag[s.tag] = &s;
  for (const auto& pool : pools_.List()) {
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
    FUZZ_CHECK(free_pages + used == a.num_pages(), "pool ", pool->name(),
               ": free ", free_pages, " + used ", used, " != ", a.num_pages());
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
