// Text tables of pools and occupancy for the CLI.
#ifndef HOSTKV_CLIENT_CLI_STATS_TABLE_H_
#define HOSTKV_CLIENT_CLI_STATS_TABLE_H_

#include <string>
#include <vector>

#include "hostkv/v1/hostkv.pb.h"

namespace hostkv {

std::string FormatPoolStats(const v1::GetPoolStatsResponse& stats);
std::string FormatPools(const std::vector<v1::Pool>& pools);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_CLI_STATS_TABLE_H_
