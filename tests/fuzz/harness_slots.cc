// Harness: Alloc, Free, HandOverPages, ReadPages, WritePages and
// GetPageBufferMeta.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {

void Harness::DoAlloc() {
  v1::AllocRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  const auto pool = FindPool(r.pool());
  const uint64_t page_size = pool ? pool->geometry().page_size : 4;
  const uint64_t free_pages = pool ? pool->allocator().free_pages() : 0;
  if (OneIn(4)) {
    r.set_num_tokens(PickU64(free_pages * page_size));
  } else {
    r.set_num_tokens(page_size *
                     fdp_->ConsumeIntegralInRange<uint64_t>(
                         1, std::min<uint64_t>(free_pages + 1, 64)));
  }
  auto s = ViaRingOrDirect<v1::AllocResponse>(RingMethod::kAlloc, r,
                                              [&] { return handler_.Alloc(r); });
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "Alloc")) return;
  SessionModel* m = FindLive(r.session_id());
  if (pool == nullptr) {
    FUZZ_CHECK(IsUnknownPoolAnswer(r.pool(), s.status()), "Alloc in unknown pool ", r.pool(),
               ": ", s.status().ToString());
    return;
  }
  if (!MayUsePool(pool_owners_.at(r.pool()), *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "Alloc by uid ", m->uid,
               m->attached ? "" : " (unattached)", " in pool ", r.pool(),
               " owned by ", pool_owners_.at(r.pool()).ShortDebugString(), ": ",
               s.status().ToString());
    return;
  }
  const bool valid = r.num_tokens() != 0 && r.num_tokens() % page_size == 0;
  if (!s.ok()) {
    FUZZ_CHECK(!absl::IsPermissionDenied(s.status()),
               "Alloc in a usable pool: ", s.status().ToString());
    if (valid && r.num_tokens() / page_size <= free_pages) {
      Die(absl::StrCat("Alloc of ", r.num_tokens(), " tokens refused with ",
                       free_pages, " pages free: ", s.status().ToString()));
    }
    FUZZ_CHECK(valid ? absl::IsResourceExhausted(s.status())
                     : absl::IsInvalidArgument(s.status()),
               "Alloc of ", r.num_tokens(), " tokens: ", s.status().ToString());
    return;
  }
  FUZZ_CHECK(valid, "Alloc accepted an invalid request: ", r.DebugString());
  std::vector<uint64_t> pages;
  FUZZ_CHECK(
      DistinctPages(ToRuns(s->pages()), pool->allocator().num_pages(), &pages),
      "Alloc returned bad runs: ", s->DebugString());
  FUZZ_CHECK(pages.size() == r.num_tokens() / page_size, "Alloc returned ",
             pages.size(), " pages for ", r.num_tokens(), " tokens");
  for (const SessionModel& other : live_) {
    auto it = other.pages.find(r.pool());
    if (it == other.pages.end()) continue;
    for (uint64_t p : pages) {
      FUZZ_CHECK(!it->second.count(p), "Alloc returned page ", p,
                 " already owned by session tag ", other.tag);
    }
  }
  m->pages[r.pool()].insert(pages.begin(), pages.end());
}

void Harness::DoFree() {
  v1::FreeRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  const auto pool = FindPool(r.pool());
  SessionModel* m = FindLive(r.session_id());
  const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
  const std::vector<PageRun> runs = PickPageRuns(m, r.pool(), num_pages);
  SetRuns(runs, r.mutable_pages());
  std::vector<uint64_t> pages;
  const bool distinct = pool && DistinctPages(runs, num_pages, &pages);
  const bool owned = distinct && AllOwned(m, r.pool(), pages);
  auto s = ViaRingOrDirect<v1::FreeResponse>(RingMethod::kFree, r,
                                             [&] { return handler_.Free(r); });
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "Free")) return;
  if (runs.empty() && pool != nullptr) {  // freeing nothing is a no-op
    FUZZ_CHECK(s.ok() && s->pages_freed() == 0, "Free of no pages: ",
               s.status().ToString());
    return;
  }
  if (!s.ok()) {
    FUZZ_CHECK(!(owned && outstanding_ == 0),
               "Free of owned idle pages refused: ", s.status().ToString(),
               " request ", r.ShortDebugString());
    return;
  }
  FUZZ_CHECK(owned, "Free accepted pages the session does not own: ",
             r.ShortDebugString());
  FUZZ_CHECK(s->pages_freed() == pages.size(), "Free freed ", s->pages_freed(),
             " of ", pages.size());
  for (uint64_t p : pages) m->pages[r.pool()].erase(p);
}

