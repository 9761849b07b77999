#include "server/operations/instance_lock.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto/contract/status_macros.h"

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

// The socket's directory, spelled without "." or empty components (so that
// O_NOFOLLOW applies to its last real component: "link/." or "link/" would
// follow the link), and its file name.
struct SocketPlace {
  std::string dir;
  std::string name;
};

SocketPlace SplitSocketPath(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  if (slash == std::string::npos) return {".", socket_path};
  std::vector<std::string> parts;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(socket_path).substr(0, slash), '/')) {
    if (!part.empty() && part != ".") parts.emplace_back(part);
  }
  const bool absolute = socket_path[0] == '/';
  std::string dir = absl::StrJoin(parts, "/");
  if (absolute) dir = "/" + dir;
  if (dir.empty()) dir = ".";
  return {dir, socket_path.substr(slash + 1)};
}

// Opens the socket directory itself (not a symlink to one) and checks that
// nobody but hostkvd (or root) can replace entries in it.
absl::StatusOr<ScopedFd> OpenSocketDir(const std::string& dir) {
  ScopedFd fd(open(dir.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (fd.get() < 0) {
    const int error = errno;
    if (lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "socket directory ", dir, " is a symbolic link: hostkvd does not follow "
          "one there (another user may have planted it); remove it or point "
          "--listen=unix:PATH at the real directory"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open socket directory ", dir, ": ", std::strerror(error)));
  }
  if (fstat(fd.get(), &st) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat ", dir, ": ", std::strerror(errno)));
  }
  const uid_t euid = geteuid();
  if (st.st_uid != euid && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory %s is owned by uid %d, not by hostkvd's uid %d or "
        "root: its owner could replace the socket; use a directory hostkvd "
        "owns (remove it and hostkvd creates it 0750) or chown it to uid %d",
        dir, st.st_uid, euid, euid));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "socket directory %s is writable by group or others (mode %04o) "
        "without the sticky bit: they could replace the socket or its lock "
        "file; run `chmod go-w %s` (or use a subdirectory hostkvd creates)",
        dir, st.st_mode & 07777, dir));
  }
  return fd;
}

// Creates or opens "<name>.lock" in the directory `dir_fd`, never through a
// symlink, and checks it is hostkvd's own regular file.
absl::StatusOr<ScopedFd> OpenLockFile(int dir_fd, const std::string& lock_path,
                                      const std::string& lock_name) {
  ScopedFd fd(openat(dir_fd, lock_name.c_str(),
                     O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600));
  if (fd.get() < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(
          lock_path, " is a symbolic link: hostkvd does not follow one there "
          "(another user may have planted it); remove it"));
    }
    const int error = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open ", lock_path, ": ", std::strerror(error),
        error == EACCES
            ? absl::StrFormat(" (the lock file or its directory belongs to "
                              "another user, e.g. a hostkvd run as root "
                              "before: run hostkvd as that user, chown them "
                              "to uid %d, or pick another --listen=unix:PATH)",
                              geteuid())
            : ""));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat ", lock_path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is %s owned by uid %d: hostkvd needs its own regular file there "
        "(uid %d); remove it",
        lock_path, S_ISREG(st.st_mode) ? "a file" : "not a regular file",
        st.st_uid, geteuid()));
  }
  return fd;
}

}  // namespace

absl::StatusOr<InstanceLock> InstanceLock::Acquire(
    const std::string& socket_path) {
  const SocketPlace place = SplitSocketPath(socket_path);
  RETURN_IF_ERROR(MakeDirs(place.dir));
  ASSIGN_OR_RETURN(ScopedFd dir_fd, OpenSocketDir(place.dir));
  const std::string lock_path = socket_path + ".lock";
  const std::string lock_name = place.name + ".lock";
  // A daemon that exits removes the file while holding it (~InstanceLock):
  // a lock taken on a file no longer at the path is taken again.
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(ScopedFd fd, OpenLockFile(dir_fd.get(), lock_path, lock_name));
    if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another hostkvd already serves ", socket_path, " (", lock_path,
          " is locked)"));
    }
    struct stat held, named;
    if (fstat(fd.get(), &held) == 0 &&
        fstatat(dir_fd.get(), lock_name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      return InstanceLock(std::move(dir_fd), lock_name, std::move(fd));
    }
    if (attempt == 100) {
      return absl::UnavailableError(absl::StrCat(
          lock_path, " keeps being replaced: is another hostkvd starting?"));
    }
  }
}

