#include "tests/gpu/self_exec.h"

#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace hostkv::gpu_testing {
namespace {

bool IsLoader(const std::string& path) {
  const std::string name = path.substr(path.find_last_of('/') + 1);
  return name.rfind("ld-", 0) == 0 && name.find(".so") != std::string::npos;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

std::vector<std::string> SelfExecArgv(const std::string& self_exe,
                                      const std::string& invocation,
                                      const std::string& library_path,
                                      const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  if (IsLoader(self_exe)) {
    argv = {self_exe, "--library-path",
            library_path.empty() ? DirName(self_exe) : library_path,
            invocation};
  } else {
    argv = {self_exe};
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

void ExecSelf(const std::vector<std::string>& args) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return;
  self[n] = '\0';
  const char* library_path = std::getenv("HOSTKVD_LIBRARY_PATH");
  const std::vector<std::string> argv =
      SelfExecArgv(self, program_invocation_name,
                   library_path == nullptr ? "" : library_path, args);
  std::vector<char*> raw;
  for (const std::string& a : argv) raw.push_back(const_cast<char*>(a.c_str()));
  raw.push_back(nullptr);
  execv(raw[0], raw.data());
}

}  // namespace hostkv::gpu_testing
