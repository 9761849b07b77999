// Re-running the test binary itself in a child process, also when it was
// started through an explicit loader (the GPU bundle runs every binary as
// `lib/ld-linux-x86-64.so.2 --library-path LIBS bin/TEST ...`). There,
// /proc/self/exe is the loader, and exec'ing it with gtest flags fails
// ("unrecognized option"): the child must be started through the loader
// again, with the same library path.
#ifndef HOSTKV_TESTS_GPU_SELF_EXEC_H_
#define HOSTKV_TESTS_GPU_SELF_EXEC_H_

#include <string>
#include <vector>

namespace hostkv::gpu_testing {

// The argv that runs this binary again with `args`. `self_exe` is
// readlink(/proc/self/exe), `invocation` argv[0] as main saw it (after a
// loader shifted its own arguments away), `library_path` the loader's
// --library-path (empty: the loader's own folder, where the bundle keeps
// its libraries). A `self_exe` named ld-linux*.so* or ld-*.so* is a loader.
std::vector<std::string> SelfExecArgv(const std::string& self_exe,
                                      const std::string& invocation,
                                      const std::string& library_path,
                                      const std::vector<std::string>& args);

// execv of SelfExecArgv for this process ($HOSTKVD_LIBRARY_PATH is the
// library path). Returns only if execv failed (errno says why).
void ExecSelf(const std::vector<std::string>& args);

}  // namespace hostkv::gpu_testing

#endif  // HOSTKV_TESTS_GPU_SELF_EXEC_H_
