// RequestHandler::Publish: a session's pages become the page cache's
// (server/README.md "The page cache"). A Publish sent again after a daemon
// restart cut its first try is answered as if it ran once: items cached
// already exactly as they say are CACHED, the others are published now.
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"
#include "server/operations/crash_point.h"
#include "server/cache/digest_worker.h"
#include "server/pool/pool_access.h"
#include "server/service/request_handler.h"
#include "server/service/request_validation.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// Everything Publish can refuse before it moves a page.
absl::Status CheckPublishRequest(const v1::PublishRequest& request) {
  RETURN_IF_ERROR(CheckCacheNamespace(request.namespace_()));
  RETURN_IF_ERROR(CheckCacheKeyCount(request.items_size(), "items"));
  for (int i = 0; i < request.items_size(); ++i) {
    RETURN_IF_ERROR(CheckCacheKey(request.items(i).key(), i, false));
    RETURN_IF_ERROR(CheckCacheKey(request.items(i).parent_key(), i, true));
    if (request.chained() && i > 0 && !request.items(i).parent_key().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i,
                       ": in a chained request only the first item names a "
                       "parent (the others' parent is the item before them)"));
    }
  }
  return absl::OkStatus();
}

v1::PublishOutcome ToProto(PublishOutcome outcome) {
  switch (outcome) {
    case PublishOutcome::kCached:
      return v1::PUBLISH_CACHED;
    case PublishOutcome::kAlreadyCached:
      return v1::PUBLISH_ALREADY_CACHED;
    case PublishOutcome::kConflict:
      return v1::PUBLISH_CONFLICT;
  }
  return v1::PUBLISH_OUTCOME_UNSPECIFIED;
}

// The request's items, each with its parent's key (a chained request's
// items name the item before them).
std::vector<PublishItem> ItemsOf(const v1::PublishRequest& request) {
  std::vector<PublishItem> items;
  items.reserve(request.items_size());
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::CacheItem& item = request.items(i);
    items.push_back({item.key(),
                     request.chained() && i > 0 ? request.items(i - 1).key()
                                                : item.parent_key(),
                     item.page()});
  }
  return items;
}

}  // namespace

absl::StatusOr<v1::PublishResponse> RequestHandler::Publish(
    const v1::PublishRequest& request) {
  return PublishWithin(request, limits_.cache_publish_wait);
}

absl::StatusOr<v1::PublishResponse> RequestHandler::PublishWithin(
    const v1::PublishRequest& request, absl::Duration copy_wait) {
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(CacheTarget target,
                   ResolveCacheTarget(request.session_id(), request.pool()));
  RETURN_IF_ERROR(CheckPublishRequest(request));
  HostPool& pool = *target.pool;
  const OwnerTag tag = target.session->tag();
  RETURN_IF_ERROR(pool.namespaces().ClaimOrCheck(
      pool.name(), request.namespace_(), Principal::Of(*target.session)));
  if (request.acquire()) {
    RETURN_IF_ERROR(CheckReferenceLimit(target, request.items_size()));
  }
  const std::vector<PublishItem> all = ItemsOf(request);
  ASSIGN_OR_RETURN(const std::vector<bool> done,
                   pool.cache().Republished(request.namespace_(), all,
                                            request.acquire(), tag));
  std::vector<PublishResult> results(all.size());
  std::vector<PublishItem> fresh;
  std::vector<size_t> fresh_index;
  std::vector<uint64_t> done_pages;
  for (size_t i = 0; i < all.size(); ++i) {
    if (done[i]) {
      results[i] = {PublishOutcome::kCached, all[i].page};
      done_pages.push_back(all[i].page);
    } else {
      fresh.push_back(all[i]);
      fresh_index.push_back(i);
    }
  }
  if (!fresh.empty()) {
    absl::StatusOr<std::vector<PublishResult>> published =
        PublishFresh(target, request, fresh, copy_wait);
    if (!published.ok()) {
      if (request.acquire() && !done_pages.empty()) {
        pool.cache().Release(tag, ToPageRuns(done_pages)).IgnoreError();
      }
      return published.status();
    }
    for (size_t k = 0; k < fresh.size(); ++k) {
      results[fresh_index[k]] = (*published)[k];
    }
  }
  if (!done_pages.empty()) {
    spdlog::info(
        "session {}: {} of {} items of a Publish in '{}' of pool "
        "'{}' were cached by an earlier try of it (sent again after "
        "a restart): answered as cached",
        tag, done_pages.size(), all.size(), request.namespace_(), pool.name());
  }
  v1::PublishResponse response;
  response.mutable_results()->Reserve(static_cast<int>(all.size()));
  uint64_t cached = 0;
  uint64_t already_cached = 0;
  for (const PublishResult& result : results) {
    v1::PublishResult* out = response.add_results();
    out->set_outcome(ToProto(result.outcome));
    out->set_page(result.page);
    cached += result.outcome == PublishOutcome::kCached;
    already_cached += result.outcome == PublishOutcome::kAlreadyCached;
  }
  response.set_cached(cached);
  response.set_already_cached(already_cached);
  UndoForEndedSession(target);
  spdlog::debug(
      "session {}: published {} pages in '{}' of pool '{}' ({} "
      "already cached)",
      tag, response.cached(), request.namespace_(), pool.name(),
      response.already_cached());
  return response;
}

