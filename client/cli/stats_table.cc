#include "stats_table.h"

#include "absl/strings/ascii.h"
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

}  // namespace

std::string FormatPoolStats(const v1::GetPoolStatsResponse& stats) {
  std::string out = absl::StrFormat(
      "%-16s %-18s %5s %12s %12s %7s %12s %8s %8s\n", "POOL", "LAYOUT", "PAGE",
      "USED PAGES", "FREE PAGES", "USED%", "CAPACITY", "LOADS", "BACKUPS");
  for (const v1::PoolStats& p : stats.pools()) {
    const double pct = p.capacity_pages() == 0
                           ? 0.0
                           : 100.0 * p.used_pages() / p.capacity_pages();
    absl::StrAppendFormat(
        &out, "%-16s %-18s %5d %12d %12d %6.1f%% %12s %8d %8d\n", p.name(),
        LayoutName(p.layout()), p.page_size(), p.used_pages(), p.free_pages(),
        pct, Bytes(p.capacity_bytes()), p.loads(), p.backups());
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
  absl::StrAppendFormat(
      &out, "sessions open: %d   memory reserved: %s%s\n",
      stats.open_sessions(), Bytes(stats.memory_reserved_bytes()),
      stats.memory_budget_bytes() == 0
          ? ""
          : absl::StrCat(" of ", Bytes(stats.memory_budget_bytes())));
  return out;
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

std::string FormatPools(const std::vector<v1::Pool>& pools) {
  std::string out = absl::StrFormat(
      "%-24s %-4s %-18s %5s %10s %10s %12s  %-22s %s\n", "POOL", "ATTN",
      "LAYOUT", "PAGE", "TOKENS", "PAGES", "BYTES", "OWNER", "SEGMENT");
  for (const v1::Pool& p : pools) {
    absl::StrAppendFormat(
        &out, "%-24s %-4s %-18s %5d %10d %10d %12s  %-22s %s\n",
        p.spec().name(), p.spec().geometry().has_mla() ? "MLA" : "MHA",
        LayoutName(p.spec().layout()), p.spec().page_size(), p.token_slots(),
        p.num_pages(), Bytes(p.total_bytes()), OwnerText(p.owner()),
        p.segment_name());
  }
  return out;
}

}  // namespace hostkv
