#include "server/tier/file_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/contract/status_macros.h"  // header only
#include "spdlog/spdlog.h"

namespace hostkv {
namespace {

// What the tier makes: the daemon's alone (server/README.md, "Trust model").
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0600;

// Closes its descriptor. (proto/contract's ScopedFd is the same, but its
// library brings gRPC with it; a tier needs none.)
class FdOwner {
 public:
  FdOwner() = default;
  explicit FdOwner(int fd) : fd_(fd) {}
  ~FdOwner() { Reset(); }
  FdOwner(FdOwner&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FdOwner& operator=(FdOwner&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes now; returns close(2)'s errno, 0 on success.
  int Close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r == 0 ? 0 : errno;
  }

 private:
  int fd_ = -1;
};

// errno -> a status naming the call and the path. A store that is full,
// failing or refusing is Unavailable (the cache treats it as a miss or a
// failed write); what can only be a bug here is Internal; a symbolic link
// below the root (ELOOP from O_NOFOLLOW, or OpenDirAt) is a tree someone
// tampered with: DataLoss (Put makes it Unavailable).
absl::Status ErrnoStatus(int err, absl::string_view call,
                         const std::string& path) {
  if (err == ELOOP) {
    return absl::DataLossError(absl::StrFormat(
        "file tier: %s %s: a symbolic link (never followed below the root)",
        call, path));
  }
  const std::string message =
      absl::StrFormat("file tier: %s %s: %s", call, path, std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    case EBADF:
    case EFAULT:
    case EINVAL:
      return absl::InternalError(message);
    default:
      return absl::UnavailableError(message);
  }
}

absl::Status CheckName(const TierKey& key) {
  if (key.name_space.size() > kFileTierMaxNameBytes ||
      key.key.size() > kFileTierMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "file tier: namespace (%d bytes) or key (%d bytes) longer than %d",
        key.name_space.size(), key.key.size(), kFileTierMaxNameBytes));
  }
  return absl::OkStatus();
}

// Refuses a root that group or others can write: they could put a
// directory of their own, or a symbolic link, where a namespace goes, and
// read or forge the pages written there. Warns about one they can list
// (every namespace's name shows) and one another user owns (its owner may
// change its mode at any time).
absl::Status CheckRootMode(const std::string& root, const struct stat& st) {
  const unsigned mode = st.st_mode & 07777;
  if ((mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "file tier: root %s has mode 0%o: group or others can write it, and "
        "so replace any tenant's directory in it; make it the daemon's "
        "alone: chmod 0700 %s",
        root, mode, root));
  }
  if ((mode & (S_IRGRP | S_IXGRP | S_IROTH | S_IXOTH)) != 0) {
    spdlog::warn(
        "file tier: root {} has mode 0{:o}: group or others can list it and "
        "see every namespace's name (what the tier writes is 0700/0600; "
        "files written by an older hostkvd may be readable); chmod 0700 {}",
        root, mode, root);
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    spdlog::warn(
        "file tier: root {} belongs to uid {}, not to this daemon (uid {}): "
        "its owner can change its mode and replace what is in it; chown it "
        "to the daemon's user",
        root, st.st_uid, me);
  }
  return absl::OkStatus();
}

struct ValuePath {
  std::string ns_name;    // ns-<hex>
  std::string fan_name;   // <2 hex>
  std::string file_name;  // k-<hex>
  // The same as paths, for messages.
  std::string ns_dir;   // <root>/ns-<hex>
  std::string fan_dir;  // <ns_dir>/<2 hex>
  std::string file;     // <fan_dir>/k-<hex>
};

ValuePath PathsOf(const std::string& root, const TierKey& key) {
  const std::string key_hex = absl::BytesToHexString(key.key);
  ValuePath p;
  p.ns_name = absl::StrCat("ns-", absl::BytesToHexString(key.name_space));
  p.fan_name = key_hex.empty() ? "__" : key_hex.substr(0, 2);
  p.file_name = absl::StrCat("k-", key_hex);
  p.ns_dir = absl::StrCat(root, "/", p.ns_name);
  p.fan_dir = absl::StrCat(p.ns_dir, "/", p.fan_name);
  p.file = absl::StrCat(p.fan_dir, "/", p.file_name);
  return p;
}

