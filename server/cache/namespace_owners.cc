#include "server/cache/namespace_owners.h"

#include "absl/strings/strip.h"
#include "server/pool/pool_access.h"
#include "server/pool/reserved_names.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "proto/contract/status_macros.h"

namespace hostkv {
namespace {

std::string Describe(const NamespaceOwner& owner) {
  return owner.unverified ? std::string("sessions without a session socket")
                          : absl::StrCat("uid ", owner.uid);
}

std::string Describe(const Principal& who) {
  return who.peer.has_value() ? absl::StrCat("uid ", who.peer->uid)
                              : std::string("a session without a session socket");
}

}  // namespace

absl::StatusOr<CacheSharing> ParseCacheSharing(absl::string_view text) {
  CacheSharing sharing;
  if (text == "owner") return sharing;
  if (text == "any") {
    sharing.kind = CacheSharing::Kind::kAny;
    return sharing;
  }
  uint32_t gid = 0;
  if (absl::ConsumePrefix(&text, "group:") && absl::SimpleAtoi(text, &gid)) {
    sharing.kind = CacheSharing::Kind::kGroup;
    sharing.gid = gid;
    return sharing;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--cache_share '", text, "' is not owner, any, or group:NAME"));
}

std::string CacheSharingName(const CacheSharing& sharing) {
  switch (sharing.kind) {
    case CacheSharing::Kind::kOwner:
      return "owner";
    case CacheSharing::Kind::kAny:
      return "any";
    case CacheSharing::Kind::kGroup:
      return absl::StrCat("group:", sharing.gid);
  }
  return "owner";
}

NamespaceOwners::NamespaceOwners(CacheSharing sharing, uint32_t max_per_uid)
    : sharing_(sharing), max_per_uid_(max_per_uid) {}

NamespaceOwner NamespaceOwners::OwnerFor(const Principal& who) {
  NamespaceOwner owner;
  owner.unverified = !who.peer.has_value();
  if (who.peer.has_value()) owner.uid = who.peer->uid;
  return owner;
}

uint64_t NamespaceOwners::OwnerKey(const NamespaceOwner& owner) {
  return owner.unverified ? uint64_t{1} << 32 : owner.uid;
}

absl::Status NamespaceOwners::CheckUseLocked(const std::string& pool,
                                             absl::string_view name_space,
                                             const NamespaceOwner& owner,
                                             const Principal& who) const {
  if (sharing_.kind == CacheSharing::Kind::kAny) return absl::OkStatus();
  if (owner.unverified) {
    if (!who.peer.has_value()) return absl::OkStatus();
  } else if (who.peer.has_value()) {
    if (who.peer->uid == owner.uid) return absl::OkStatus();
    if (sharing_.kind == CacheSharing::Kind::kGroup &&
        who.peer->InGroup(sharing_.gid)) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "cache namespace '", name_space, "' of pool '", pool, "' belongs to ",
      Describe(owner), " (its first publisher); ", Describe(who),
      " may not publish or look up in it (hostkvd --cache_share widens this)"));
}

absl::Status NamespaceOwners::NoteUseLocked(const std::string& pool,
                                            absl::string_view name_space,
                                            Claim& claim,
                                            const Principal& who) const {
  absl::Status allowed = CheckUseLocked(pool, name_space, claim.owner, who);
  // Only a use the claim allows keeps it: refused attempts of others would
  // otherwise keep the owner's share taken for ever.
  if (allowed.ok()) claim.last_use = ++uses_;
  return allowed;
}

absl::Status NamespaceOwners::ClaimOrCheck(const std::string& pool,
                                           absl::string_view name_space,
                                           const Principal& who) {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(name_space);
  if (it != owners_.end()) return NoteUseLocked(pool, name_space, it->second, who);
  RETURN_IF_ERROR(CheckReservedName(absl::StrCat("cache namespace of pool '", pool, "'"),
                                    name_space, who));
  const NamespaceOwner owner = OwnerFor(who);
  uint32_t& claimed = claimed_[OwnerKey(owner)];
  if (claimed >= max_per_uid_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Describe(owner), " already publishes in ", claimed,
        " cache namespaces (of all pools), the most "
        "--max_cache_namespaces_per_uid allows; pool '", pool,
        "' gets no new one"));
  }
  ++claimed;
  owners_.emplace(std::string(name_space), Claim{owner, ++uses_, 0});
  if (recorder_) recorder_(std::string(name_space), owner);
  return absl::OkStatus();
}

