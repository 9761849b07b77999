// RequestHandler: the page cache's requests (Publish, Lookup, Release,
// CopyPages). The cache's own bookkeeping is server/cache/page_cache.h; the
// pages' ownership is the pool's allocator (kCacheOwner). Lock order: the
// allocator's, then the cache's; nothing here holds either across a call.
#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "kernels/page_format.h"
#include "proto/contract/status_macros.h"
#include "server/cache/digest_worker.h"
#include "server/cache/page_digest.h"
#include "server/pool/pool_access.h"
#include "server/service/request_handler.h"
#include "server/service/request_validation.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// A uniform number in [0, 1), per thread (the hits --verify_hits picks).
double SampleUnit() {
  thread_local uint64_t state =
      0x9e3779b97f4a7c15ULL ^ reinterpret_cast<uintptr_t>(&state) ^
      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return static_cast<double>(state >> 11) * 0x1.0p-53;
}

// What a lookup that waits for a tier leaves of its caller's deadline for
// the reply.
constexpr absl::Duration kTierReplyMargin = absl::Milliseconds(20);

void AddRuns(const std::vector<PageRun>& runs,
             google::protobuf::RepeatedPtrField<v1::PageRun>* out) {
  out->Reserve(static_cast<int>(runs.size()));
  for (const PageRun& run : runs) {
    v1::PageRun* r = out->Add();
    r->set_first_page(run.first_page);
    r->set_num_pages(run.num_pages);
  }
}

}  // namespace

absl::StatusOr<RequestHandler::CacheTarget> RequestHandler::ResolveCacheTarget(
    const SessionId& session_id, const std::string& pool_name) {
  CacheTarget target;
  ASSIGN_OR_RETURN(target.session, sessions_->Get(session_id));
  ASSIGN_OR_RETURN(target.pool, pools_->Get(pool_name));
  RETURN_IF_ERROR(CheckPoolUse(target.pool->name(), target.pool->owner(),
                               Principal::Of(*target.session)));
  return target;
}

absl::Status RequestHandler::CheckReferenceLimit(const CacheTarget& target,
                                                 uint64_t more) const {
  const uint64_t held =
      target.pool->cache().ReferencesHeldBy(target.session->tag());
  if (more > limits_.max_cache_refs_per_session ||
      held > limits_.max_cache_refs_per_session - more) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session holds ", held, " references on cached pages of pool '",
        target.pool->name(), "'; ", more, " more would pass the ",
        limits_.max_cache_refs_per_session,
        " --max_cache_refs_per_session allows (Release some first)"));
  }
  // All sessions of the uid, in every pool: more sessions buy no more.
  const std::optional<PeerCredentials> peer = target.session->peer();
  const std::vector<OwnerTag> tags = sessions_->TagsOfUid(
      peer.has_value() ? std::optional<uint32_t>(peer->uid) : std::nullopt);
  uint64_t by_uid = 0;
  for (const std::shared_ptr<HostPool>& pool : pools_->List()) {
    by_uid += pool->cache().ReferencesHeldBy(tags);
  }
  if (more > limits_.max_cache_refs_per_uid ||
      by_uid > limits_.max_cache_refs_per_uid - more) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the sessions of ",
        peer.has_value() ? absl::StrCat("uid ", peer->uid)
                         : std::string("unverified peers"),
        " hold ", by_uid, " references on cached pages; ", more,
        " more would pass the ", limits_.max_cache_refs_per_uid,
        " --max_cache_refs_per_uid allows (Release some first)"));
  }
  return absl::OkStatus();
}

void RequestHandler::UndoForEndedSession(const CacheTarget& target) const {
  if (!target.session->ending()) return;
  // Its release dropped references and freed pages when it ran; these came
  // after it, or raced with it: drop them again (both calls are idempotent).
  target.pool->cache().ReleaseAll(target.session->tag());
  target.pool->allocator().FreeAllOwnedBy(target.session->tag());
}

