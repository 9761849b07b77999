#include "server/service/peer_connections.h"

#include <sys/stat.h>

#include <vector>

#include "absl/time/clock.h"
#include "server/operations/descriptor_shares.h"

namespace hostkv {

ino_t SocketInode(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

void PeerConnections::Forget(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  auto count = count_.find(it->second.uid);
  if (count != count_.end() && --count->second == 0) count_.erase(count);
  by_fd_.erase(it);
}

void PeerConnections::Recount(uid_t uid) {
  std::vector<int> closed;
  for (const auto& [fd, c] : by_fd_) {
    if (c.uid == uid && SocketInode(fd) != c.inode) closed.push_back(fd);
  }
  for (int fd : closed) Forget(fd);
}

void PeerConnections::RecountAll() {
  const absl::Time now = absl::Now();
  if (now - recounted_all_ < kRecountAllEvery) return;
  recounted_all_ = now;
  std::vector<int> closed;
  for (const auto& [fd, c] : by_fd_) {
    if (SocketInode(fd) != c.inode) closed.push_back(fd);
  }
  for (int fd : closed) Forget(fd);
}

uint32_t PeerConnections::CountOf(uid_t uid) const {
  auto it = count_.find(uid);
  return it == count_.end() ? 0 : it->second;
}

uint32_t PeerConnections::Open(uid_t uid) {
  Recount(uid);
  return CountOf(uid);
}

PeerConnections::Admission PeerConnections::Admit(uid_t uid, int fd) {
  const ino_t inode = SocketInode(fd);
  if (inode == 0) return Admission::kNotASocket;
  // A descriptor number accepted again was closed since: whoever it was
  // remembered for (any uid) has ended.
  Forget(fd);
  if (max_per_uid_ != 0 && CountOf(uid) >= max_per_uid_ &&
      Open(uid) >= max_per_uid_) {
    return Admission::kOverUidBound;
  }
  if (max_total_ != 0 &&
      !MayTakeShared(CountOf(uid), by_fd_.size(), max_total_)) {
    RecountAll();
    if (!MayTakeShared(CountOf(uid), by_fd_.size(), max_total_)) {
      return Admission::kOverTotal;
    }
  }
  by_fd_[fd] = Connection{uid, inode};
  ++count_[uid];
  return Admission::kAdmitted;
}

}  // namespace hostkv
