#include "server/pool/pool_registry.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/contract/status_macros.h"
#include "server/pool/pool_spec.h"
#include "server/pool/reserved_names.h"
#include "server/state/pool_ledger.h"
#include "server/state/state_keeper.h"
#include "spdlog/spdlog.h"

namespace hostkv {

std::string PoolSegmentKeepName(const std::string& pool) {
  return "pool/" + pool + "/segment";
}

std::string PoolLedgerKeepName(const std::string& pool) {
  return "pool/" + pool + "/ledger";
}

PoolRegistry::PoolRegistry(MemoryBudget* budget, std::string segment_prefix,
                           PoolFillOptions fill, GpuBackend* gpu,
                           PoolQuota quota, CacheOptions cache_options)
    : budget_(budget),
      segment_prefix_(std::move(segment_prefix)),
      fill_(fill),
      gpu_(gpu),
      quota_(quota),
      cache_options_(WithNamespaceOwners(std::move(cache_options))) {}

CacheOptions PoolRegistry::WithNamespaceOwners(CacheOptions options) {
  if (options.namespaces == nullptr) {
    options.namespaces = std::make_shared<NamespaceOwners>(
        options.sharing, options.max_namespaces_per_uid);
  }
  return options;
}

absl::Status PoolRegistry::CheckQuota(const v1::PoolOwner& owner,
                                      uint64_t bytes) const {
  if (owner.daemon()) return absl::OkStatus();
  const std::string who = owner.unverified()
                              ? std::string("sessions without a session socket")
                              : absl::StrCat("uid ", owner.uid());
  uint32_t pools = 0;
  uint64_t held = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, pool] : pools_) {
      const v1::PoolOwner& o = pool->owner();
      if (o.daemon() || o.unverified() != owner.unverified() ||
          (!o.unverified() && o.uid() != owner.uid())) {
        continue;
      }
      ++pools;
      held += pool->geometry().total_bytes();
    }
  }
  if (pools >= quota_.max_pools_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, " already own ", pools,
        " pools, the most --max_pools_per_uid allows"));
  }
  if (quota_.max_pool_bytes_per_uid != 0 &&
      (bytes > quota_.max_pool_bytes_per_uid ||
       held > quota_.max_pool_bytes_per_uid - bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the pool needs ", FormatBytes(bytes), " but ", who, " already own ",
        FormatBytes(held), " of the ", FormatBytes(quota_.max_pool_bytes_per_uid),
        " --max_pool_bytes_per_uid allows; shrink the pool's capacity"));
  }
  return absl::OkStatus();
}

PoolRegistry::~PoolRegistry() {
  absl::flat_hash_map<std::string, std::shared_ptr<HostPool>> pools;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    observer_ = nullptr;
    pools.swap(pools_);
  }
  pools.clear();  // out of the lock: pinning threads may be in Notify
}

void PoolRegistry::Notify(const std::string& name) {
  // Serialized, and the state read inside: the last call always publishes
  // the current state, whichever thread (creation, pinning) gets here last.
  absl::MutexLock notify_lock(&notify_mu_);
  Observer observer;
  bool serving = false;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    observer = observer_;
    auto it = pools_.find(name);
    serving = it != pools_.end() && (it->second->pinning() == nullptr ||
                                     it->second->pinning()->pinned());
  }
  if (observer) observer(name, serving);
}

namespace {

// What an ALREADY_EXISTS of CreatePool says about the fields that differ:
// " with a different spec (existing -> asked: layout: LAYOUT_PAGE_FIRST ->
// LAYOUT_LAYER_FIRST; ...); delete it first (...) or pick another name".
std::string SpecDifference(const v1::PoolSpec& existing, const v1::PoolSpec& asked) {
  std::string report;
  {
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&report);  // written out when `differ` ends
    differ.Compare(existing, asked);
  }
  // report: one line per field, "modified: geometry.mha.num_layers: 4 -> 2".
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin < report.size()) {
    size_t end = report.find('\n', begin);
    if (end == std::string::npos) end = report.size();
    std::string line = report.substr(begin, end - begin);
    begin = end + 1;
    for (const char* kind : {"modified: ", "added: ", "deleted: "}) {
      if (absl::StartsWith(line, kind)) line = line.substr(std::strlen(kind));
    }
    if (!line.empty()) parts.push_back(line);
  }
  return absl::StrCat(" with a different spec (existing -> asked: ",
                      absl::StrJoin(parts, "; "), "); delete it first (hostkv "
                      "delete-pool ", asked.name(), ", as its owner or root) or "
                      "pick another name");
}

}  // namespace