absl::Status RequestHandler::LookupInTier(
    const CacheTarget& target, const v1::LookupRequest& request,
    absl::Span<const absl::string_view> keys, absl::Time deadline,
    LookupResult& found) {
  HostPool& pool = *target.pool;
  const size_t hits = found.hits;
  const uint64_t page_bytes = pool.geometry().page_bytes();
  const size_t ask = std::min<size_t>(
      {keys.size() - hits, tier_->config().fetch_pages,
       std::max<size_t>(1, tier_->config().fetch_max_bytes / page_bytes)});
  // The pages are published for the caller, as its own publish would be
  // (the reader claims a namespace nobody owns here, within its limits).
  std::shared_ptr<TierFetch> fetch = tier_->reader().Start(
      target.pool, request.namespace_(),
      hits > 0 ? std::string(keys[hits - 1]) : std::string(),
      std::vector<std::string>(keys.begin() + hits, keys.begin() + hits + ask),
      Principal::Of(*target.session));
  if (fetch != nullptr) {
    // Leave the reply time to reach a caller whose deadline is near.
    const absl::Time wait_until =
        std::min(absl::Now() + tier_->config().fetch_wait,
                 deadline - kTierReplyMargin);
    if (!fetch->WaitUntil(wait_until)) tier_->NoteLateFetch();
  }
  absl::StatusOr<LookupResult> more =
      pool.cache().Lookup(request.namespace_(), keys.subspan(hits),
                          request.acquire(), target.session->tag(),
                          /*count_misses=*/false);
  if (!more.ok()) {
    // All or nothing: the first lookup's references go too.
    if (request.acquire() && !found.pages.empty()) {
      pool.cache()
          .Release(target.session->tag(), ToPageRuns(found.pages))
          .IgnoreError();
    }
    return more.status();
  }
  found.hits += more->hits;
  found.pages.insert(found.pages.end(), more->pages.begin(), more->pages.end());
  return absl::OkStatus();
}

void RequestHandler::VerifyHits(const CacheTarget& target, const v1::LookupRequest& request,
                                absl::Span<const absl::string_view> keys,
                                LookupResult& found) {
  HostPool& pool = *target.pool;
  // The hits picked for a check, in key order (every one at 1.0).
  std::vector<uint64_t> picked;
  std::vector<size_t> index;
  for (size_t i = 0; i < found.hits; ++i) {
    if (verify_hits_ >= 1.0 || SampleUnit() < verify_hits_) {
      picked.push_back(found.pages[i]);
      index.push_back(i);
    }
  }
  if (picked.empty()) return;
  const std::vector<std::optional<uint32_t>> digests = pool.cache().DigestsOf(picked);
  PageDigester digester(pool.geometry(), pool.base());
  uint64_t matched = 0, unknown = 0;
  const size_t bad = FirstMismatch(digester, picked, digests, &matched, &unknown);
  pool.cache().CountVerified(matched, unknown);
  if (bad == picked.size()) return;
  const size_t at = index[bad];
  static std::atomic<int64_t> last_log_s{0};
  const int64_t now_s = absl::ToUnixSeconds(absl::Now());
  if (int64_t last = last_log_s.load(); now_s - last >= 10 &&
                                         last_log_s.compare_exchange_strong(last, now_s)) {
    spdlog::warn("pool '{}': cached page {} (key {} in namespace '{}') no longer matches "
                 "its digest: dropped, and a miss to the engine with the {} keys after "
                 "it (logged at most every 10 s; hostkv stats counts them)",
                 pool.name(), picked[bad], absl::BytesToHexString(keys[at]),
                 request.namespace_(), found.hits - at - 1);
  }
  pool.cache().RejectHits(request.namespace_(), found, at, request.acquire(),
                          target.session->tag());
}

absl::StatusOr<v1::LookupResponse> RequestHandler::Lookup(
    const v1::LookupRequest& request, absl::Time deadline) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(CacheTarget target,
                   ResolveCacheTarget(request.session_id(), request.pool()));
  RETURN_IF_ERROR(CheckCacheNamespace(request.namespace_()));
  RETURN_IF_ERROR(CheckCacheKeyCount(request.keys_size(), "keys"));
  for (int i = 0; i < request.keys_size(); ++i) {
    RETURN_IF_ERROR(CheckCacheKey(request.keys(i), i, false));
  }
  HostPool& pool = *target.pool;
  RETURN_IF_ERROR(pool.namespaces().CheckUse(pool.name(), request.namespace_(),
                                             Principal::Of(*target.session)));
  if (request.acquire()) {
    if (absl::Status limit = CheckReferenceLimit(target, request.keys_size()); !limit.ok()) {
      if (request.keys_size() > 0) {
        pool.cache().CountRefusedLookup(request.namespace_(), request.keys(0));
      }
      return limit;
    }
  }
  std::vector<absl::string_view> keys(request.keys().begin(),
                                      request.keys().end());
  // With a tier that answers, the keys not found are looked up once more
  // after the fetch; with hits to check, some may not be served: the misses
  // are counted once the hits are known.
  const bool may_fetch = tier_ != nullptr && tier_->health().up();
  const bool verify = verify_hits_ > 0;
  const bool count_later = may_fetch || verify;
  ASSIGN_OR_RETURN(LookupResult found,
                   pool.cache().Lookup(request.namespace_(), keys,
                                       request.acquire(), target.session->tag(),
                                       /*count_misses=*/!count_later));
  if (may_fetch && found.hits < keys.size()) {
    RETURN_IF_ERROR(LookupInTier(target, request, keys, deadline, found));
  }
  if (verify && found.hits > 0) VerifyHits(target, request, keys, found);
  if (count_later) pool.cache().CountLookupMisses(request.namespace_(), keys, found.hits);
  if (request.acquire()) UndoForEndedSession(target);
  if (tier_ != nullptr && found.hits > 0) {
    tier_->writer().OnHits(target.pool, request.namespace_(),
                           absl::MakeConstSpan(keys).first(found.hits));
  }
  v1::LookupResponse response;
  response.set_hits(found.hits);
  AddRuns(ToPageRuns(found.pages), response.mutable_pages());
  return response;
}