void Harness::DoReadPages() {
  v1::ReadPagesRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  const auto pool = FindPool(r.pool());
  const SessionModel* m = FindLive(r.session_id());
  SetRuns(PickPageRuns(m, r.pool(), pool ? pool->allocator().num_pages() : 100),
          r.mutable_pages());
  auto s = handler_.ReadPages(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "ReadPages")) return;
  if (!s.ok()) return;
  FUZZ_CHECK(pool != nullptr && m != nullptr);
  uint64_t pages = 0;
  for (const v1::PageRun& run : r.pages()) {
    FUZZ_CHECK(run.num_pages() != 0 &&
               run.first_page() < pool->allocator().num_pages() &&
               run.num_pages() <=
                   pool->allocator().num_pages() - run.first_page());
    for (uint64_t p = run.first_page(); p < run.first_page() + run.num_pages();
         ++p) {
      auto held = m->refs.find(r.pool());
      FUZZ_CHECK(AllOwned(m, r.pool(), {p}) ||
                     (held != m->refs.end() && held->second.count(p)),
                 "ReadPages of a page neither owned nor referenced: ", p);
    }
    pages += run.num_pages();
  }
  FUZZ_CHECK(s->data().size() == pages * pool->geometry().page_bytes());
}

void Harness::DoWritePages() {
  v1::WritePagesRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  const auto pool = FindPool(r.pool());
  const SessionModel* m = FindLive(r.session_id());
  const std::vector<PageRun> runs =
      PickPageRuns(m, r.pool(), pool ? pool->allocator().num_pages() : 100);
  SetRuns(runs, r.mutable_pages());
  uint64_t want = 0;
  std::vector<uint64_t> pages;
  if (pool != nullptr &&
      DistinctPages(runs, pool->allocator().num_pages(), &pages)) {
    want = pages.size() * pool->geometry().page_bytes();
  }
  uint64_t size = want;
  switch (fdp_->ConsumeIntegralInRange<int>(0, 7)) {
    case 5:
      size = want + 1;
      break;
    case 6:
      size = want == 0 ? 0 : want - 1;
      break;
    case 7:
      size = fdp_->ConsumeIntegralInRange<uint64_t>(0, 4096);
      break;
    default:
      break;  // exact
  }
  size = std::min<uint64_t>(size, 2 * kMaxPageIoBytes + 1);
  const uint8_t seed = fdp_->ConsumeIntegral<uint8_t>();
  std::string data(size, '\0');
  for (uint64_t i = 0; i < size; ++i)
    data[i] = static_cast<char>(seed + i * 131 + (i >> 8));
  r.set_data(data);
  auto s = handler_.WritePages(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "WritePages")) return;
  if (!s.ok()) return;
  FUZZ_CHECK(pool != nullptr && m != nullptr && want == size && want != 0 &&
                 AllOwned(m, r.pool(), pages) && want <= kMaxPageIoBytes,
             "WritePages accepted ", r.pages_size(), " runs, ", pages.size(),
             " distinct pages, ", size, " bytes");
  if (outstanding_ != 0) return;  // a backup in flight may write these pages
  v1::ReadPagesRequest read;
  read.set_session_id(r.session_id());
  read.set_pool(r.pool());
  *read.mutable_pages() = r.pages();
  auto back = handler_.ReadPages(read);
  FUZZ_CHECK(back.ok(),
             "ReadPages after WritePages: ", back.status().ToString());
  FUZZ_CHECK(back->data() == data,
             "ReadPages did not return what WritePages wrote (",
             pool->info().spec().ShortDebugString(), ")");
}

