// The file tier: page values as files under one directory, on a local or
// distributed filesystem; every daemon (and restart) that opens the same
// directory sees the same pages.
//
// Layout (namespaces and keys are opaque bytes, so they are hex-encoded;
// hex has no '/', '.' or NUL, so no name can leave the root):
//
//   <root>/ns-<hex(namespace)>/<first 2 hex chars of the key, "__" for an
//       empty key>/k-<hex(key)>        one value, as Put was given it
//   .../.tmp-<pid>-<tid>-<nonce>-<n>    a Put in progress (or one that died)
//
// A Put writes a temp file in the value's own directory, fdatasyncs it (if
// options.fsync), renames it over the final name, then fsyncs each directory
// it changed once per batch: a reader sees the old value, the new one, or
// none, never a part. Temp files left by a crash are never read (nothing
// removes them yet).
//
// Security (server/README.md, "Trust model"): the daemon may run as root and serves
// many users, so the tree is the daemon's alone. Directories it makes are
// 0700 and files 0600, whatever the umask. Open refuses a root that group
// or others can write, and warns about one they can list. The root is
// opened once, at Open (its own name may be a symlink: the operator's
// choice); every name below it is reached from a directory descriptor with
// O_NOFOLLOW, so a symlink anywhere below the root is never followed: it is
// an error, never served, never written through. (Sharing the directory
// between daemons therefore means running them as one uid.)
#ifndef HOSTKV_SERVER_TIER_FILE_TIER_H_
#define HOSTKV_SERVER_TIER_FILE_TIER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/tier/page_tier.h"

namespace hostkv {

struct FileTierOptions {
  // fdatasync each value and fsync its directories before Put returns.
  bool fsync = true;
  // A file larger than this is not read (Get answers DataLoss).
  uint64_t max_value_bytes = 1ull << 30;
};

// The longest namespace or key, in bytes (its hex name must fit in one
// 255-byte file name). Longer ones are InvalidArgument.
inline constexpr size_t kFileTierMaxNameBytes = 120;

// Thread-safe: no state is shared between calls but the root's descriptor
// (read only) and the temp-name counter.
class FileTier : public PageTier {
 public:
  // Returns InvalidArgument if `root_dir` is empty, NotFound if it does not
  // exist, FailedPrecondition if it is not a directory, if this process may
  // not read, write and search it, or if group or others may write it (the
  // message names its mode and says to chmod 0700). Logs a warning (spdlog)
  // if group or others may read or search it, or if another non-root user
  // owns it. The tier keeps the directory open: it stays on that directory
  // even if the path is later renamed, removed or mounted over.
  static absl::StatusOr<std::unique_ptr<FileTier>> Open(
      const std::string& root_dir, FileTierOptions options = {});
  ~FileTier() override;

  std::string Describe() const override;  // "file:<root>"

  // Errors, per item or per call: InvalidArgument for a namespace or key
  // longer than kFileTierMaxNameBytes; Unavailable for what the filesystem
  // refused (ENOSPC, EIO, EACCES, EROFS, a vanished root, ...) and Internal
  // for what can only be a bug (EBADF, EINVAL, EFAULT), both with the call,
  // the path and the errno text. A symbolic link below the root is DataLoss
  // ("a symbolic link, never followed") for Get and Delete, Unavailable for
  // Put, and not counted by CountPrefix.

  // One status per item; an item is OK once its file and (with fsync) its
  // directories are on disk. Mismatched keys/values sizes: every item
  // InvalidArgument.
  std::vector<absl::Status> Put(
      absl::Span<const TierKey> keys,
      absl::Span<const absl::string_view> values) override;
  // The file's bytes as they are (a torn or foreign file is returned too:
  // UnframeValue decides); NotFound if there is no file; DataLoss if the
  // path is not a regular file (a FIFO is opened without blocking), is a
  // symbolic link or lies under one, or is larger than
  // options.max_value_bytes.
  std::vector<absl::StatusOr<std::string>> Get(
      absl::Span<const TierKey> keys) override;
  // One fstatat(AT_SYMLINK_NOFOLLOW) per key, in order, up to the first
  // that is not a regular file.
  absl::StatusOr<uint64_t> CountPrefix(absl::Span<const TierKey> keys) override;
  // Unlinks every key's file (absent ones are fine; a symbolic link in its
  // place is unlinked, not followed); returns the first error, after trying
  // the others.
  absl::Status Delete(absl::Span<const TierKey> keys) override;

  // Where the value of `key` lives (for tests and logs). REQUIRES: the
  // namespace and key are at most kFileTierMaxNameBytes.
  std::string PathOf(const TierKey& key) const;

 private:
  class ChangedDirs;  // the directories a Put batch changed, to fsync
  class DirCursor;    // the walk from the root to a key's directory

  FileTier(std::string root, int root_fd, FileTierOptions options);

  absl::Status PutOne(DirCursor& dirs, ChangedDirs* changed, size_t item,
                      const TierKey& key, absl::string_view value);
  absl::Status WriteValue(DirCursor& dirs, ChangedDirs* changed, size_t item,
                          const TierKey& key, absl::string_view value);
  absl::StatusOr<std::string> GetOne(DirCursor& dirs, const TierKey& key) const;
  std::string TempName();

  // Const after construction.
  const std::string root_;  // no trailing '/'; "" for "/"
  const int root_fd_;       // the root, O_RDONLY | O_DIRECTORY; owned
  const FileTierOptions options_;
  // In temp names: daemons in other pid namespaces (containers) sharing the
  // directory can have the same pid and tid.
  const uint64_t nonce_;

  std::atomic<uint64_t> temp_counter_{0};
};

}  // namespace hostkv

#endif  // HOSTKV_SERVER_TIER_FILE_TIER_H_
