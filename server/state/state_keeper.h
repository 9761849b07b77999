// The state keeper: a small process beside hostkvd that holds, while no
// daemon runs, the descriptors that make up the daemon's state (the pools'
// memfds, their ledgers, the daemon ledger). A memfd lives as long as
// someone holds it: the keeper is that someone across a crash, a kill -9 or
// a restart of hostkvd. hostkvd starts one if none answers on
// "<socket>.state" (or it runs as its own container: hostkvd
// --state_keeper), deposits each descriptor as it makes it and, when it
// starts, collects what a previous daemon left.
#ifndef HOSTKV_SERVER_STATE_STATE_KEEPER_H_
#define HOSTKV_SERVER_STATE_STATE_KEEPER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

// The daemon's connection to its keeper. Thread-safe.
class StateKeeper {
 public:
  // Connects to the keeper at `path`; with `spawn`, starts one (this
  // binary, detached, in its own session) if none answers. The keeper exits
  // once no daemon has been connected for `keep_for`.
  // `args` are passed to the keeper (logging flags).
  static absl::StatusOr<std::unique_ptr<StateKeeper>> Connect(
      const std::string& path, bool spawn, absl::Duration keep_for,
      const std::vector<std::string>& args = {});

  // Hands the keeper a duplicate of `fd` under `name` (replacing any
  // descriptor of that name).
  absl::Status Deposit(const std::string& name, int fd) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Remove(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // Everything the keeper holds, by name (it keeps holding them).
  absl::StatusOr<std::map<std::string, ScopedFd>> Collect()
      ABSL_LOCKS_EXCLUDED(mu_);
  // The keeper closes everything and exits; this connection is then dead.
  absl::Status Discard() ABSL_LOCKS_EXCLUDED(mu_);

  // The keeper process (SO_PEERCRED), for the operator's messages.
  pid_t pid() const { return pid_; }

 private:
  explicit StateKeeper(ScopedFd socket, pid_t pid)
      : socket_(std::move(socket)), pid_(pid) {}
  absl::Status Exchange(uint32_t kind, const std::string& name, int fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  ScopedFd socket_ ABSL_GUARDED_BY(mu_);
  const pid_t pid_;
};

// OK if the peer of `connection` (a connection to the keeper's socket
// `path`) runs as this process's uid or root; PermissionDenied naming the
// path, the peer's pid and uid otherwise.
absl::Status CheckKeeperPeer(int connection, const std::string& path);

// The keeper process's main: serves `path` until a daemon says kDiscard,
// the socket file is removed or replaced, or no daemon has been connected
// for `keep_for`. Returns the exit code.
int RunStateKeeper(const std::string& path, absl::Duration keep_for);

}  // namespace hostkv

#endif  // HOSTKV_SERVER_STATE_STATE_KEEPER_H_
