// ExplainMisses: why lookups of a namespace miss (`hostkv why`).
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/contract/status_macros.h"
#include "server/operations/stats_report.h"
#include "server/pool/pool_access.h"
#include "server/service/request_handler.h"

namespace hostkv {

namespace {

constexpr int kMaxExplained = 1024;

v1::MissReason ToProto(MissReason reason) {
  switch (reason) {
    case MissReason::kNeverPublished:
      return v1::MISS_REASON_NEVER_PUBLISHED;
    case MissReason::kEvicted:
      return v1::MISS_REASON_EVICTED;
    case MissReason::kOtherNamespace:
      return v1::MISS_REASON_OTHER_NAMESPACE;
    case MissReason::kRefused:
      return v1::MISS_REASON_REFUSED;
    case MissReason::kDigestMismatch:
      return v1::MISS_REASON_DIGEST_MISMATCH;
    case MissReason::kTierFailed:
      return v1::MISS_REASON_TIER_FAILED;
  }
  return v1::MISS_REASON_UNSPECIFIED;
}

void FillWhy(const MissExplanation& why, const std::string& other, absl::Time now,
             v1::MissExplanation* out) {
  out->set_reason(ToProto(why.reason));
  if (why.reason == MissReason::kEvicted) {
    out->set_evicted_seconds_ago(absl::ToDoubleSeconds(now - why.evicted_at));
    out->set_evicted_for_session(why.evicted_for_session);
  } else if (why.reason == MissReason::kDigestMismatch ||
             why.reason == MissReason::kTierFailed) {
    out->set_dropped_seconds_ago(absl::ToDoubleSeconds(now - why.evicted_at));
  }
  out->set_other_namespace(other);
}

// Lookups and publishes that never meet: a namespace looked up and
// published in whose misses are all of keys never published there.
std::string HintFor(const MissCounters& c, const CacheCounters& cache) {
  const uint64_t never = c.missed_by_reason[static_cast<int>(MissReason::kNeverPublished)];
  if (c.lookups == 0 || cache.hits != 0 || cache.cached + cache.evictions == 0 ||
      c.reusable_lookups != 0 || never != c.missed()) {
    return "";
  }
  return absl::StrCat(
      "no key looked up here was ever published here (", c.lookups, " lookups, ",
      cache.cached + cache.evictions,
      " pages published): do the engines use different hash seeds (vLLM without "
      "PYTHONHASHSEED), tokenizers or page sizes?");
}

}  // namespace

absl::StatusOr<v1::ExplainMissesResponse> RequestHandler::ExplainMisses(
    const v1::ExplainMissesRequest& request) {
  ASSIGN_OR_RETURN(CacheTarget target,
                   ResolveCacheTarget(request.session_id(), request.pool()));
  RETURN_IF_ERROR(CheckCacheNamespace(request.namespace_()));
  if (request.keys_size() > kMaxExplained || request.max_recent() > kMaxExplained) {
    return absl::InvalidArgumentError(absl::StrCat(
        "at most ", kMaxExplained, " keys and max_recent ", kMaxExplained, "; got ",
        request.keys_size(), " keys and max_recent ", request.max_recent()));
  }
  std::vector<absl::string_view> keys(request.keys().begin(), request.keys().end());
  for (size_t i = 0; i < keys.size(); ++i) RETURN_IF_ERROR(CheckCacheKey(keys[i], i, false));
  HostPool& pool = *target.pool;
  RETURN_IF_ERROR(pool.namespaces().CheckUse(pool.name(), request.namespace_(),
                                             Principal::Of(*target.session)));
  const PageCache& cache = pool.cache();
  const absl::Time now = absl::Now();
  v1::ExplainMissesResponse response;
  const std::vector<KeyExplanation> explained = cache.ExplainKeys(request.namespace_(), keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    v1::MissExplanation* out = response.add_keys();
    out->set_key(std::string(keys[i]));
    out->set_cached(explained[i].cached);
    if (!explained[i].cached) FillWhy(explained[i].why, explained[i].other_namespace, now, out);
  }
  for (const ExplainedMiss& miss : cache.RecentMisses(request.namespace_(),
                                                      request.max_recent())) {
    v1::MissExplanation* out = response.add_recent();
    out->set_key(miss.key);
    out->set_seconds_ago(absl::ToDoubleSeconds(now - miss.when));
    FillWhy(miss.why, miss.other_namespace, now, out);
  }
  const CacheStats stats = cache.Stats();
  MissCounters counters = stats.unknown_namespace;
  CacheCounters cache_counters;
  bool known = false;
  for (const NamespaceCounters& ns : stats.namespaces) {
    if (ns.name == request.namespace_()) {
      counters = ns.misses;
      cache_counters = ns.counters;
      known = true;
    }
  }
  FillMissCounters(counters, response.mutable_lookups());
  if (known) response.set_hint(HintFor(counters, cache_counters));
  return response;
}

}  // namespace hostkv