// Opens directory `name` of `dir_fd`, never through a symbolic link:
// returns the descriptor, or -1 with errno (ELOOP for a symbolic link,
// ENOTDIR for another non-directory).
int OpenDirAt(int dir_fd, const char* name) {
  const int fd =
      ::openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 || errno != ENOTDIR) return fd;
  // O_DIRECTORY | O_NOFOLLOW answers ENOTDIR for a symbolic link too.
  struct stat st;
  const bool link = ::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                    S_ISLNK(st.st_mode);
  errno = link ? ELOOP : ENOTDIR;
  return -1;
}

// Opens directory `name` of `parent_fd` (`path` in messages); with
// `create`, makes it first if it is not there (exactly 0700, whatever the
// umask) and sets `*made`.
absl::StatusOr<FdOwner> OpenDir(int parent_fd, const std::string& name,
                                const std::string& path, bool create,
                                bool* made) {
  *made = false;
  if (create) {
    if (::mkdirat(parent_fd, name.c_str(), kDirMode) == 0) {
      *made = true;
    } else if (errno != EEXIST) {
      return ErrnoStatus(errno, "mkdir", path);
    }
  }
  int fd = OpenDirAt(parent_fd, name.c_str());
  if (fd < 0 && errno == EACCES && *made) {
    // The umask took our own read or search bit (umask 0777): put them
    // back, through no symbolic link, and open again.
    if (::fchmodat(parent_fd, name.c_str(), kDirMode, AT_SYMLINK_NOFOLLOW) !=
        0) {
      return ErrnoStatus(errno, "chmod", path);
    }
    fd = OpenDirAt(parent_fd, name.c_str());
  }
  if (fd < 0) return ErrnoStatus(errno, "open", path);
  FdOwner dir(fd);
  if (*made && ::fchmod(dir.get(), kDirMode) != 0) {
    return ErrnoStatus(errno, "fchmod", path);
  }
  return dir;
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

// The directories one Put batch changed, each once (by path), with a
// descriptor of their own to fsync, and the items each one makes durable.
class FileTier::ChangedDirs {
 public:
  // Records that item `item` changed directory `path`, open as `fd` (which
  // is duplicated, not kept).
  absl::Status Add(size_t item, const std::string& path, int fd) {
    auto it = dirs_.find(path);
    if (it == dirs_.end()) {
      const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (copy < 0) return ErrnoStatus(errno, "dup", path);
      it = dirs_.emplace(path, Dir{FdOwner(copy), {}}).first;
    }
    it->second.items.push_back(item);
    return absl::OkStatus();
  }

  // fsyncs each directory; an item still OK takes the first error of its
  // directories.
  void SyncInto(std::vector<absl::Status>& statuses) {
    for (auto& [path, dir] : dirs_) {
      if (::fsync(dir.fd.get()) == 0) continue;
      const absl::Status s = ErrnoStatus(errno, "fsync", path);
      for (size_t item : dir.items) {
        if (statuses[item].ok()) statuses[item] = s;
      }
    }
  }

 private:
  struct Dir {
    FdOwner fd;
    std::vector<size_t> items;
  };
  std::map<std::string, Dir> dirs_;
};

// The walk from the root to a key's fan directory, one openat per step
// that never follows a symbolic link. Keeps the last namespace and fan
// directory open for the next key of the same call. One per call.
class FileTier::DirCursor {
 public:
  DirCursor(int root_fd, const std::string& root)
      : root_fd_(root_fd), root_(root.empty() ? "/" : root) {}

  // The descriptor of p's fan directory (valid until the next call), or the
  // error of the step that failed: NotFound for a missing directory,
  // DataLoss for a symbolic link. With `create`, makes missing directories;
  // with `changed`, records the directories item `item` depends on.
  absl::StatusOr<int> Fan(const ValuePath& p, bool create, ChangedDirs* changed,
                          size_t item) {
    if (!ns_fd_.valid() || ns_name_ != p.ns_name) {
      fan_fd_.Reset();
      bool made;
      ASSIGN_OR_RETURN(ns_fd_,
                       OpenDir(root_fd_, p.ns_name, p.ns_dir, create, &made));
      ns_name_ = p.ns_name;
      ns_made_ = made;
    }
    if (!fan_fd_.valid() || fan_name_ != p.fan_name) {
      bool made;
      ASSIGN_OR_RETURN(
          fan_fd_, OpenDir(ns_fd_.get(), p.fan_name, p.fan_dir, create, &made));
      fan_name_ = p.fan_name;
      fan_made_ = made;
    }
    if (changed != nullptr && ns_made_) {
      RETURN_IF_ERROR(changed->Add(item, root_, root_fd_));
    }
    if (changed != nullptr && fan_made_) {
      RETURN_IF_ERROR(changed->Add(item, p.ns_dir, ns_fd_.get()));
    }
    return fan_fd_.get();
  }

 private:
  const int root_fd_;
  const std::string root_;
  std::string ns_name_, fan_name_;  // what ns_fd_, fan_fd_ are, when valid
  FdOwner ns_fd_, fan_fd_;
  bool ns_made_ = false, fan_made_ = false;  // by this cursor
};

absl::StatusOr<std::unique_ptr<FileTier>> FileTier::Open(
    const std::string& root_dir, FileTierOptions options) {
  if (root_dir.empty()) {
    return absl::InvalidArgumentError("file tier: empty root directory");
  }
  // The root's own name is the operator's: a symbolic link there is
  // followed, once.
  FdOwner fd(::open(root_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrFormat("file tier: root %s is not a directory", root_dir));
    }
    const std::string message =
        absl::StrFormat("file tier: root %s: %s", root_dir, std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    return absl::FailedPreconditionError(message);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "file tier: root %s: fstat: %s", root_dir, std::strerror(errno)));
  }
  if (::faccessat(fd.get(), ".", R_OK | W_OK | X_OK, 0) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "file tier: root %s: this process may not read, write and search it "
        "(%s)",
        root_dir, std::strerror(errno)));
  }
  RETURN_IF_ERROR(CheckRootMode(root_dir, st));
  std::string root = root_dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root == "/") root.clear();  // paths are root_ + "/ns-..."
  return std::unique_ptr<FileTier>(
      new FileTier(std::move(root), fd.Release(), options));
}

