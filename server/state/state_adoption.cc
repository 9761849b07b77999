#include "server/state/state_adoption.h"

#include <map>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/contract/status_macros.h"
#include "server/state/pool_ledger.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

constexpr char kDaemonLedgerName[] = "daemon";
constexpr uint32_t kNamespaceSlots = 65536;

absl::Status Refuse(const absl::Status& why) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the state the previous hostkvd left cannot be adopted: ", why.message(),
      ". Start with --discard_state to drop it (its pools, pages, sessions "
      "and cached keys)"));
}

}  // namespace

absl::StatusOr<AdoptedState> AdoptState(StateKeeper& keeper,
                                        uint32_t max_sessions,
                                        PoolRegistry& pools,
                                        SessionRegistry& sessions) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(auto items, keeper.Collect());
  AdoptedState state;
  DaemonLedger::Contents previous;
  uint64_t generation = 0;
  if (auto it = items.find(kDaemonLedgerName); it != items.end()) {
    absl::StatusOr<std::unique_ptr<DaemonLedger>> old =
        DaemonLedger::Open(std::move(it->second));
    if (!old.ok()) return Refuse(old.status());
    previous = (*old)->Read();
    generation = (*old)->generation() + 1;
    state.adopted = true;
    items.erase(it);
  }
  const uint64_t slots = std::min<uint64_t>(
      uint64_t{max_sessions} + previous.sessions.size(), 1u << 20);
  ASSIGN_OR_RETURN(state.ledger,
                   DaemonLedger::Create(static_cast<uint32_t>(slots),
                                        kNamespaceSlots, generation));
  DaemonLedger* ledger = state.ledger.get();
  // Namespace owners first: a cached key is adopted only with its owner.
  pools.namespaces().set_recorder(
      [ledger](const std::string& name, const NamespaceOwner& owner) {
        ledger->RecordNamespace(NamespaceRecord{name, owner});
      });
  pools.namespaces().set_releaser(
      [ledger](const std::string& name, const NamespaceOwner&) {
        ledger->EraseNamespace(name);
      });
  for (const NamespaceRecord& r : previous.namespaces) {
    pools.namespaces().Adopt(r.name, r.owner);
  }
  absl::flat_hash_set<OwnerTag> live;
  for (const SessionRecord& r : previous.sessions) {
    if (live.insert(r.tag).second) ledger->RecordSession(r);
  }
  sessions.Adopt(previous.sessions);
  sessions.set_ledger(ledger);
  pools.set_keeper(&keeper);
  // Pools: a ledger and a segment each.
  for (auto& [name, fd] : items) {
    if (!absl::StartsWith(name, "pool/") || !absl::EndsWith(name, "/ledger")) {
      continue;
    }
    const std::string pool(
        absl::StripSuffix(absl::StripPrefix(name, "pool/"), "/ledger"));
    auto segment = items.find(PoolSegmentKeepName(pool));
    if (segment == items.end() || segment->second.get() < 0) {
      spdlog::warn("state: pool '{}' has a ledger but no segment: dropped", pool);
      continue;
    }
    absl::StatusOr<std::unique_ptr<PoolLedger>> pool_ledger = PoolLedger::Open(
        std::move(fd), absl::StrCat("the ledger of pool '", pool, "'"));
    if (!pool_ledger.ok()) return Refuse(pool_ledger.status());
    PoolAdoption report;
    absl::StatusOr<std::shared_ptr<HostPool>> adopted = pools.Adopt(
        *std::move(pool_ledger), std::move(segment->second), live, &report);
    if (!adopted.ok()) {
      return Refuse(absl::Status(
          adopted.status().code(),
          absl::StrCat("pool '", pool, "': ", adopted.status().message())));
    }
    state.counts.pages_owned += report.pages_owned;
    state.counts.pages_cached += report.pages_cached;
    state.counts.pages_dropped += report.pages_dropped;
    state.counts.keys_dropped += report.keys_dropped;
  }
  // Whatever is left (a segment without its ledger) proves nothing.
  for (auto& [name, fd] : items) {
    if (fd.get() < 0) continue;
    if (pools.Get(std::string(absl::StripSuffix(
                      absl::StripPrefix(name, "pool/"), "/segment")))
            .ok()) {
      continue;
    }
    spdlog::warn("state: '{}' without a ledger: dropped", name);
    keeper.Remove(name).IgnoreError();
  }
  RETURN_IF_ERROR(keeper.Deposit(kDaemonLedgerName, ledger->fd()));
  state.counts.sessions = previous.sessions.size();
  state.generation = generation;
  state.duration = absl::Now() - start;
  if (state.adopted) {
    spdlog::info(
        "adopted the state of the previous hostkvd (restart {}) in {}: {} "
        "pools, {} sessions waiting for their resume, {} pages of sessions, "
        "{} cached pages with their keys, {} namespaces; dropped {} pages "
        "(zeroed) and {} keys it could not prove, {} torn records",
        generation, absl::FormatDuration(absl::Now() - start),
        pools.List().size(), previous.sessions.size(), state.counts.pages_owned,
        state.counts.pages_cached, previous.namespaces.size(),
        state.counts.pages_dropped, state.counts.keys_dropped, previous.unproven);
  }
  return state;
}

}  // namespace hostkv