absl::StatusOr<v1::ReleaseResponse> RequestHandler::Release(
    const v1::ReleaseRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   sessions_->Get(request.session_id()));
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> pool, pools_->Get(request.pool()));
  ASSIGN_OR_RETURN(std::vector<PageRun> runs, ToPageRuns(request.pages()));
  ASSIGN_OR_RETURN(const uint64_t released,
                   pool->cache().Release(session->tag(), runs));
  v1::ReleaseResponse response;
  response.set_released(released);
  return response;
}

absl::StatusOr<v1::ListEvictionsResponse> RequestHandler::ListEvictions(
    const v1::ListEvictionsRequest& request) {
  ASSIGN_OR_RETURN(CacheTarget target,
                   ResolveCacheTarget(request.session_id(), request.pool()));
  RETURN_IF_ERROR(CheckCacheNamespace(request.namespace_()));
  if (request.max_keys() > kMaxEvictionsListed) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_keys ", request.max_keys(), " is above ",
                     kMaxEvictionsListed));
  }
  HostPool& pool = *target.pool;
  RETURN_IF_ERROR(pool.namespaces().CheckUse(pool.name(), request.namespace_(),
                                             Principal::Of(*target.session)));
  EvictionList list = pool.cache().ListEvictions(
      request.namespace_(), request.after(), request.max_keys());
  v1::ListEvictionsResponse response;
  response.mutable_keys()->Reserve(static_cast<int>(list.keys.size()));
  for (std::string& key : list.keys) response.add_keys(std::move(key));
  response.set_next(list.next);
  response.set_missed(list.missed);
  return response;
}

absl::StatusOr<v1::CopyPagesResponse> RequestHandler::CopyPages(
    const v1::CopyPagesRequest& request) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(CacheTarget target,
                   ResolveCacheTarget(request.session_id(), request.pool()));
  ASSIGN_OR_RETURN(std::vector<PageRun> from, ToPageRuns(request.from_pages()));
  ASSIGN_OR_RETURN(std::vector<PageRun> to, ToPageRuns(request.to_pages()));
  const OwnerTag tag = target.session->tag();
  const PoolGeometry& g = target.pool->geometry();
  std::vector<PageRun> all = from;
  all.insert(all.end(), to.begin(), to.end());
  RETURN_IF_ERROR(CheckRunsInPool(all, g.num_pages()));
  RETURN_IF_ERROR(CheckNoOverlap(PagesToTokenSpans(all, 1),
                                 "from_pages and to_pages"));
  const uint64_t pages = CountPages(from);
  if (pages != CountPages(to)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "from_pages cover ", pages, " pages but to_pages ", CountPages(to)));
  }
  if (pages > limits_.max_copy_bytes / g.page_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        pages, " pages of ", g.page_bytes(), " bytes exceed the ",
        limits_.max_copy_bytes, " bytes one CopyPages call copies; split it"));
  }
  // Sources: read-only pins (cached pages the session references, or its
  // own pages with no copy in flight); targets: its own idle pages, pinned
  // so that nothing frees or hands them over meanwhile.
  ASSIGN_OR_RETURN(PinnedPages sources,
                   PinnedPages::PinForRead(target.pool, from, tag,
                                           /*owned_pages_idle=*/true));
  RETURN_IF_ERROR(target.pool->allocator().CheckOwnedIdle(to, tag));
  ASSIGN_OR_RETURN(PinnedPages targets, PinnedPages::Pin(target.pool, to, tag));
  size_t to_run = 0;
  uint64_t to_offset = 0;
  for (const PageRun& run : from) {
    for (uint64_t p = run.first_page; p < run.first_page + run.num_pages; ++p) {
      CopyPage(g, target.pool->base(), p, to[to_run].first_page + to_offset);
      if (++to_offset == to[to_run].num_pages) {
        ++to_run;
        to_offset = 0;
      }
    }
  }
  v1::CopyPagesResponse response;
  response.set_pages(pages);
  response.set_bytes(pages * g.page_bytes());
  return response;
}

}  // namespace hostkv
