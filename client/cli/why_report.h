// `hostkv why`: a namespace's misses explained, as text.
#ifndef HOSTKV_CLIENT_CLI_WHY_REPORT_H_
#define HOSTKV_CLIENT_CLI_WHY_REPORT_H_

#include <string>
#include <vector>

#include "hostkv/v1/hostkv.pb.h"

namespace hostkv {

// hex_keys: the keys as the user gave them (same order as response.keys()).
std::string FormatWhy(const std::string& cache_namespace,
                      const std::vector<std::string>& hex_keys,
                      const v1::ExplainMissesResponse& response);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_CLI_WHY_REPORT_H_
