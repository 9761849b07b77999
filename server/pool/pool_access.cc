#include "server/pool/pool_access.h"

#include "absl/strings/str_cat.h"

namespace hostkv {
namespace {

std::string Whose(const v1::PoolOwner& owner) {
  if (owner.unverified()) return "a session without a session socket";
  return absl::StrCat(owner.daemon() ? "the daemon (uid " : "uid ", owner.uid(),
                      owner.daemon() ? ")" : "", ", access ",
                      PoolAccessName(owner.access()));
}

}  // namespace

v1::PoolOwner OwnerFor(const Principal& who, v1::PoolAccess access) {
  v1::PoolOwner owner;
  owner.set_access(access);
  if (!who.peer.has_value()) {
    owner.set_unverified(true);
  } else {
    owner.set_uid(who.peer->uid);
    owner.set_gid(who.peer->gid);
  }
  return owner;
}

v1::PoolOwner DaemonOwner(uint32_t uid, uint32_t gid, v1::PoolAccess access) {
  v1::PoolOwner owner;
  owner.set_daemon(true);
  owner.set_uid(uid);
  owner.set_gid(gid);
  owner.set_access(access);
  return owner;
}

absl::Status CheckPoolUse(const std::string& name, const v1::PoolOwner& owner,
                          const Principal& who) {
  if (who.root() || owner.access() == v1::POOL_ACCESS_ANY) {
    return absl::OkStatus();
  }
  if (owner.unverified()) {
    if (!who.peer.has_value()) return absl::OkStatus();
  } else if (!who.peer.has_value()) {
    // A session without a socket passed the gRPC socket's permissions (or
    // the TCP token): the daemon's pools it may use unless they are the
    // daemon's uid's alone.
    if (owner.daemon() && owner.access() == v1::POOL_ACCESS_GROUP) {
      return absl::OkStatus();
    }
  } else {
    if (who.peer->uid == owner.uid()) return absl::OkStatus();
    if (owner.access() == v1::POOL_ACCESS_GROUP &&
        who.peer->InGroup(owner.gid())) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "pool '", name, "' belongs to ", Whose(owner), "; ",
      who.peer.has_value() ? absl::StrCat("uid ", who.peer->uid)
                           : std::string("a session without a session socket"),
      " may not use it"));
}

absl::Status CheckPoolAdmin(const std::string& name, const v1::PoolOwner& owner,
                            const Principal& who) {
  if (who.root()) return absl::OkStatus();
  if (owner.unverified()
          ? !who.peer.has_value()
          : who.peer.has_value() && who.peer->uid == owner.uid()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("pool '", name, "' belongs to ", Whose(owner),
                   ": only its owner or root may delete or redefine it"));
}

absl::StatusOr<v1::PoolAccess> ParsePoolAccess(const std::string& text) {
  if (text == "owner") return v1::POOL_ACCESS_OWNER;
  if (text == "group") return v1::POOL_ACCESS_GROUP;
  if (text == "any") return v1::POOL_ACCESS_ANY;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not one of owner, group, any"));
}

const char* PoolAccessName(v1::PoolAccess access) {
  switch (access) {
    case v1::POOL_ACCESS_GROUP:
      return "group";
    case v1::POOL_ACCESS_ANY:
      return "any";
    default:
      return "owner";
  }
}

}  // namespace hostkv