FileTier::FileTier(std::string root, int root_fd, FileTierOptions options)
    : root_(std::move(root)),
      root_fd_(root_fd),
      options_(options),
      nonce_((static_cast<uint64_t>(std::random_device{}()) << 32) ^
             std::random_device{}()) {}

FileTier::~FileTier() { ::close(root_fd_); }

std::string FileTier::Describe() const {
  return absl::StrCat("file:", root_.empty() ? "/" : root_);
}

std::string FileTier::PathOf(const TierKey& key) const {
  return PathsOf(root_, key).file;
}

std::string FileTier::TempName() {
  return absl::StrFormat(".tmp-%d-%d-%016x-%d", ::getpid(), ::gettid(), nonce_,
                         temp_counter_.fetch_add(1, std::memory_order_relaxed));
}

absl::Status FileTier::PutOne(DirCursor& dirs, ChangedDirs* changed,
                              size_t item, const TierKey& key,
                              absl::string_view value) {
  absl::Status s = WriteValue(dirs, changed, item, key, value);
  // A directory that vanished (the root removed, a name taken by a file or
  // a symbolic link) is a store that cannot take the value, not a missing
  // key.
  if (absl::IsNotFound(s) || absl::IsDataLoss(s)) {
    return absl::UnavailableError(s.message());
  }
  return s;
}

absl::Status FileTier::WriteValue(DirCursor& dirs, ChangedDirs* changed,
                                  size_t item, const TierKey& key,
                                  absl::string_view value) {
  RETURN_IF_ERROR(CheckName(key));
  const ValuePath p = PathsOf(root_, key);
  ASSIGN_OR_RETURN(const int fan, dirs.Fan(p, /*create=*/true, changed, item));
  const std::string temp_name = TempName();
  const std::string temp = absl::StrCat(p.fan_dir, "/", temp_name);
  FdOwner fd(::openat(fan, temp_name.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      kFileMode));
  if (!fd.valid()) return ErrnoStatus(errno, "open", temp);
  absl::Status s;
  // Exactly 0600, whatever the umask took.
  if (::fchmod(fd.get(), kFileMode) != 0)
    s = ErrnoStatus(errno, "fchmod", temp);
  if (s.ok()) s = WriteAll(fd.get(), value, temp);
  if (s.ok() && options_.fsync && ::fdatasync(fd.get()) != 0) {
    s = ErrnoStatus(errno, "fdatasync", temp);
  }
  if (const int err = fd.Close(); s.ok() && err != 0) {
    s = ErrnoStatus(err, "close", temp);
  }
  // renameat replaces a symbolic link at the final name; it follows none.
  if (s.ok() &&
      ::renameat(fan, temp_name.c_str(), fan, p.file_name.c_str()) != 0) {
    s = ErrnoStatus(errno, "rename", p.file);
  }
  if (!s.ok()) {
    ::unlinkat(fan, temp_name.c_str(), 0);
    return s;
  }
  if (changed != nullptr) return changed->Add(item, p.fan_dir, fan);
  return absl::OkStatus();
}