absl::StatusOr<std::shared_ptr<HostPool>> PoolRegistry::Create(
    const v1::PoolSpec& spec, bool attach_if_exists, const v1::PoolOwner& owner,
    const Principal& who) {
  ASSIGN_OR_RETURN(const PoolGeometry geometry, ResolvePoolSpec(spec));
  absl::MutexLock create_lock(&create_mu_);
  if (absl::StatusOr<std::shared_ptr<HostPool>> existing = Get(spec.name());
      existing.ok()) {
    const bool same = google::protobuf::util::MessageDifferencer::Equals(
        (*existing)->info().spec(), NormalizePoolSpec(spec));
    if (attach_if_exists && same) {
      RETURN_IF_ERROR(CheckPoolUse(spec.name(), (*existing)->owner(), who));
      return *existing;
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "pool '", spec.name(), "' already exists",
        same ? "" : SpecDifference((*existing)->info().spec(), NormalizePoolSpec(spec))));
  }
  RETURN_IF_ERROR(CheckReservedName("pool", spec.name(), who));
  HugePageMode huge_mode = fill_.hugepages;
  if (!spec.hugepages().empty()) {
    ASSIGN_OR_RETURN(huge_mode, ParseHugePageMode(spec.hugepages()));
  }
  PoolFillOptions fill = fill_;
  if (!spec.numa_node().empty()) {
    ASSIGN_OR_RETURN(const NumaRequest numa, ParseNumaRequest(spec.numa_node()));
    if (!numa.automatic) {  // auto: the daemon's choice (the GPU's node)
      ASSIGN_OR_RETURN(fill.numa_node, ChooseNumaNode(numa, fill_.sysfs_root, ""));
    }
  }
  HugePageSystem system = ReadHugePageSystem(fill_.sysfs_root);
  ASSIGN_OR_RETURN(HugePagePlan huge,
                   PlanHugePages(huge_mode, geometry.total_bytes(), system));
  const std::string what = absl::StrCat("pool '", spec.name(), "'");
  RETURN_IF_ERROR(CheckQuota(owner, geometry.total_bytes()));
  RETURN_IF_ERROR(budget_->Reserve(what, geometry.total_bytes()));
  BudgetReservation reservation(budget_, geometry.total_bytes());
  const absl::Time start = absl::Now();
  const std::string label =
      absl::StrCat(absl::StripPrefix(segment_prefix_, "/"), "pool.", spec.name());
  absl::StatusOr<std::unique_ptr<HostPool>> created = HostPool::Create(
      spec, geometry, label, fill, std::move(reservation), cache_options_, huge);
  if (!created.ok() && huge_mode == HugePageMode::kAuto && huge.memfd_flags != 0) {
    // The hugetlb pages went to someone else meanwhile: auto falls back.
    spdlog::warn("pool '{}': no hugetlb pages after all ({}); 4 KiB pages or THP",
                 spec.name(), std::string(created.status().message()));
    system.free_2m = system.free_1g = 0;
    ASSIGN_OR_RETURN(huge, PlanHugePages(huge_mode, geometry.total_bytes(), system));
    // The failed creation gave its reservation back.
    RETURN_IF_ERROR(budget_->Reserve(what, geometry.total_bytes()));
    created = HostPool::Create(
        spec, geometry, label, fill,
        BudgetReservation(budget_, geometry.total_bytes()), cache_options_, huge);
  }
  if (!created.ok()) return created.status();
  std::unique_ptr<HostPool> pool = *std::move(created);
  spdlog::info(
      "pool '{}' created for {}: {} {} page_size={} token_slots={} pages={} "
      "bytes={} ({}) segment={} in {}",
      spec.name(),
      owner.daemon() ? std::string("the daemon")
      : owner.unverified() ? std::string("an unverified session")
                           : absl::StrCat("uid ", owner.uid()),
      spec.geometry().has_blocks()            ? "blocks"
      : geometry.attention == Attention::kMha ? "MHA"
                                              : "MLA",
      HostLayoutName(geometry.layout), geometry.page_size, geometry.token_slots,
      geometry.num_pages(), geometry.total_bytes(),
      FormatBytes(geometry.total_bytes()), pool->info().segment_name(),
      absl::FormatDuration(absl::Now() - start));
  return Publish(std::move(pool), owner);
}

