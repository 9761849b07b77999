#include "stats_table.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hostkv {
namespace {

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrFormat("%.2f GiB", b / 1073741824.0);
  if (b >= (1ull << 20)) return absl::StrFormat("%.2f MiB", b / 1048576.0);
  if (b >= (1ull << 10)) return absl::StrFormat("%.2f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string LayoutName(v1::Layout layout) {
  std::string name = v1::Layout_Name(layout);
  return name.size() > 7 ? absl::AsciiStrToLower(name.substr(7)) : name;
}

// A namespace's name as text: printable ASCII as is, other bytes escaped.
std::string NamespaceText(const std::string& name) {
  for (unsigned char c : name) {
    if (c < 0x20 || c > 0x7e) return absl::CHexEscape(name);
  }
  return name;
}

std::string CacheOwnerText(const v1::CacheNamespaceStats& ns) {
  return ns.owner_unverified() ? std::string("unverified")
                               : absl::StrCat("uid ", ns.owner_uid());
}

// The pool's cache counters and, when it has namespaces, a table of them.
void AppendCacheStats(const v1::PoolStats& p, std::string* out) {
  if (!p.has_cache() && p.cache_namespaces_size() == 0) return;
  const v1::CacheCounters& c = p.cache();
  absl::StrAppendFormat(
      out,
      "    cache: %d cached, %d referenced, %d evictable pages; %d hits, %d "
      "misses, %d evictions, %d already cached, %d conflicts%s\n",
      c.cached_pages(), c.referenced_pages(), c.evictable_pages(), c.hits(),
      c.misses(), c.evictions(), c.already_cached(), c.conflicts(),
      p.cache_reserved_bytes() == 0
          ? ""
          : absl::StrCat("; metadata ", Bytes(p.cache_reserved_bytes()),
                         " reserved"));
  if (p.digests_computed() + p.digests_pending() + p.adoption_digest_drops() +
          p.tier_values_refused() > 0) {
    absl::StrAppendFormat(
        out,
        "    digests: %d taken, %d pending; hits checked %d, %d unchecked (digest "
        "pending); dropped for a mismatch: %d on hits, %d at adoption; tier values "
        "refused %d\n",
        p.digests_computed(), p.digests_pending(), p.hits_verified(), p.hits_unverified(),
        p.digest_mismatches(), p.adoption_digest_drops(), p.tier_values_refused());
  }
  if (p.cache_namespaces_size() == 0) return;
  // As wide as the longest name (SGLang's and vLLM's run past 40 bytes).
  int width = 32;
  for (const v1::CacheNamespaceStats& ns : p.cache_namespaces()) {
    width = std::max(width, static_cast<int>(NamespaceText(ns.name()).size()));
  }
  absl::StrAppendFormat(out,
                        "    %-*s %-12s %8s %8s %8s %10s %10s %10s %8s %9s\n",
                        width, "NAMESPACE", "OWNER", "CACHED", "REFD", "EVICTABLE",
                        "HITS", "MISSES", "EVICTIONS", "ALREADY", "CONFLICTS");
  for (const v1::CacheNamespaceStats& ns : p.cache_namespaces()) {
    const v1::CacheCounters& n = ns.counters();
    absl::StrAppendFormat(
        out, "    %-*s %-12s %8d %8d %8d %10d %10d %10d %8d %9d\n", width,
        NamespaceText(ns.name()), CacheOwnerText(ns), n.cached_pages(),
        n.referenced_pages(), n.evictable_pages(), n.hits(), n.misses(),
        n.evictions(), n.already_cached(), n.conflicts());
    if (ns.has_lookups() && ns.lookups().lookups() > 0) {
      absl::StrAppend(out, "      ", FormatMissCounters(ns.lookups()), "\n");
    }
  }
  if (p.has_unknown_namespace_lookups() && p.unknown_namespace_lookups().lookups() > 0) {
    absl::StrAppend(out, "    namespaces never published in: ",
                    FormatMissCounters(p.unknown_namespace_lookups()), "\n");
  }
}

// The storage tier's line: where, whether it answers, writes and reads.
void AppendTierStats(const v1::TierStats& t, std::string* out) {
  absl::StrAppendFormat(
      out, "tier: %s %s%s\n", t.url(), t.serving() ? "serving" : "NOT SERVING",
      t.serving() || t.last_error().empty()
          ? ""
          : absl::StrCat(" (", t.last_error(), ")"));
  absl::StrAppendFormat(
      out,
      "    writes: %d pages written (%s), %d already stored, %d failed, %d "
      "dropped, %d evicted first; %d queued (%s); %d calls, mean %.2f ms\n",
      t.written(), Bytes(t.written_bytes()), t.already_stored(),
      t.write_failures(), t.writes_dropped(), t.writes_skipped(),
      t.write_queue_pages(),
      Bytes(t.write_queue_bytes()), t.put_calls(), t.put_mean_seconds() * 1e3);
  absl::StrAppendFormat(
      out,
      "    reads: %d hits (%s), %d misses, %d corrupt, %d failed, %d no "
      "space, %d late; %d calls, mean %.2f ms\n",
      t.read_hits(), Bytes(t.read_bytes()), t.read_misses(), t.read_corrupt(),
      t.read_failures(), t.fetch_no_space(), t.fetches_late(), t.get_calls(),
      t.get_mean_seconds() * 1e3);
}

}  // namespace