std::vector<absl::Status> FileTier::Put(
    absl::Span<const TierKey> keys,
    absl::Span<const absl::string_view> values) {
  std::vector<absl::Status> statuses(keys.size());
  if (keys.size() != values.size()) {
    statuses.assign(keys.size(), absl::InvalidArgumentError(absl::StrFormat(
                                     "file tier: %d keys, %d values",
                                     keys.size(), values.size())));
    return statuses;
  }
  DirCursor dirs(root_fd_, root_);
  ChangedDirs changed;
  ChangedDirs* to_sync = options_.fsync ? &changed : nullptr;
  for (size_t i = 0; i < keys.size(); ++i) {
    statuses[i] = PutOne(dirs, to_sync, i, keys[i], values[i]);
  }
  // Each changed directory once; an item is durable when all of its are.
  changed.SyncInto(statuses);
  return statuses;
}

absl::StatusOr<std::string> FileTier::GetOne(DirCursor& dirs,
                                             const TierKey& key) const {
  RETURN_IF_ERROR(CheckName(key));
  const ValuePath p = PathsOf(root_, key);
  ASSIGN_OR_RETURN(const int fan, dirs.Fan(p, /*create=*/false, nullptr, 0));
  // O_NONBLOCK: a FIFO in the value's place cannot block the open.
  FdOwner fd(::openat(fan, p.file_name.c_str(),
                      O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "open", p.file);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", p.file);
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(
        absl::StrFormat("file tier: %s is not a regular file", p.file));
  }
  // Blocking reads again (O_NONBLOCK means nothing to a local regular
  // file; a FUSE filesystem might still honour it).
  if (::fcntl(fd.get(), F_SETFL, 0) != 0) {
    return ErrnoStatus(errno, "fcntl", p.file);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > options_.max_value_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "file tier: %s is %d bytes, more than the %d a value may be", p.file,
        size, options_.max_value_bytes));
  }
  std::string value(size, '\0');
  size_t done = 0;
  while (done < value.size()) {
    const ssize_t n = ::pread(fd.get(), value.data() + done,
                              value.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", p.file);
    }
    if (n == 0) break;  // shorter than fstat said: the frame check decides
    done += static_cast<size_t>(n);
  }
  value.resize(done);
  return value;
}

std::vector<absl::StatusOr<std::string>> FileTier::Get(
    absl::Span<const TierKey> keys) {
  DirCursor dirs(root_fd_, root_);
  std::vector<absl::StatusOr<std::string>> values;
  values.reserve(keys.size());
  for (const TierKey& key : keys) values.push_back(GetOne(dirs, key));
  return values;
}

absl::StatusOr<uint64_t> FileTier::CountPrefix(absl::Span<const TierKey> keys) {
  DirCursor dirs(root_fd_, root_);
  uint64_t count = 0;
  for (const TierKey& key : keys) {
    RETURN_IF_ERROR(CheckName(key));
    const ValuePath p = PathsOf(root_, key);
    absl::StatusOr<int> fan = dirs.Fan(p, /*create=*/false, nullptr, 0);
    // A missing directory, or a symbolic link: no value here.
    if (absl::IsNotFound(fan.status()) || absl::IsDataLoss(fan.status())) {
      break;
    }
    if (!fan.ok()) return fan.status();
    struct stat st;
    if (::fstatat(*fan, p.file_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) break;
      return ErrnoStatus(errno, "stat", p.file);
    }
    if (!S_ISREG(st.st_mode)) break;
    ++count;
  }
  return count;
}

absl::Status FileTier::Delete(absl::Span<const TierKey> keys) {
  DirCursor dirs(root_fd_, root_);
  absl::Status first_error;
  for (const TierKey& key : keys) {
    absl::Status s = CheckName(key);
    if (s.ok()) {
      const ValuePath p = PathsOf(root_, key);
      absl::StatusOr<int> fan = dirs.Fan(p, /*create=*/false, nullptr, 0);
      if (fan.ok()) {
        if (::unlinkat(*fan, p.file_name.c_str(), 0) != 0 && errno != ENOENT) {
          s = ErrnoStatus(errno, "unlink", p.file);
        }
      } else if (!absl::IsNotFound(fan.status())) {
        s = fan.status();  // absent directories hold nothing to delete
      }
    }
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

}  // namespace hostkv
