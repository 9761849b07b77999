// The page cache calls of hostkv::Client: Publish, Lookup, Release and
// CopyPages.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "hostkv/client.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

absl::StatusOr<PublishOutcomes> Client::Publish(
    const std::string& pool, const std::string& cache_namespace,
    const std::vector<CacheItem>& items, bool acquire) {
  v1::PublishRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  request.set_namespace_(cache_namespace);
  request.set_acquire(acquire);
  // One prompt's pages in order (each parent the key before): sent chained,
  // every key once.
  bool chained = items.size() > 1;
  for (size_t i = 1; chained && i < items.size(); ++i) {
    chained = items[i].parent_key == items[i - 1].key;
  }
  request.set_chained(chained);
  request.mutable_items()->Reserve(static_cast<int>(items.size()));
  for (size_t i = 0; i < items.size(); ++i) {
    v1::CacheItem* out = request.add_items();
    out->set_key(items[i].key);
    if (i == 0 || !chained) out->set_parent_key(items[i].parent_key);
    out->set_page(items[i].page);
  }
  ASSIGN_OR_RETURN(v1::PublishResponse response,
                   (impl_->Call<v1::PublishRequest, v1::PublishResponse>(
                       &v1::HostKV::Stub::Publish, request, RingMethod::kPublish)));
  if (response.results_size() != request.items_size()) {
    return absl::InternalError(
        absl::StrCat("the daemon answered ", response.results_size(),
                     " publish results for ", request.items_size(), " items"));
  }
  PublishOutcomes outcomes;
  outcomes.items.reserve(items.size());
  std::vector<std::string> held_keys;
  std::vector<uint64_t> held_pages;
  for (int i = 0; i < response.results_size(); ++i) {
    const v1::PublishResult& r = response.results(i);
    outcomes.items.push_back({r.outcome(), r.page()});
    if (acquire && r.outcome() != v1::PUBLISH_CONFLICT) {
      held_keys.push_back(items[i].key);
      held_pages.push_back(r.page());
    }
  }
  impl_->held.Add(pool, cache_namespace, held_keys, held_pages);
  outcomes.cached = response.cached();
  outcomes.already_cached = response.already_cached();
  return outcomes;
}

absl::StatusOr<LookupResult> Client::Lookup(
    const std::string& pool, const std::string& cache_namespace,
    const std::vector<std::string>& keys, bool acquire) {
  v1::LookupRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  request.set_namespace_(cache_namespace);
  request.set_acquire(acquire);
  request.mutable_keys()->Reserve(static_cast<int>(keys.size()));
  for (const std::string& key : keys) request.add_keys(key);
  ASSIGN_OR_RETURN(v1::LookupResponse response,
                   (impl_->Call<v1::LookupRequest, v1::LookupResponse>(
                       &v1::HostKV::Stub::Lookup, request, RingMethod::kLookup)));
  LookupResult result;
  result.hits = response.hits();
  result.pages = ToPageRanges(response.pages());
  if (CountTokens(result.pages, 1) != result.hits) {
    return absl::InternalError(
        absl::StrCat("the daemon answered ", result.hits, " hits with ",
                     CountTokens(result.pages, 1), " pages"));
  }
  if (acquire && result.hits > 0) {
    impl_->held.Add(pool, cache_namespace,
                    std::vector<std::string>(keys.begin(), keys.begin() + result.hits),
                    PageList(result.pages));
  }
  return result;
}

absl::StatusOr<uint64_t> Client::Release(const std::string& pool,
                                         const std::vector<PageRange>& pages) {
  v1::ReleaseRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  FillRuns(pages, request.mutable_pages());
  ASSIGN_OR_RETURN(v1::ReleaseResponse response,
                   (impl_->Call<v1::ReleaseRequest, v1::ReleaseResponse>(
                       &v1::HostKV::Stub::Release, request, RingMethod::kRelease)));
  impl_->held.Drop(pool, pages);
  return response.released();
}

absl::StatusOr<EvictedKeys> Client::ListEvictions(const std::string& pool,
                                                  const std::string& cache_namespace,
                                                  uint64_t after, uint32_t max_keys) {
  v1::ListEvictionsRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  request.set_namespace_(cache_namespace);
  request.set_after(after);
  request.set_max_keys(max_keys);
  ASSIGN_OR_RETURN(v1::ListEvictionsResponse response,
                   (impl_->Call<v1::ListEvictionsRequest, v1::ListEvictionsResponse>(
                       &v1::HostKV::Stub::ListEvictions, request)));
  EvictedKeys out;
  out.keys.assign(std::make_move_iterator(response.mutable_keys()->begin()),
                  std::make_move_iterator(response.mutable_keys()->end()));
  out.next = response.next();
  out.missed = response.missed();
  return out;
}

absl::StatusOr<v1::ExplainMissesResponse> Client::ExplainMisses(
    const std::string& pool, const std::string& cache_namespace,
    const std::vector<std::string>& keys, uint32_t max_recent) {
  v1::ExplainMissesRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  request.set_namespace_(cache_namespace);
  for (const std::string& key : keys) request.add_keys(key);
  request.set_max_recent(max_recent);
  return impl_->Call<v1::ExplainMissesRequest, v1::ExplainMissesResponse>(
      &v1::HostKV::Stub::ExplainMisses, request);
}

absl::StatusOr<CopyPagesResult> Client::CopyPages(
    const std::string& pool, const std::vector<PageRange>& from,
    const std::vector<PageRange>& to) {
  v1::CopyPagesRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  FillRuns(from, request.mutable_from_pages());
  FillRuns(to, request.mutable_to_pages());
  ASSIGN_OR_RETURN(v1::CopyPagesResponse response,
                   (impl_->Call<v1::CopyPagesRequest, v1::CopyPagesResponse>(
                       &v1::HostKV::Stub::CopyPages, request)));
  return CopyPagesResult{response.pages(), response.bytes()};
}

std::vector<PageRange> PagesNotCached(const std::vector<CacheItem>& items,
                                      const PublishOutcomes& outcomes) {
  std::vector<PageRange> pages;
  for (size_t i = 0; i < items.size() && i < outcomes.items.size(); ++i) {
    if (outcomes.items[i].outcome != v1::PUBLISH_ALREADY_CACHED) continue;
    const uint64_t page = items[i].page;
    if (!pages.empty() &&
        pages.back().first_page + pages.back().num_pages == page) {
      ++pages.back().num_pages;
    } else {
      pages.push_back({page, 1});
    }
  }
  return pages;
}

}  // namespace hostkv
