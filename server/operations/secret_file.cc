#include "server/operations/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/contract/shm_segment.h"
#include "proto/contract/status_macros.h"

namespace hostkv {
namespace {

// `path` opened for reading, if it is a regular file that other users can
// neither read nor write; InvalidArgument starting with `name` otherwise.
absl::StatusOr<ScopedFd> OpenPrivateFile(const std::string& name,
                                         const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
  // waiting for a writer.
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.get() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": cannot open it: ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": cannot stat it: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is not a regular file"));
  }
  const unsigned mode = st.st_mode & 07777;
  if ((mode & 0006) != 0) {
    const char* access = (mode & 0006) == 0006 ? "read and write"
                         : (mode & 0004) != 0  ? "read"
                                               : "write";
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: mode %04o lets other users %s it; chmod 0600 %s (group access, "
        "0640 or 0440, is allowed)",
        name, mode, access, path));
  }
  return fd;
}

// The bytes of `fd` before the first newline (all of them without one), at
// most 64 KiB; InvalidArgument starting with `name` otherwise.
absl::StatusOr<std::string> ReadFirstLine(const std::string& name, int fd) {
  constexpr size_t kMaxLine = 64 << 10;
  std::string text;
  char buf[4096];
  while (text.find('\n') == std::string::npos) {
    if (text.size() > kMaxLine) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": its first line is longer than 64 KiB"));
    }
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": cannot read it: ", std::strerror(errno)));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  text.resize(std::min(text.find('\n'), text.size()));
  return text;
}


}  // namespace

absl::StatusOr<std::string> ReadSecretFile(absl::string_view flag,
                                           const std::string& path,
                                           absl::string_view what) {
  const std::string name = absl::StrCat("--", flag, " ", path);
  ASSIGN_OR_RETURN(ScopedFd fd, OpenPrivateFile(name, path));
  ASSIGN_OR_RETURN(std::string secret, ReadFirstLine(name, fd.get()));
  if (secret.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": cannot read ", what, " (its first line is empty)"));
  }
  return secret;
}

}  // namespace hostkv
