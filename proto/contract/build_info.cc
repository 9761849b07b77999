#include "proto/contract/build_info.h"

#include "absl/strings/str_cat.h"
#include "hostkv_commit.h"

namespace hostkv {

std::string BuildInfo(absl::string_view program) {
  return absl::StrCat(program, " ", HOSTKV_VERSION, " (commit ", HOSTKV_COMMIT,
                      ", ", HOSTKV_BUILD_TYPE, " build)");
}

}  // namespace hostkv
