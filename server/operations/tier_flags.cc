#include "server/operations/tier_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/operations/byte_size.h"
#include "server/operations/secret_file.h"

ABSL_FLAG(std::string, tier, "",
          "a storage tier under the page cache: redis://HOST:PORT[,HOST:PORT"
          "...] (Redis or Valkey; a cluster is detected), redis-cluster://"
          "HOST:PORT[,...], redis+unix:/PATH, or file:/PATH; empty: none");
ABSL_FLAG(std::string, tier_password_file, "",
          "file whose first line is the Redis password (AUTH); refused if "
          "other users may read or write it (chmod 0600; group access is "
          "allowed)");
ABSL_FLAG(absl::Duration, tier_timeout, absl::Seconds(2),
          "each store call's timeout (Redis: connect, and each socket read "
          "and write)");
ABSL_FLAG(int, tier_connections, 8, "Redis connections per server");
ABSL_FLAG(bool, tier_fsync, true,
          "file tier: fdatasync each page before its write counts");
ABSL_FLAG(int, tier_write_after_hits, 0,
          "write a published page to the tier at publish (0) or on its Nth "
          "lookup hit");
ABSL_FLAG(bool, tier_read_only, false,
          "never write to the tier (only read pages others wrote)");
ABSL_FLAG(std::string, tier_write_queue, "256MiB",
          "pages waiting to be written to the tier, in bytes; past it a "
          "page is not written (counted as dropped)");
ABSL_FLAG(int, tier_write_threads, 2, "threads writing pages to the tier");
ABSL_FLAG(int, tier_fetch_pages, 64,
          "most pages one Lookup brings from the tier");
ABSL_FLAG(absl::Duration, tier_fetch_wait, absl::Seconds(1),
          "most a Lookup waits for pages from the tier (the caller's "
          "deadline bounds it too); what did not arrive is a miss");
ABSL_FLAG(int, tier_fetch_threads, 4, "threads fetching pages from the tier");

namespace hostkv {
namespace {

const std::vector<std::string> kTierFlagNames = {
    "tier",              "tier_password_file", "tier_timeout",
    "tier_connections",  "tier_fsync",         "tier_write_after_hits",
    "tier_read_only",    "tier_write_queue",   "tier_write_threads",
    "tier_fetch_pages",  "tier_fetch_wait",    "tier_fetch_threads"};

absl::StatusOr<uint32_t> CountFlag(const char* name, int value, int least) {
  if (value < least) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be at least ", least, ", not ", value));
  }
  return static_cast<uint32_t>(value);
}

}  // namespace

const std::vector<std::string>& TierFlagNames() { return kTierFlagNames; }

absl::StatusOr<TierConfig> ReadTierFlags() {
  TierConfig c;
  c.url = absl::GetFlag(FLAGS_tier);
  const std::string password_file = absl::GetFlag(FLAGS_tier_password_file);
  if (!password_file.empty()) {
    absl::StatusOr<std::string> password =
        ReadSecretFile("tier_password_file", password_file, "a password");
    if (!password.ok()) return password.status();
    c.password = *std::move(password);
  }
  c.timeout = absl::GetFlag(FLAGS_tier_timeout);
  c.fsync = absl::GetFlag(FLAGS_tier_fsync);
  c.read_only = absl::GetFlag(FLAGS_tier_read_only);
  c.fetch_wait = absl::GetFlag(FLAGS_tier_fetch_wait);
  struct Count {
    const char* name;
    const absl::Flag<int>& flag;
    int least;
    uint32_t TierConfig::*field;
  };
  for (const Count& count : {
           Count{"tier_connections", FLAGS_tier_connections, 1,
                 &TierConfig::connections},
           Count{"tier_write_after_hits", FLAGS_tier_write_after_hits, 0,
                 &TierConfig::write_after_hits},
           Count{"tier_write_threads", FLAGS_tier_write_threads, 1,
                 &TierConfig::write_threads},
           Count{"tier_fetch_pages", FLAGS_tier_fetch_pages, 1,
                 &TierConfig::fetch_pages},
           Count{"tier_fetch_threads", FLAGS_tier_fetch_threads, 1,
                 &TierConfig::fetch_threads}}) {
    absl::StatusOr<uint32_t> n =
        CountFlag(count.name, absl::GetFlag(count.flag), count.least);
    if (!n.ok()) return n.status();
    c.*count.field = *n;
  }
  absl::StatusOr<uint64_t> queue =
      ParseByteSize(absl::GetFlag(FLAGS_tier_write_queue));
  if (!queue.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tier_write_queue: ", queue.status().message()));
  }
  c.write_queue_bytes = *queue;
  if (absl::Status s = CheckTierConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace hostkv