InstanceLock::~InstanceLock() {
  if (fd_.get() >= 0 && dir_fd_.get() >= 0) unlinkat(dir_fd_.get(), name_.c_str(), 0);
}

BoundPath IdentifyPath(const std::string& path) {
  BoundPath bound;
  bound.path = path;
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    bound.dev = st.st_dev;
    bound.ino = st.st_ino;
    bound.known = true;
  }
  return bound;
}

bool UnlinkIfStillOurs(const BoundPath& bound) {
  if (!bound.known) return false;
  const BoundPath now = IdentifyPath(bound.path);
  if (!now.known || now.dev != bound.dev || now.ino != bound.ino) return false;
  return unlink(bound.path.c_str()) == 0;
}

absl::Status SecureSocketPath(const std::string& path, mode_t mode, gid_t gid) {
  // An O_PATH descriptor of whatever is at `path` itself (a symlink is not
  // followed): the checks and the changes below then apply to that inode.
  ScopedFd fd(open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (fd.get() < 0 || fstat(fd.get(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is %s owned by uid %d, not the socket hostkvd (uid %d) just "
        "bound: something replaced it; check who can write to its directory",
        path,
        S_ISLNK(st.st_mode)    ? "a symbolic link"
        : S_ISSOCK(st.st_mode) ? "a socket"
                               : "a non-socket",
        st.st_uid, geteuid()));
  }
  // fchmod() does not work on an O_PATH descriptor (and on a socket's own fd
  // it changes the socket inode, not the path's), so chmod goes through the
  // descriptor's /proc link, which names exactly the inode checked above (as
  // glibc's fchmodat(AT_SYMLINK_NOFOLLOW) does). Without /proc, fall back to
  // chmod(path): between the check and the chmod, only someone who can write
  // to the socket's directory could swap the entry, and InstanceLock::Acquire
  // refused a directory others can write to (or one with the sticky bit,
  // where they cannot replace our entry).
  const std::string proc_path = absl::StrCat("/proc/self/fd/", fd.get());
  if (chmod(proc_path.c_str(), mode) != 0 &&
      (errno != ENOENT || chmod(path.c_str(), mode) != 0)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot set the mode of %s to %04o: %s", path, mode, std::strerror(errno)));
  }
  if (gid != static_cast<gid_t>(-1) &&
      fchownat(fd.get(), "", static_cast<uid_t>(-1), gid, AT_EMPTY_PATH) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot give %s to gid %d: %s (hostkvd must be a member of "
        "--socket_group)",
        path, gid, std::strerror(errno)));
  }
  return absl::OkStatus();
}

int ConnectWithin(int fd, const std::string& path, absl::Duration limit) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // connect(2) on a Unix socket waits for room in the backlog for as long
  // as SO_SNDTIMEO says; put back to "for ever" once connected.
  const timeval wait = absl::ToTimeval(limit);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait));
  const int result =
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int error = errno;
  const timeval forever{0, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &forever, sizeof(forever));
  errno = error;
  return result;
}

std::string SegmentPrefix(const std::string& socket_path) {
  if (socket_path.empty()) return absl::StrCat("/hostkv.p", getpid(), ".");
  std::string key = socket_path;
  const SocketPlace place = SplitSocketPath(socket_path);
  if (char* real = realpath(place.dir.c_str(), nullptr); real != nullptr) {
    key = absl::StrCat(std::string(real) == "/" ? "" : real, "/", place.name);
    free(real);
  }
  uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (const char c : key) {
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