std::string FormatPoolStats(const v1::GetPoolStatsResponse& stats) {
  int width = 16;  // as wide as the longest pool name
  for (const v1::PoolStats& p : stats.pools()) {
    width = std::max(width, static_cast<int>(p.name().size()));
  }
  std::string out = absl::StrFormat(
      "%-*s %-18s %5s %12s %12s %7s %12s %8s %8s\n", width, "POOL", "LAYOUT", "PAGE",
      "USED PAGES", "FREE PAGES", "USED%", "CAPACITY", "LOADS", "BACKUPS");
  for (const v1::PoolStats& p : stats.pools()) {
    const double pct = p.capacity_pages() == 0
                           ? 0.0
                           : 100.0 * p.used_pages() / p.capacity_pages();
    absl::StrAppendFormat(
        &out, "%-*s %-18s %5d %12d %12d %6.1f%% %12s %8d %8d\n", width, p.name(),
        LayoutName(p.layout()), p.page_size(), p.used_pages(), p.free_pages(),
        pct, Bytes(p.capacity_bytes()), p.loads(), p.backups());
    switch (p.fill_state()) {  // shown until the pool is resident
      case v1::FILL_FILLING:
        absl::StrAppendFormat(
            &out,
            "    memory: filling, %s of %s resident (%d of %d pages ready, "
            "%.1f s so far, %d threads)\n",
            Bytes(p.ready_bytes()), Bytes(p.capacity_bytes()), p.ready_pages(),
            p.capacity_pages(), p.fill_seconds(), p.fill_threads());
        break;
      case v1::FILL_FAILED:
        absl::StrAppendFormat(
            &out, "    memory: filling failed at %s of %s: %s\n",
            Bytes(p.ready_bytes()), Bytes(p.capacity_bytes()), p.fill_error());
        break;
      default:
        break;
    }
    switch (p.pin_state()) {  // CUDA backend only
      case v1::PIN_PINNING:
        absl::StrAppendFormat(
            &out, "    cuda: pinning, %s of %s done (%.1f s so far)\n",
            Bytes(p.pinned_bytes()), Bytes(p.capacity_bytes()),
            p.pin_seconds());
        break;
      case v1::PIN_PINNED:
        absl::StrAppendFormat(&out, "    cuda: pinned in %.1f s\n",
                              p.pin_seconds());
        break;
      case v1::PIN_FAILED:
        absl::StrAppendFormat(&out, "    cuda: pinning failed: %s\n",
                              p.pin_error());
        break;
      default:
        break;
    }
    AppendCacheStats(p, &out);
    for (const v1::SessionUsage& s : p.sessions()) {
      absl::StrAppendFormat(
          &out, "    session %-4d %-20s %d pages (%s), %d imports\n",
          s.session_number(), s.client_name(), s.pages(), Bytes(s.bytes()),
          s.imports());
    }
  }
  if (stats.sessions_size() > 0) {
    absl::StrAppendFormat(&out,
                          "\n%-8s %-20s %8s %6s %-8s %9s %9s %10s %8s %9s\n",
                          "SESSION", "CLIENT", "PID", "UID", "ATTACHED",
                          "AGE(s)", "IDLE(s)", "PAGES", "IMPORTS", "IN FLIGHT");
    for (const v1::SessionInfo& s : stats.sessions()) {
      absl::StrAppendFormat(
          &out, "%-8d %-20s %8d %6d %-8s %9.1f %9.1f %10d %8d %9d\n",
          s.session_number(), s.client_name(), s.pid(), s.uid(),
          s.attached() ? "yes" : "no", s.age_seconds(), s.idle_seconds(),
          s.pages(), s.imports(), s.operations_in_flight());
    }
  }
  if (stats.has_tier()) AppendTierStats(stats.tier(), &out);
  if (stats.restart().adopted()) {
    const v1::RestartStats& r = stats.restart();
    absl::StrAppendFormat(
        &out,
        "restart %d adopted in %.3f s: %d sessions (%d resumed, %d waiting), "
        "%d pages of sessions, %d cached pages; dropped %d pages, %d keys\n",
        r.generation(), r.adopt_seconds(), r.sessions_adopted(),
        r.sessions_resumed(), r.sessions_waiting(), r.pages_adopted(),
        r.cached_pages_adopted(), r.pages_dropped(), r.keys_dropped());
  }
  absl::StrAppendFormat(
      &out, "sessions open: %d   memory reserved: %s%s\n",
      stats.open_sessions(), Bytes(stats.memory_reserved_bytes()),
      stats.memory_budget_bytes() == 0
          ? ""
          : absl::StrCat(" of ", Bytes(stats.memory_budget_bytes())));
  return out;
}

