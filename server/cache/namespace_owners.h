// Who may publish and look up in the page cache's namespaces (README,
// "Trust model"). A cached page is served to every session that names its
// key, so a key is a claim about the bytes: a namespace belongs to the uid
// whose session first published in it, in any pool of the daemon (one
// NamespaceOwners per daemon), and only that uid may publish or look up
// there, unless the daemon shares namespaces with a group or with everyone
// (--cache_share). Root is no exception: a namespace another user claimed
// first would serve that user's bytes to a root engine.
#ifndef HOSTKV_SERVER_CACHE_NAMESPACE_OWNERS_H_
#define HOSTKV_SERVER_CACHE_NAMESPACE_OWNERS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace hostkv {

struct Principal;  // server/pool/pool_access.h (which needs this header's users)

// --cache_share: who besides a namespace's owner may use it.
struct CacheSharing {
  enum class Kind { kOwner, kGroup, kAny };
  Kind kind = Kind::kOwner;
  uint32_t gid = 0;  // kGroup: members of this group (by their peer's groups)
};

// "owner", "any", "group:GID" -> the sharing; InvalidArgument otherwise
// (main.cc resolves "group:NAME" to its gid first).
absl::StatusOr<CacheSharing> ParseCacheSharing(absl::string_view text);
std::string CacheSharingName(const CacheSharing& sharing);

// The first publisher of a namespace: an attached session's uid, or
// "unverified" (a session without a session socket, whose uid the daemon
// cannot know; such sessions share one owner, as they share pools).
struct NamespaceOwner {
  bool unverified = false;
  uint32_t uid = 0;
};

// Thread-safe.
class NamespaceOwners {
 public:
  // `max_per_uid`: namespaces one owner may claim in this daemon (a pool's
  // cache tells at most kMaxCacheNamespaces apart: no user may take them
  // all).
  NamespaceOwners(CacheSharing sharing, uint32_t max_per_uid);

  // For a publish: claims `name_space` for `who` if nobody owns it yet
  // (ResourceExhausted at who's limit), else CheckUse. `pool` names the
  // pool in errors.
  absl::Status ClaimOrCheck(const std::string& pool, absl::string_view name_space,
                            const Principal& who) ABSL_LOCKS_EXCLUDED(mu_);
  // For a lookup: OK if nobody owns it (nothing is cached there) or `who`
  // may use it (the owner, or as --cache_share says); else PermissionDenied
  // saying whose it is.
  absl::Status CheckUse(const std::string& pool, absl::string_view name_space,
                        const Principal& who) const ABSL_LOCKS_EXCLUDED(mu_);

  std::optional<NamespaceOwner> OwnerOf(absl::string_view name_space) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whose values a storage tier holds for `name_space` (tier_keys.h): its
  // owner's ("u<uid>", "unverified"), or, if nobody owns it yet, those of
  // `claimant`, who would own it by publishing; "any" when the daemon
  // shares every namespace with everyone (--cache_share=any). Tags never
  // contain ':'.
  std::string TierScope(absl::string_view name_space,
                        const Principal& claimant) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The scope of an owned namespace; nullopt if nobody owns it.
  std::optional<std::string> TierScopeOf(absl::string_view name_space) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Namespaces claimed.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // Called, with the lock held, for every claim from now on (e.g. to write
  // it to the daemon ledger). Set before the owners are shared.
  using ClaimRecorder =
      std::function<void(const std::string& name_space, const NamespaceOwner&)>;
  void set_recorder(ClaimRecorder recorder) { recorder_ = std::move(recorder); }
  // Called, with the lock held, for every claim given back (to erase it
  // from the daemon ledger).
  void set_releaser(ClaimRecorder releaser) { releaser_ = std::move(releaser); }

  // Gives back the claims nobody uses any more, so that their owners'
  // limits and the daemon ledger's slots are not taken for ever:
  // `in_use(name, owner)` says whether pages are cached in the namespace
  // (any pool) or its owner still has a session open. A claim is given
  // back when it is found unused at two calls in a row (the sweep's
  // period apart) with no publish or lookup in it by a user it allows
  // since (refused attempts do not keep it): a publish that
  // passed its check meanwhile has a session, or its pages are cached.
  // Its tier values stay under its owner's scope (tier_keys.h), so a next
  // owner of the name never reads them. Returns the names given back.
  using InUse =
      std::function<bool(const std::string& name_space, const NamespaceOwner&)>;
  std::vector<std::string> ReleaseUnused(const InUse& in_use)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Takes a claim a previous daemon made (its ledger), as if made here;
  // false if the namespace is owned already. Counts toward the owner's
  // limit, which it may exceed.
  bool Adopt(const std::string& name_space, const NamespaceOwner& owner)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status CheckUseLocked(const std::string& pool,
                              absl::string_view name_space,
                              const NamespaceOwner& owner,
                              const Principal& who) const;
  static NamespaceOwner OwnerFor(const Principal& who);
  std::string ScopeOf(const NamespaceOwner& owner) const;
  static uint64_t OwnerKey(const NamespaceOwner& owner);

  const CacheSharing sharing_;
  const uint32_t max_per_uid_;
  struct Claim {
    NamespaceOwner owner;
    uint64_t last_use = 0;   // uses_ at its last claim, publish or lookup
    uint64_t unused_at = 0;  // last_use + 1 once a sweep found it unused
  };
  // CheckUseLocked, noting an allowed use (ReleaseUnused keeps the claim).
  absl::Status NoteUseLocked(const std::string& pool, absl::string_view name_space,
                             Claim& claim, const Principal& who) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ClaimRecorder recorder_;
  ClaimRecorder releaser_;
  mutable absl::Mutex mu_;
  // Mutable: a lookup's check (const) notes the use.
  mutable absl::flat_hash_map<std::string, Claim> owners_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
  // Namespaces claimed per owner (OwnerKey).
  absl::flat_hash_map<uint64_t, uint32_t> claimed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_CACHE_NAMESPACE_OWNERS_H_
