#include "server/operations/claim_sweeper.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// NamespaceOwner as a set key: uid, or one key for every unverified owner.
uint64_t OwnerKey(const NamespaceOwner& owner) {
  return owner.unverified ? (uint64_t{1} << 32) : owner.uid;
}

}  // namespace

uint64_t SweepNamespaceClaims(PoolRegistry& pools, const SessionRegistry& sessions) {
  absl::flat_hash_set<std::string> cached;
  for (const auto& pool : pools.List()) {
    for (const NamespaceCounters& ns : pool->cache().Stats().namespaces) {
      if (ns.counters.cached > 0) cached.insert(ns.name);
    }
  }
  absl::flat_hash_set<uint64_t> with_sessions;
  for (const auto& session : sessions.List()) {
    const std::optional<PeerCredentials> peer = session->peer();
    NamespaceOwner owner;
    owner.unverified = !peer.has_value();
    if (peer.has_value()) owner.uid = peer->uid;
    with_sessions.insert(OwnerKey(owner));
  }
  const std::vector<std::string> released = pools.namespaces().ReleaseUnused(
      [&](const std::string& name, const NamespaceOwner& owner) {
        return cached.contains(name) || with_sessions.contains(OwnerKey(owner));
      });
  for (const std::string& name : released) {
    spdlog::info("cache namespace '{}' given back: no page cached in it and "
                 "its owner has no session open",
                 name);
  }
  return released.size();
}

ClaimSweeper::ClaimSweeper(PoolRegistry* pools, const SessionRegistry* sessions,
                           absl::Duration period)
    : pools_(pools), sessions_(sessions), period_(period) {
  thread_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(period_)) {
      const uint64_t n = SweepNamespaceClaims(*pools_, *sessions_);
      absl::MutexLock lock(&mu_);
      released_ += n;
    }
  });
}

ClaimSweeper::~ClaimSweeper() {
  stop_.Notify();
  thread_.join();
}

uint64_t ClaimSweeper::released() const {
  absl::MutexLock lock(&mu_);
  return released_;
}

}  // namespace hostkv