bool NamespaceOwners::Adopt(const std::string& name_space,
                            const NamespaceOwner& owner) {
  absl::MutexLock lock(&mu_);
  if (!owners_.emplace(name_space, Claim{owner, ++uses_, 0}).second) return false;
  ++claimed_[OwnerKey(owner)];
  if (recorder_) recorder_(name_space, owner);
  return true;
}

absl::Status NamespaceOwners::CheckUse(const std::string& pool,
                                       absl::string_view name_space,
                                       const Principal& who) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(name_space);
  if (it == owners_.end()) return absl::OkStatus();
  return NoteUseLocked(pool, name_space, it->second, who);
}

std::optional<NamespaceOwner> NamespaceOwners::OwnerOf(
    absl::string_view name_space) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(name_space);
  if (it == owners_.end()) return std::nullopt;
  return it->second.owner;
}

std::string NamespaceOwners::ScopeOf(const NamespaceOwner& owner) const {
  if (sharing_.kind == CacheSharing::Kind::kAny) return "any";
  return owner.unverified ? std::string("unverified")
                          : absl::StrCat("u", owner.uid);
}

std::string NamespaceOwners::TierScope(absl::string_view name_space,
                                       const Principal& claimant) const {
  std::optional<NamespaceOwner> owner = OwnerOf(name_space);
  return ScopeOf(owner.has_value() ? *owner : OwnerFor(claimant));
}

std::optional<std::string> NamespaceOwners::TierScopeOf(
    absl::string_view name_space) const {
  std::optional<NamespaceOwner> owner = OwnerOf(name_space);
  if (!owner.has_value()) return std::nullopt;
  return ScopeOf(*owner);
}

std::vector<std::string> NamespaceOwners::ReleaseUnused(const InUse& in_use) {
  struct Candidate {
    std::string name;
    NamespaceOwner owner;
    uint64_t last_use;
  };
  std::vector<Candidate> claims;
  {
    absl::MutexLock lock(&mu_);
    claims.reserve(owners_.size());
    for (const auto& [name, claim] : owners_) {
      claims.push_back(Candidate{name, claim.owner, claim.last_use});
    }
  }
  // Asked without the lock: in_use takes the pools' and sessions' locks.
  std::vector<bool> used(claims.size());
  for (size_t i = 0; i < claims.size(); ++i) {
    used[i] = in_use(claims[i].name, claims[i].owner);
  }
  std::vector<std::string> released;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < claims.size(); ++i) {
    const Candidate& c = claims[i];
    auto it = owners_.find(c.name);
    if (it == owners_.end()) continue;
    Claim& claim = it->second;
    if (used[i] || claim.last_use != c.last_use) {  // in use, or used meanwhile
      claim.unused_at = 0;
      continue;
    }
    if (claim.unused_at != claim.last_use + 1) {
      // First seen unused (with nothing since its last use): given back at
      // the next sweep if it stays so.
      claim.unused_at = claim.last_use + 1;
      continue;
    }
    auto count = claimed_.find(OwnerKey(claim.owner));
    if (count != claimed_.end() && --count->second == 0) claimed_.erase(count);
    if (releaser_) releaser_(c.name, claim.owner);
    owners_.erase(it);
    released.push_back(c.name);
  }
  return released;
}

size_t NamespaceOwners::size() const {
  absl::MutexLock lock(&mu_);
  return owners_.size();
}

}  // namespace hostkv
