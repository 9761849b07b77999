// PoolRegistry::Adopt: a pool a previous daemon left (deploy/README.md "Restarts and
// upgrades").
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/contract/status_macros.h"
#include "server/cache/page_digest.h"
#include "server/pool/pool_registry.h"
#include "server/pool/pool_spec.h"
#include "server/state/pool_ledger.h"
#include "spdlog/spdlog.h"

namespace hostkv {

absl::StatusOr<std::shared_ptr<HostPool>> PoolRegistry::Adopt(
    std::unique_ptr<PoolLedger> ledger, ScopedFd segment,
    const absl::flat_hash_set<OwnerTag>& live_sessions, PoolAdoption* report) {
  const v1::PoolSpec spec = ledger->spec();
  const std::string what = absl::StrCat("pool '", spec.name(), "'");
  ASSIGN_OR_RETURN(const PoolGeometry geometry, ResolvePoolSpec(spec));
  if (geometry.num_pages() != ledger->num_pages()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": its ledger has ", ledger->num_pages(), " pages, its spec ",
        geometry.num_pages()));
  }
  absl::MutexLock create_lock(&create_mu_);
  if (Get(spec.name()).ok()) {
    return absl::AlreadyExistsError(absl::StrCat(what, " exists already"));
  }
  RETURN_IF_ERROR(budget_->Reserve(what, geometry.total_bytes()));
  BudgetReservation reservation(budget_, geometry.total_bytes());
  ASSIGN_OR_RETURN(
      std::unique_ptr<HostPool> pool,
      HostPool::Adopt(spec, geometry, std::move(segment),
                      absl::StrCat(absl::StripPrefix(segment_prefix_, "/"),
                                   "pool.", spec.name()),
                      std::move(reservation), cache_options_));
  PoolLedger::Contents contents = ledger->Read();
  // A Publish cut by the crash: its pages whose key was recorded are the
  // cache's, the others their publisher's again (dropped below if that
  // session did not survive).
  {
    std::vector<uint8_t> has_entry(geometry.num_pages(), 0);
    for (const AdoptedEntry& e : contents.entries) has_entry[e.page] = 1;
    for (uint64_t p : contents.publishing) {
      if (has_entry[p]) contents.owners[p] = kCacheOwner;
    }
    if (!contents.publishing.empty()) {
      spdlog::info("pool '{}': {} pages of a Publish cut by the crash "
                   "adopted as their ledger proves them", spec.name(),
                   contents.publishing.size());
    }
  }
  // Cached pages: proven records, in a namespace that kept its owner, on a
  // page the ledger gives to the cache.
  // A page with a digest is adopted only if its bytes still match it (a
  // device or a writer may have changed them after the publish, before or
  // across the crash); one without (taken after the crash, or never) is
  // adopted and digested anew.
  std::vector<AdoptedEntry> entries;
  entries.reserve(contents.entries.size());
  uint64_t keys_dropped = contents.unproven_entries;
  std::vector<AdoptedEntry> mismatched;
  PageDigester digester(geometry, pool->base());
  for (AdoptedEntry& e : contents.entries) {
    if (contents.owners[e.page] == kCacheOwner &&
        pool->namespaces().OwnerOf(e.name_space).has_value()) {
      if (e.digest.has_value() && digester.Digest(e.page) != *e.digest) {
        ledger->RecordEvicted(e.page);
        ++keys_dropped;
        mismatched.push_back(std::move(e));
        continue;
      }
      entries.push_back(std::move(e));
    } else {
      ledger->RecordEvicted(e.page);
      ++keys_dropped;
    }
  }
  const size_t proven = entries.size();
  ASSIGN_OR_RETURN(std::vector<uint64_t> cached,
                   pool->cache().Adopt(std::move(entries)));
  keys_dropped += proven - cached.size();
  if (!mismatched.empty()) {
    for (const AdoptedEntry& e : mismatched) {
      pool->cache().NoteDropped(e.name_space, e.key, MissReason::kDigestMismatch);
    }
    pool->cache().CountAdoptionDropped(mismatched.size());
    spdlog::warn("pool '{}': {} cached pages no longer match their digests: not "
                 "adopted (zeroed and freed; their keys miss as digest_mismatch)",
                 spec.name(), mismatched.size());
  }
  std::vector<uint8_t> is_cached(geometry.num_pages(), 0);
  for (uint64_t page : cached) is_cached[page] = 1;
  PoolAdoption counts;
  counts.keys_dropped = keys_dropped;
  counts.pages_dropped = contents.unproven_pages;
  for (uint64_t p = 0; p < geometry.num_pages(); ++p) {
    OwnerTag& owner = contents.owners[p];
    bool keep = true;
    if (owner == kCacheOwner) {
      keep = is_cached[p] != 0;
      if (keep) ++counts.pages_cached;
    } else if (owner == kNoOwner || owner == kUnscrubbedMark) {
      continue;  // free (unproven words read as unscrubbed, counted below)
    } else {
      keep = live_sessions.contains(owner);
      if (keep) ++counts.pages_owned;
    }
    if (!keep) {
      // Also the cache records of pages cached by Adopt are gone with
      // them: a dropped page was never adopted.
      if (!is_cached[p]) ledger->RecordEvicted(p);
      owner = kUnscrubbedMark;
      ++counts.pages_dropped;
    }
  }
  // The ledger says what the allocator now holds (unproven words rewritten).
  for (uint64_t p = 0; p < geometry.num_pages(); ++p) {
    ledger->RecordOwner(p, 1, contents.owners[p]);
  }
  RETURN_IF_ERROR(pool->allocator().Restore(contents.owners));
  pool->set_ledger(std::move(ledger));
  const v1::PoolOwner owner = pool->ledger()->owner();
  ASSIGN_OR_RETURN(std::shared_ptr<HostPool> shared,
                   Publish(std::move(pool), owner));
  if (report != nullptr) *report = counts;
  spdlog::info("pool '{}' adopted: {} pages of sessions, {} cached pages with "
               "their keys, {} pages dropped (zeroed and freed), {} keys dropped",
               spec.name(), counts.pages_owned, counts.pages_cached,
               counts.pages_dropped, counts.keys_dropped);
  return shared;
}

}  // namespace hostkv