void Harness::DoGetPageBufferMeta() {
  v1::GetPageBufferMetaRequest r;
  r.set_pool(PickPoolName());
  const auto pool = FindPool(r.pool());
  const SessionModel* m = live_.empty() ? nullptr : &live_[PickLiveIndex()];
  SetRuns(PickPageRuns(m, r.pool(), pool ? pool->allocator().num_pages() : 100),
          r.mutable_pages());
  auto s = handler_.GetPageBufferMeta(r);
  Note(s.ok());
  if (!s.ok()) return;
  FUZZ_CHECK(pool != nullptr);
  const PoolGeometry& g = pool->geometry();
  uint64_t pages = 0;
  for (const v1::PageRun& run : r.pages()) pages += run.num_pages();
  uint64_t bytes = 0;
  for (const v1::BufferPiece& piece : s->pieces()) {
    FUZZ_CHECK(piece.size() != 0 && piece.offset() <= g.total_bytes() &&
                   piece.size() <= g.total_bytes() - piece.offset(),
               "piece ", piece.ShortDebugString(), " outside the pool of ",
               g.total_bytes(), " bytes");
    bytes += piece.size();
  }
  FUZZ_CHECK(bytes == pages * g.page_bytes(), "pieces cover ", bytes,
             " bytes for ", pages, " pages of ", g.page_bytes());
  FUZZ_CHECK(s->segment_name() == pool->info().segment_name());
}

// HandOverPages: mostly owned pages to another open session.
void Harness::DoHandOver() {
  v1::HandOverPagesRequest r;
  r.set_session_id(PickSessionId());
  r.set_pool(PickPoolName());
  SessionModel* from = FindLive(r.session_id());
  const auto pool = FindPool(r.pool());
  const uint64_t num_pages = pool ? pool->allocator().num_pages() : 100;
  const std::vector<PageRun> runs = PickPageRuns(from, r.pool(), num_pages);
  SetRuns(runs, r.mutable_pages());
  const uint8_t sel = fdp_->ConsumeIntegral<uint8_t>();
  if (sel < 224 && !live_.empty()) {
    r.set_to_session_number(live_[sel % live_.size()].tag);
  } else {
    r.set_to_session_number(sel % 2 == 0 ? kNoOwner
                                         : fdp_->ConsumeIntegral<uint32_t>());
  }
  SessionModel* to = nullptr;
  for (SessionModel& m : live_) {
    if (m.tag == r.to_session_number()) to = &m;
  }
  // Pages listed (in range; repeats allowed) and whether `from` owns all.
  std::set<uint64_t> pages;
  bool valid =
      from != nullptr && to != nullptr && pool != nullptr && !runs.empty();
  for (const PageRun& run : runs) {
    if (run.num_pages == 0 || run.first_page >= num_pages ||
        run.num_pages > num_pages - run.first_page) {
      valid = false;
      break;
    }
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      pages.insert(p);
    }
  }
  if (valid) {
    valid = AllOwned(from, r.pool(),
                     std::vector<uint64_t>(pages.begin(), pages.end()));
  }
  // The receiver must be allowed in the pool (PERMISSION_DENIED otherwise).
  const bool receiver_denied = valid && !MayUsePool(pool_owners_.at(r.pool()), *to);
  valid = valid && !receiver_denied;
  auto s = handler_.HandOverPages(r);
  Note(s.ok());
  if (!CheckSessionAnswer(r.session_id(), s.status(), "HandOverPages")) return;
  if (!s.ok()) {
    FUZZ_CHECK(!(valid && outstanding_ == 0),
               "HandOverPages refused: ", s.status().ToString(), " ",
               r.ShortDebugString());
    FUZZ_CHECK(!receiver_denied ||
                   s.status().code() == absl::StatusCode::kPermissionDenied ||
                   outstanding_ != 0,
               "HandOverPages to a session the pool refuses: ",
               s.status().ToString());
    return;
  }
  FUZZ_CHECK(valid, "HandOverPages accepted: ", r.ShortDebugString());
  // Pages listed twice move once; to the session itself nothing moves.
  const uint64_t want = from == to ? 0 : pages.size();
  FUZZ_CHECK(s->pages() == want, "HandOverPages moved ", s->pages(),
             " pages, expected ", want);
  for (uint64_t p : pages) {
    from->pages[r.pool()].erase(p);
    to->pages[r.pool()].insert(p);
  }
}

}  // namespace hostkv::fuzz
