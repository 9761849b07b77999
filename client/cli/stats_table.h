// Text tables of pools, occupancy and cache lookups for the CLI.
#ifndef HOSTKV_CLIENT_CLI_STATS_TABLE_H_
#define HOSTKV_CLIENT_CLI_STATS_TABLE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hostkv/client.h"
#include "hostkv/v1/hostkv.pb.h"

namespace hostkv {

std::string FormatPoolStats(const v1::GetPoolStatsResponse& stats);

// Removes session `session_number` (the CLI's own) from `stats`: its row and
// its count in open_sessions.
void DropSession(uint32_t session_number, v1::GetPoolStatsResponse* stats);
std::string FormatPools(const std::vector<v1::Pool>& pools);

// A cache key given in hex on the command line, as bytes. InvalidArgument
// for an odd number of digits, a non-hex digit, or more than 64 bytes.
absl::StatusOr<std::string> ParseHexKey(const std::string& hex);

// `hostkv lookup`'s output: "hits: H of N keys", then per key its page or
// "miss".
// One line: a namespace's lookups and why they missed.
std::string FormatMissCounters(const v1::MissCounters& c);

std::string FormatLookup(const std::vector<std::string>& hex_keys,
                         const LookupResult& result);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_CLI_STATS_TABLE_H_
