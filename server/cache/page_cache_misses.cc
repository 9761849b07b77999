// PageCache's answers to "why did this lookup miss" (`hostkv why`).
#include "server/cache/page_cache.h"
#include "server/cache/page_cache_entry.h"

namespace hostkv {

std::string PageCache::OtherNamespaceLocked(const MissExplanation& why) const {
  if (why.reason != MissReason::kOtherNamespace || why.other_ns >= namespaces_.size()) {
    return "";
  }
  return namespaces_[why.other_ns].name;
}

void PageCache::CountRefusedLookup(absl::string_view name_space,
                                   absl::string_view first_key) {
  absl::MutexLock lock(&mu_);
  CountRefusedLocked(name_space, first_key);
}

void PageCache::CountRefusedLocked(absl::string_view name_space,
                                   absl::string_view first_key) {
  const auto it = namespace_ids_.find(name_space);
  const uint16_t ns = it == namespace_ids_.end() ? MissHistory::kUnknownNamespace : it->second;
  const bool reusable =
      ns != MissHistory::kUnknownNamespace && history_.EverPublished(HashOf(ns, first_key));
  history_.CountLookup(ns, reusable);
  history_.CountMiss(ns, name_space, first_key, MissExplanation{MissReason::kRefused},
                     absl::Now());
}

std::vector<KeyExplanation> PageCache::ExplainKeys(
    absl::string_view name_space, absl::Span<const absl::string_view> keys) const {
  std::vector<KeyExplanation> out(keys.size());
  absl::MutexLock lock(&mu_);
  const auto it = namespace_ids_.find(name_space);
  const uint16_t ns = it == namespace_ids_.end() ? MissHistory::kUnknownNamespace : it->second;
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t hash = ns == MissHistory::kUnknownNamespace ? 0 : HashOf(ns, keys[i]);
    if (ns != MissHistory::kUnknownNamespace && FindLocked(KeyRef{ns, keys[i], hash}) != kNone) {
      out[i].cached = true;
      continue;
    }
    out[i].why = history_.Explain(ns, hash, KeyOnlyHash(keys[i]));
    out[i].other_namespace = OtherNamespaceLocked(out[i].why);
  }
  return out;
}

std::vector<ExplainedMiss> PageCache::RecentMisses(absl::string_view name_space,
                                                   size_t max) const {
  std::vector<ExplainedMiss> out;
  absl::MutexLock lock(&mu_);
  const auto& recent = history_.recent();
  for (auto it = recent.rbegin(); it != recent.rend() && out.size() < max; ++it) {
    if (it->name_space != name_space) continue;
    out.push_back({it->key, it->when, it->why, OtherNamespaceLocked(it->why)});
  }
  return out;
}

}  // namespace hostkv
