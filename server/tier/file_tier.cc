#include "server/tier/file_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hostkv {
namespace {

// Closes its descriptor. (proto/contract's ScopedFd is the same, but its
// library brings gRPC with it; a tier needs none.)
class FdOwner {
 public:
  explicit FdOwner(int fd) : fd_(fd) {}
  ~FdOwner() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdOwner(const FdOwner&) = delete;
  FdOwner& operator=(const FdOwner&) = delete;
  int get() const { return fd_; }
  // Closes now; returns close(2)'s errno, 0 on success.
  int Close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// errno -> a status naming the call and the path. A store that is full,
// failing or refusing is Unavailable (the cache treats it as a miss or a
// failed write); what can only be a bug here is Internal.
absl::Status ErrnoStatus(int err, absl::string_view call,
                         const std::string& path) {
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

struct ValuePath {
  std::string ns_dir;   // <root>/ns-<hex>
  std::string fan_dir;  // <ns_dir>/<2 hex>
  std::string file;     // <fan_dir>/k-<hex>
};

ValuePath PathsOf(const std::string& root, const TierKey& key) {
  const std::string key_hex = absl::BytesToHexString(key.key);
  ValuePath p;
  p.ns_dir = absl::StrCat(root, "/ns-", absl::BytesToHexString(key.name_space));
  p.fan_dir = absl::StrCat(p.ns_dir, "/",
                           key_hex.empty() ? "__" : key_hex.substr(0, 2));
  p.file = absl::StrCat(p.fan_dir, "/k-", key_hex);
  return p;
}

// Creates `dir` if it is not there; a new one changed `parent`.
absl::Status EnsureDir(const std::string& dir, const std::string& parent,
                       std::vector<std::string>* changed_dirs) {
  if (::mkdir(dir.c_str(), 0755) == 0) {
    changed_dirs->push_back(parent);
    return absl::OkStatus();
  }
  if (errno == EEXIST) return absl::OkStatus();
  return ErrnoStatus(errno, "mkdir", dir);
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

absl::Status FsyncDir(const std::string& dir) {
  FdOwner fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", dir);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync", dir);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileTier>> FileTier::Open(
    const std::string& root_dir, FileTierOptions options) {
  if (root_dir.empty()) {
    return absl::InvalidArgumentError("file tier: empty root directory");
  }
  struct stat st;
  if (::stat(root_dir.c_str(), &st) != 0) {
    const int err = errno;
    const std::string message =
        absl::StrFormat("file tier: root %s: %s", root_dir, std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    return absl::FailedPreconditionError(message);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("file tier: root %s is not a directory", root_dir));
  }
  if (::access(root_dir.c_str(), R_OK | W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "file tier: root %s: this process may not read, write and search it "
        "(%s)",
        root_dir, std::strerror(errno)));
  }
  std::string root = root_dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root == "/") root.clear();  // paths are root_ + "/ns-..."
  return std::unique_ptr<FileTier>(new FileTier(std::move(root), options));
}

FileTier::FileTier(std::string root, FileTierOptions options)
    : root_(std::move(root)),
      options_(options),
      nonce_((static_cast<uint64_t>(std::random_device{}()) << 32) ^
             std::random_device{}()) {}

std::string FileTier::Describe() const {
  return absl::StrCat("file:", root_.empty() ? "/" : root_);
}

std::string FileTier::PathOf(const TierKey& key) const {
  return PathsOf(root_, key).file;
}

std::string FileTier::TempPath(const std::string& dir) {
  return absl::StrFormat("%s/.tmp-%d-%d-%016x-%d", dir, ::getpid(), ::gettid(),
                         nonce_,
                         temp_counter_.fetch_add(1, std::memory_order_relaxed));
}

absl::Status FileTier::PutOne(const TierKey& key, absl::string_view value,
                              std::vector<std::string>* changed_dirs) {
  absl::Status s = WriteValue(key, value, changed_dirs);
  // A directory that vanished (the root removed, a name taken by a file) is
  // a store that cannot take the value, not a missing key.
  if (absl::IsNotFound(s)) return absl::UnavailableError(s.message());
  return s;
}

absl::Status FileTier::WriteValue(const TierKey& key, absl::string_view value,
                                  std::vector<std::string>* changed_dirs) {
  if (absl::Status s = CheckName(key); !s.ok()) return s;
  const ValuePath p = PathsOf(root_, key);
  if (absl::Status s =
          EnsureDir(p.ns_dir, root_.empty() ? "/" : root_, changed_dirs);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = EnsureDir(p.fan_dir, p.ns_dir, changed_dirs); !s.ok()) {
    return s;
  }
  const std::string temp = TempPath(p.fan_dir);
  FdOwner fd(
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", temp);
  absl::Status s = WriteAll(fd.get(), value, temp);
  if (s.ok() && options_.fsync && ::fdatasync(fd.get()) != 0) {
    s = ErrnoStatus(errno, "fdatasync", temp);
  }
  if (const int err = fd.Close(); s.ok() && err != 0) {
    s = ErrnoStatus(err, "close", temp);
  }
  if (s.ok() && ::rename(temp.c_str(), p.file.c_str()) != 0) {
    s = ErrnoStatus(errno, "rename", p.file);
  }
  if (!s.ok()) {
    ::unlink(temp.c_str());
    return s;
  }
  changed_dirs->push_back(p.fan_dir);
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
  std::vector<std::vector<std::string>> dirs_of(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    statuses[i] = PutOne(keys[i], values[i], &dirs_of[i]);
  }
  if (!options_.fsync) return statuses;
  // Each changed directory once; an item is durable when all of its are.
  std::vector<std::string> dirs;
  for (const auto& d : dirs_of) dirs.insert(dirs.end(), d.begin(), d.end());
  std::sort(dirs.begin(), dirs.end());
  dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
  for (const std::string& dir : dirs) {
    absl::Status s = FsyncDir(dir);
    if (s.ok()) continue;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (statuses[i].ok() && std::find(dirs_of[i].begin(), dirs_of[i].end(),
                                        dir) != dirs_of[i].end()) {
        statuses[i] = s;
      }
    }
  }
  return statuses;
}

absl::StatusOr<std::string> FileTier::GetOne(const TierKey& key) const {
  if (absl::Status s = CheckName(key); !s.ok()) return s;
  const std::string path = PathsOf(root_, key).file;
  FdOwner fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(
        absl::StrFormat("file tier: %s is not a regular file", path));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > options_.max_value_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "file tier: %s is %d bytes, more than the %d a value may be", path,
        size, options_.max_value_bytes));
  }
  std::string value(size, '\0');
  size_t done = 0;
  while (done < value.size()) {
    const ssize_t n = ::pread(fd.get(), value.data() + done,
                              value.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (n == 0) break;  // shorter than fstat said: the frame check decides
    done += static_cast<size_t>(n);
  }
  value.resize(done);
  return value;
}

std::vector<absl::StatusOr<std::string>> FileTier::Get(
    absl::Span<const TierKey> keys) {
  std::vector<absl::StatusOr<std::string>> values;
  values.reserve(keys.size());
  for (const TierKey& key : keys) values.push_back(GetOne(key));
  return values;
}

absl::StatusOr<uint64_t> FileTier::CountPrefix(absl::Span<const TierKey> keys) {
  uint64_t count = 0;
  for (const TierKey& key : keys) {
    if (absl::Status s = CheckName(key); !s.ok()) return s;
    const std::string path = PathsOf(root_, key).file;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) break;
      return ErrnoStatus(errno, "stat", path);
    }
    if (!S_ISREG(st.st_mode)) break;
    ++count;
  }
  return count;
}

absl::Status FileTier::Delete(absl::Span<const TierKey> keys) {
  absl::Status first_error;
  for (const TierKey& key : keys) {
    absl::Status s = CheckName(key);
    if (s.ok()) {
      const std::string path = PathsOf(root_, key).file;
      if (::unlink(path.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR) {
        s = ErrnoStatus(errno, "unlink", path);
      }
    }
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

}  // namespace hostkv