void DropSession(uint32_t session_number, v1::GetPoolStatsResponse* stats) {
  auto* sessions = stats->mutable_sessions();
  for (int i = 0; i < sessions->size(); ++i) {
    if (sessions->Get(i).session_number() != session_number) continue;
    sessions->DeleteSubrange(i, 1);
    if (stats->open_sessions() > 0) {
      stats->set_open_sessions(stats->open_sessions() - 1);
    }
    return;
  }
}

namespace {

// "daemon", "unverified" or "uid N", and "+session N" for a pool that goes
// with its creating session.
std::string OwnerText(const v1::PoolOwner& owner) {
  std::string text = owner.daemon()       ? std::string("daemon")
                     : owner.unverified() ? std::string("unverified")
                                          : absl::StrCat("uid ", owner.uid());
  if (owner.delete_with_session() != 0) {
    absl::StrAppend(&text, " +session ", owner.delete_with_session());
  }
  return text;
}

}  // namespace

static const char* AttentionName(const v1::Geometry& geometry) {
  if (geometry.has_mla()) return "MLA";
  if (geometry.has_blocks()) return "BLK";
  return "MHA";
}

std::string FormatPools(const std::vector<v1::Pool>& pools) {
  int width = 24;  // as wide as the longest pool name
  for (const v1::Pool& p : pools) {
    width = std::max(width, static_cast<int>(p.spec().name().size()));
  }
  std::string out = absl::StrFormat(
      "%-*s %-4s %-18s %5s %10s %10s %12s  %-22s %s\n", width, "POOL", "ATTN",
      "LAYOUT", "PAGE", "TOKENS", "PAGES", "BYTES", "OWNER", "SEGMENT");
  for (const v1::Pool& p : pools) {
    absl::StrAppendFormat(
        &out, "%-*s %-4s %-18s %5d %10d %10d %12s  %-22s %s\n", width,
        p.spec().name(), AttentionName(p.spec().geometry()),
        LayoutName(p.spec().layout()), p.spec().page_size(), p.token_slots(),
        p.num_pages(), Bytes(p.total_bytes()), OwnerText(p.owner()),
        p.segment_name());
  }
  return out;
}

}  // namespace hostkv

namespace hostkv {

absl::StatusOr<std::string> ParseHexKey(const std::string& hex) {
  if (hex.empty() || hex.size() % 2 != 0 || hex.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", hex, "': an even number of hex digits, 2..128 (1..64 bytes)"));
  }
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", hex, "': not hex"));
    }
  }
  return absl::HexStringToBytes(hex);
}

std::string FormatMissCounters(const v1::MissCounters& c) {
  std::string out = absl::StrFormat(
      "lookups %d, first key published before in %d (%.1f%%: the hit rate without "
      "evictions), missed %d",
      c.lookups(), c.reusable_lookups(),
      c.lookups() ? 100.0 * c.reusable_lookups() / c.lookups() : 0.0, c.missed_lookups());
  if (c.missed_lookups() > 0) {
    absl::StrAppendFormat(&out, ": never published %d, evicted %d, other namespace %d, "
                          "refused %d, digest mismatch %d, tier failed %d",
                          c.never_published(), c.evicted(), c.other_namespace(), c.refused(),
                          c.digest_mismatch(), c.tier_failed());
  }
  return out;
}

std::string FormatLookup(const std::vector<std::string>& hex_keys,
                         const LookupResult& result) {
  std::string out =
      absl::StrFormat("hits: %d of %d keys\n", result.hits, hex_keys.size());
  uint64_t key = 0;
  for (const PageRange& run : result.pages) {
    for (uint64_t i = 0; i < run.num_pages && key < hex_keys.size();
         ++i, ++key) {
      absl::StrAppendFormat(&out, "  %s page %d\n", hex_keys[key],
                            run.first_page + i);
    }
  }
  for (; key < hex_keys.size(); ++key) {
    absl::StrAppendFormat(&out, "  %s miss\n", hex_keys[key]);
  }
  return out;
}

}  // namespace hostkv
