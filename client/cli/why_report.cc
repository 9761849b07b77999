#include "why_report.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stats_table.h"

namespace hostkv {
namespace {

std::string Ago(double seconds) {
  if (seconds < 120) return absl::StrFormat("%.0f s ago", seconds);
  if (seconds < 7200) return absl::StrFormat("%.0f min ago", seconds / 60);
  return absl::StrFormat("%.1f h ago", seconds / 3600);
}

std::string Reason(const v1::MissExplanation& m) {
  switch (m.reason()) {
    case v1::MISS_REASON_NEVER_PUBLISHED:
      return "never published in this namespace";
    case v1::MISS_REASON_EVICTED:
      return absl::StrCat("evicted ", Ago(m.evicted_seconds_ago()),
                          m.evicted_for_session() != 0
                              ? absl::StrCat(" for an allocation of session ",
                                             m.evicted_for_session())
                              : std::string(" (no session's allocation)"));
    case v1::MISS_REASON_OTHER_NAMESPACE:
      return absl::StrCat("published in another namespace of the pool: ",
                          m.other_namespace());
    case v1::MISS_REASON_REFUSED:
      return "the lookup was refused (a reference limit)";
    case v1::MISS_REASON_DIGEST_MISMATCH:
      return absl::StrCat("dropped ", Ago(m.dropped_seconds_ago()),
                          ": its bytes no longer matched the digest taken when it was "
                          "published (never served)");
    case v1::MISS_REASON_TIER_FAILED:
      return absl::StrCat("the storage tier failed it ", Ago(m.dropped_seconds_ago()),
                          " (a read error, or a damaged or foreign value)");
    default:
      return "no reason recorded";
  }
}

}  // namespace

std::string FormatWhy(const std::string& cache_namespace,
                      const std::vector<std::string>& hex_keys,
                      const v1::ExplainMissesResponse& response) {
  std::string out = absl::StrCat("namespace ", cache_namespace, ": ",
                                 FormatMissCounters(response.lookups()), "\n");
  if (!response.hint().empty()) absl::StrAppend(&out, "  ", response.hint(), "\n");
  for (int i = 0; i < response.keys_size(); ++i) {
    const v1::MissExplanation& k = response.keys(i);
    const std::string name =
        i < static_cast<int>(hex_keys.size()) ? hex_keys[i] : absl::BytesToHexString(k.key());
    absl::StrAppend(&out, "  ", name, ": ", k.cached() ? "cached" : Reason(k), "\n");
  }
  if (response.recent_size() > 0) absl::StrAppend(&out, "latest misses:\n");
  for (const v1::MissExplanation& m : response.recent()) {
    absl::StrAppend(&out, "  ", Ago(m.seconds_ago()), " ", absl::BytesToHexString(m.key()),
                    ": ", Reason(m), "\n");
  }
  return out;
}

}  // namespace hostkv
