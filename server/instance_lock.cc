#include "server/instance_lock.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace hostkv {
namespace {

absl::Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) return absl::OkStatus();
  const size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirs(dir.substr(0, slash)); !s.ok()) return s;
  }
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create socket directory ", dir, ": ", std::strerror(errno),
        " (choose another path with --listen=unix:PATH)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InstanceLock> InstanceLock::Acquire(
    const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  if (slash != std::string::npos) {
    if (absl::Status s = MakeDirs(socket_path.substr(0, slash)); !s.ok()) {
      return s;
    }
  }
  const std::string lock_path = socket_path + ".lock";
  ScopedFd fd(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another hostkvd already serves ", socket_path, " (", lock_path,
        " is locked)"));
  }
  return InstanceLock(std::move(fd));
}

std::string SegmentPrefix(const std::string& socket_path) {
  if (socket_path.empty()) return absl::StrCat("/hostkv.p", getpid(), ".");
  uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (const char c : socket_path) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  return absl::StrFormat("/hostkv.%016x.", hash);
}

namespace {

// True if "/<name>" is a segment of a dead daemon.
bool IsStale(const std::string& name, const std::string& own_prefix) {
  const std::string path = "/" + name;
  if (absl::StartsWith(path, own_prefix)) return true;
  const std::vector<std::string> parts = absl::StrSplit(name, absl::MaxSplits('.', 2));
  int pid = 0;
  if (parts.size() != 3 || parts[0] != "hostkv" || parts[1].size() < 2 ||
      parts[1][0] != 'p' || !absl::SimpleAtoi(parts[1].substr(1), &pid) ||
      pid <= 0) {
    return false;
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

int RemoveStaleSegments(const std::string& own_prefix) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* entry = readdir(dir)) {
    if (!IsStale(entry->d_name, own_prefix)) continue;
    if (shm_unlink(absl::StrCat("/", entry->d_name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace hostkv