absl::StatusOr<std::shared_ptr<HostPool>> PoolRegistry::Publish(
    std::unique_ptr<HostPool> pool, const v1::PoolOwner& owner) {
  const v1::PoolSpec& spec = pool->info().spec();
  const std::string what = absl::StrCat("pool '", spec.name(), "'");
  // The page cache's metadata, as if every page were cached.
  const uint64_t cache_bytes = pool->cache().MaxMemoryBytes();
  RETURN_IF_ERROR(budget_->Reserve(absl::StrCat(what, "'s page cache index"),
                                   cache_bytes));
  pool->set_cache_reservation(BudgetReservation(budget_, cache_bytes));
  // References on cached pages are heap as they come: charged as they do.
  MemoryBudget* budget = budget_;
  const std::string refs_of =
      absl::StrCat("references on cached pages of pool '", spec.name(), "'");
  pool->cache().set_reference_charge(PageCache::ReferenceCharge{
      [budget, refs_of](uint64_t bytes) { return budget->Reserve(refs_of, bytes); },
      [budget](uint64_t bytes) { budget->Release(bytes); }});
  if (keeper_ != nullptr) {
    const uint64_t num_pages = pool->geometry().num_pages();
    const uint64_t ledger_bytes = PoolLedger::BytesFor(num_pages);
    RETURN_IF_ERROR(budget_->Reserve(absl::StrCat(what, "'s ledger"), ledger_bytes));
    pool->set_ledger_reservation(BudgetReservation(budget_, ledger_bytes));
    if (pool->ledger() == nullptr) {
      ASSIGN_OR_RETURN(std::unique_ptr<PoolLedger> ledger,
                       PoolLedger::Create(spec, owner, num_pages));
      pool->set_ledger(std::move(ledger));
    }
  }
  pool->set_owner(owner);
  if (gpu_ != nullptr) {
    // NOT_SERVING until pinned; `done` runs on the pinning thread, which
    // the pool joins before it goes away.
    // The pinning thread waits for the fill; the pool stops its fill
    // before it destroys the pinning, so `filled` outlives every call.
    const HostPool* filled = pool.get();
    pool->set_pinning(gpu_->StartPinning(
        spec.name(), pool->base(), pool->geometry().total_bytes(),
        pool->geometry().page_bytes(),
        [filled] { return filled->WaitFilled(); },
        [this, name = spec.name()](bool) { Notify(name); }));
  }
  std::shared_ptr<HostPool> shared = std::move(pool);
  {
    absl::MutexLock keep_lock(&keep_mu_);
    if (keeper_ != nullptr) {
      RETURN_IF_ERROR(keeper_->Deposit(PoolSegmentKeepName(spec.name()),
                                       shared->segment_fd()));
      RETURN_IF_ERROR(keeper_->Deposit(PoolLedgerKeepName(spec.name()),
                                       shared->ledger()->fd()));
    }
    absl::MutexLock lock(&mu_);
    pools_[spec.name()] = shared;
  }
  Notify(spec.name());
  return shared;
}

absl::StatusOr<std::shared_ptr<HostPool>> PoolRegistry::Get(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (name.empty()) return absl::InvalidArgumentError("pool is required (a pool's name)");
  auto it = pools_.find(name);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("no pool named '", name, "'"));
  }
  return it->second;
}

std::vector<std::shared_ptr<HostPool>> PoolRegistry::List() const {
  std::vector<std::shared_ptr<HostPool>> pools;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, pool] : pools_) pools.push_back(pool);
  }
  std::sort(pools.begin(), pools.end(),
            [](const auto& a, const auto& b) { return a->name() < b->name(); });
  return pools;
}

void PoolRegistry::SetObserver(Observer observer) {
  {
    // Under notify_mu_: no call of the old observer is in progress after.
    absl::MutexLock notify_lock(&notify_mu_);
    absl::MutexLock lock(&mu_);
    observer_ = std::move(observer);
  }
  for (const std::shared_ptr<HostPool>& pool : List()) Notify(pool->name());
}

absl::Status PoolRegistry::Delete(const std::string& name,
                                  const Principal& who) {
  std::shared_ptr<HostPool> deleted;
  {
    // Erased and let go of by the keeper before a pool of the same name can
    // deposit its own descriptors under the same names (Publish).
    absl::MutexLock keep_lock(&keep_mu_);
    {
      absl::MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(deleted, DeleteLocked(name, who));
    }
    if (keeper_ != nullptr) {
      absl::Status a = keeper_->Remove(PoolSegmentKeepName(name));
      absl::Status b = keeper_->Remove(PoolLedgerKeepName(name));
      if (!a.ok() || !b.ok()) {
        spdlog::warn("pool '{}': the state keeper did not let go of it: {}",
                     name, std::string((a.ok() ? b : a).message()));
      }
    }
  }
  // Destroyed out of the locks: it joins its pinning thread, which may be
  // in Notify.
  deleted.reset();
  Notify(name);
  spdlog::info("pool '{}' deleted", name);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<HostPool>> PoolRegistry::DeleteLocked(
    const std::string& name, const Principal& who) {
  if (name.empty()) return absl::InvalidArgumentError("pool is required (a pool's name)");
  auto it = pools_.find(name);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("no pool named '", name, "'"));
  }
  HostPool& pool = *it->second;
  RETURN_IF_ERROR(CheckPoolAdmin(name, pool.owner(), who));
  // Cached pages no session references go with the pool.
  const SlotAllocator::Occupancy occupancy = pool.allocator().Snapshot();
  const uint64_t used =
      pool.allocator().num_pages() - occupancy.free_pages - occupancy.cached_pages;
  // The digest thread's hold on the page it reads is no use of the pool
  // (its job keeps the pool's memory mapped until it is done).
  const uint64_t referenced = pool.cache().PagesReferencedBeyond(kCacheOwner);
  if (used != 0 || referenced != 0 || pool.imports().load() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool '", name, "' is in use: ", used, " pages allocated, ",
        referenced, " cached pages referenced, ", pool.imports().load(),
        " device-buffer registrations"));
  }
  if (occupancy.cached_pages != 0) {
    spdlog::info("pool '{}': its {} cached pages go with it", name,
                 occupancy.cached_pages);
  }
  std::shared_ptr<HostPool> deleted = std::move(it->second);
  pools_.erase(it);
  return deleted;
}

}  // namespace hostkv