absl::StatusOr<std::vector<PublishResult>> RequestHandler::PublishFresh(
    const CacheTarget& target, const v1::PublishRequest& request,
    const std::vector<PublishItem>& items, absl::Duration copy_wait) {
  HostPool& pool = *target.pool;
  const OwnerTag tag = target.session->tag();
  std::vector<uint64_t> pages;
  pages.reserve(items.size());
  for (const PublishItem& item : items) pages.push_back(item.page);
  const std::vector<PageRun> runs = ToPageRuns(pages);
  // The pages become the cache's once no copy fills them any more; from
  // here on, every exit gives back what the cache did not keep. Until the
  // cache has recorded their keys, the ledger says the session is
  // publishing them (a crash gives them back to it).
  RETURN_IF_ERROR(
      pool.allocator().Cache(runs, tag, absl::Now() + copy_wait).status());
  CrashPoint("publish");
  absl::StatusOr<std::vector<PublishResult>> results =
      pool.cache().Publish(request.namespace_(), items, request.acquire(), tag);
  if (!results.ok()) {
    if (absl::Status back = pool.allocator().Reclaim(runs, tag).status();
        !back.ok()) {
      spdlog::error(
          "pool '{}': pages of a failed publish not given back to "
          "session {}: {}",
          pool.name(), tag, std::string(back.message()));
    }
    UndoForEndedSession(target);
    return results.status();
  }
  std::vector<uint64_t> kept;
  std::vector<absl::string_view> published;
  for (size_t i = 0; i < items.size(); ++i) {
    if ((*results)[i].outcome == PublishOutcome::kCached) {
      kept.push_back(items[i].page);
      published.push_back(items[i].key);
    }
  }
  pool.allocator().ConfirmCached(kept);
  // Their digests, taken off this path (DigestWorker).
  if (digests_ != nullptr) {
    digests_->Enqueue(target.pool, request.namespace_(), kept, published);
  }
  if (tier_ != nullptr && !published.empty()) {
    tier_->writer().OnPublished(target.pool, request.namespace_(), published);
  }
  // The pages the cache did not take stay the caller's: those of items
  // whose key was cached already, unless another item cached the page.
  std::vector<uint64_t> returned;
  if (kept.size() != items.size()) {
    const absl::flat_hash_set<uint64_t> taken(kept.begin(), kept.end());
    absl::flat_hash_set<uint64_t> seen;
    for (const PublishItem& item : items) {
      if (!taken.contains(item.page) && seen.insert(item.page).second) {
        returned.push_back(item.page);
      }
    }
  }
  if (!returned.empty()) {
    if (absl::Status back =
            pool.allocator().Reclaim(ToPageRuns(returned), tag).status();
        !back.ok()) {
      spdlog::error(
          "pool '{}': pages of already-cached keys not given back "
          "to session {}: {}",
          pool.name(), tag, std::string(back.message()));
      return absl::InternalError(absl::StrCat(
          "publish: pages not given back to the session: ", back.message()));
    }
  }
  return *std::move(results);
}

}  // namespace hostkv
