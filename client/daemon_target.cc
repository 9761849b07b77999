#include "client/daemon_target.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hostkv/client.h"

namespace hostkv {
namespace {

std::string UserName(uid_t uid) {
  const passwd* p = getpwuid(uid);
  return p != nullptr ? absl::StrCat(p->pw_name, " (uid ", uid, ")")
                      : absl::StrCat("uid ", uid);
}

std::string GroupName(gid_t gid) {
  const group* g = getgrgid(gid);
  return g != nullptr ? absl::StrCat(g->gr_name, " (gid ", gid, ")")
                      : absl::StrCat("gid ", gid);
}

// "permission denied on PATH (owner alice (uid 1000), group hostkv (gid
// 998), mode 0750): ..." for the entry `st` describes.
absl::Status Denied(const std::string& path, const struct stat& st,
                    const std::string& what) {
  return absl::PermissionDeniedError(absl::StrFormat(
      "permission denied on %s (owner %s, group %s, mode %04o): %s needs "
      "that uid or that group (hostkvd's --socket_group; `id` shows yours)",
      path, UserName(st.st_uid), GroupName(st.st_gid), st.st_mode & 07777, what));
}

}  // namespace

absl::StatusOr<std::string> ResolveDaemonTarget(const std::string& given) {
  const char* env = std::getenv("HOSTKV_TARGET");
  const std::string target = !given.empty()                     ? given
                             : env != nullptr && env[0] != '\0' ? std::string(env)
                                                                : std::string(kDefaultTarget);
  if (absl::StartsWith(target, "unix:")) return target;
  if (absl::StartsWith(target, "tcp:")) return "127.0.0.1:" + target.substr(4);
  if (absl::StartsWith(target, "/") || absl::StartsWith(target, ".") ||
      absl::EndsWith(target, ".sock")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target '", target, "' is a path: a Unix socket is unix:", target,
        " (TCP: HOST:PORT or tcp:PORT)"));
  }
  return target;
}

absl::Status CheckDaemonSocket(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int error = errno;
    if (error == EACCES) {
      // A directory on the way is closed to us: name the deepest one we see.
      std::string dir = path.substr(0, path.rfind('/'));
      struct stat dst;
      while (!dir.empty()) {
        if (stat(dir.c_str(), &dst) == 0 && access(dir.c_str(), X_OK) != 0) {
          return Denied(dir, dst, "reaching hostkvd's socket");
        }
        const size_t slash = dir.rfind('/');
        dir = slash == std::string::npos ? "" : dir.substr(0, slash);
      }
      return absl::PermissionDeniedError(
          absl::StrCat("permission denied on ", path, ": ", std::strerror(error)));
    }
    return absl::UnavailableError(
        absl::StrCat("no hostkvd socket at ", path, " (is hostkvd running?)"));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat(
        path, " is not a socket (is hostkvd running? is --target its --listen?)"));
  }
  if (access(path.c_str(), R_OK | W_OK) != 0 && errno == EACCES) {
    return Denied(path, st, "connecting to hostkvd");
  }
  return absl::OkStatus();
}

}  // namespace hostkv
