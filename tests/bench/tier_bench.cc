// Section 6: the storage tiers (server/tier/), in-process, each beside the
// bare store measured in the same run:
//  - the value frame alone: FrameValue and UnframeValue (CRC32C) of 1 MiB
//    and 8 MiB pages, beside a copy of the page into a new std::string;
//  - the Redis tier on a redis-server the bench starts (unix socket, no
//    persistence): Put (FrameValue + Put) and Get (Get + UnframeValue) of
//    1 MiB and 8 MiB pages, one and 8 pages per call, beside raw hiredis
//    SET / GET of the same framed bytes on one synchronous connection
//    (redisCommand "%b"; a batch pipelined with redisAppendCommand +
//    redisGetReply); a CountPrefix of 1,000 keys (all present) beside one
//    EXISTS round trip and 1,000 raw EXISTS pipelined;
//  - the file tier (fsync on, its default) in a temp dir under $TMPDIR or
//    /tmp: Put and Get of 1 MiB and 8 MiB pages beside dd of the same bytes
//    with the same sync (its spawn cost, dd count=0, subtracted), and beside
//    the same system calls made in-process.
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/tier/file_tier.h"
#include "server/tier/redis_tier.h"
#include "server/tier/tier_value.h"
#include "tests/bench/sections.h"
#include "tests/server/tier/redis_server_process.h"

extern char** environ;

namespace hostkv::bench {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr uint64_t kFingerprint = 0x68766b62656e6368ull;  // any constant
constexpr size_t kCountKeys = 1000;
const char kNamespace[] = "bench";

// What the section owns outside the process. Die() exits without
// unwinding, so an atexit hook stops the server and removes the dir.
struct TierResources {
  std::unique_ptr<testing::RedisServerProcess> redis;
  std::string temp_dir;
  ~TierResources() {
    redis.reset();
    if (!temp_dir.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(temp_dir, ignored);
    }
  }
};
TierResources* live_resources = nullptr;
void CleanUpAtExit() { delete live_resources; }

struct RedisContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using RawConnection = std::unique_ptr<redisContext, RedisContextDeleter>;
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RawReply = std::unique_ptr<redisReply, ReplyDeleter>;

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(s.data() + i, &v, 8);
  }
  return s;
}

std::string SizeLabel(size_t page) { return absl::StrCat(page / kMiB, " MiB"); }

// GB/s of `bytes` moved in `ns` nanoseconds (bytes per ns is GB/s).
double Gbps(double bytes, double ns) { return ns > 0 ? bytes / ns : 0; }

void AddRow(Report& report, const std::string& name, const std::string& config,
            const std::string& metric, const std::string& unit, double value,
            const std::string& baseline, double baseline_value,
            const std::string& note) {
  Row row;
  row.section = "tier";
  row.name = name;
  row.config = config;
  row.metric = metric;
  row.unit = unit;
  row.value = value;
  row.baseline = baseline;
  row.baseline_value = baseline_value;
  row.note = note;
  report.Add(row);
}

// --- The value frame alone ---

void RunFrame(const Options& options, Report& report, std::mt19937_64& rng) {
  const int reps = options.quick ? 5 : 40;
  for (size_t page_bytes : {kMiB, 8 * kMiB}) {
    const std::string page = RandomBytes(page_bytes, rng);
    Samples frame, unframe, copy;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      Clock::time_point t0 = Clock::now();
      const std::string value = FrameValue(kFingerprint, page);
      const double frame_ns = NanosBetween(t0, Clock::now());
      t0 = Clock::now();
      absl::StatusOr<absl::string_view> view =
          UnframeValue(value, kFingerprint, page_bytes);
      const double unframe_ns = NanosBetween(t0, Clock::now());
      CheckOk(view, "UnframeValue");
      t0 = Clock::now();
      const std::string copied(page);
      const double copy_ns = NanosBetween(t0, Clock::now());
      if (copied.size() != page.size()) Die("copy");
      if (rep == 0) continue;
      frame.Add(frame_ns);
      unframe.Add(unframe_ns);
      copy.Add(copy_ns);
    }
    const std::string base = "a copy of the page into a new std::string";
    const std::string note = absl::StrCat("median of ", reps);
    AddRow(report, "FrameValue (header + CRC32C + copy)", SizeLabel(page_bytes),
           "throughput", "GB/s", Gbps(page_bytes, frame.Median()), base,
           Gbps(page_bytes, copy.Median()), note);
    AddRow(report, "UnframeValue (header checks + CRC32C, no copy)",
           SizeLabel(page_bytes), "throughput", "GB/s",
           Gbps(page_bytes, unframe.Median()), base,
           Gbps(page_bytes, copy.Median()), note);
  }
}

// --- The Redis tier ---

// SET (values non-empty) or GET of every key on one synchronous
// connection: one redisCommand for one key, else pipelined. Dies on an
// unexpected reply; GET checks each value's length.
void RawBatch(redisContext* c, const std::vector<std::string>& keys,
              const std::vector<std::string>* values, size_t get_bytes) {
  const size_t n = keys.size();
  std::vector<RawReply> replies(n);
  if (n == 1) {
    void* r = values
                  ? redisCommand(c, "SET %b %b", keys[0].data(), keys[0].size(),
                                 (*values)[0].data(), (*values)[0].size())
                  : redisCommand(c, "GET %b", keys[0].data(), keys[0].size());
    replies[0].reset(static_cast<redisReply*>(r));
  } else {
    for (size_t i = 0; i < n; ++i) {
      const int rc =
          values
              ? redisAppendCommand(c, "SET %b %b", keys[i].data(),
                                   keys[i].size(), (*values)[i].data(),
                                   (*values)[i].size())
              : redisAppendCommand(c, "GET %b", keys[i].data(), keys[i].size());
      if (rc != REDIS_OK) Die("redisAppendCommand");
    }
    for (size_t i = 0; i < n; ++i) {
      void* r = nullptr;
      if (redisGetReply(c, &r) != REDIS_OK) Die("redisGetReply");
      replies[i].reset(static_cast<redisReply*>(r));
    }
  }
  for (const RawReply& r : replies) {
    if (!r) Die(absl::StrCat("raw redis: ", c->errstr));
    const bool ok = values
                        ? r->type == REDIS_REPLY_STATUS
                        : r->type == REDIS_REPLY_STRING && r->len == get_bytes;
    if (!ok) Die("raw redis: unexpected reply");
  }
}

void RunRedisTransfer(const Options& options, Report& report, PageTier& tier,
                      redisContext* raw, size_t page_bytes, size_t batch,
                      std::mt19937_64& rng) {
  const double bytes = static_cast<double>(page_bytes) * batch;
  const double target = options.quick ? 32.0 * kMiB : 1024.0 * kMiB;
  const int reps =
      std::clamp(static_cast<int>(target / bytes), options.quick ? 2 : 8, 400);
  std::vector<std::string> pages, framed, raw_keys;
  std::vector<TierKey> keys;
  for (size_t i = 0; i < batch; ++i) {
    pages.push_back(RandomBytes(page_bytes, rng));
    framed.push_back(FrameValue(kFingerprint, pages.back()));
    keys.push_back({kNamespace, absl::StrCat("page-", page_bytes, "-", i)});
    raw_keys.push_back(absl::StrCat("raw-", page_bytes, "-", i));
  }
  Samples tier_put, tier_get, raw_set, raw_get;
  auto tier_side = [&](bool timed) {
    Clock::time_point t0 = Clock::now();
    std::vector<std::string> values;
    for (const std::string& p : pages)
      values.push_back(FrameValue(kFingerprint, p));
    const std::vector<absl::string_view> views(values.begin(), values.end());
    for (const absl::Status& s : tier.Put(keys, views)) CheckOk(s, "tier Put");
    const double put_ns = NanosBetween(t0, Clock::now());
    t0 = Clock::now();
    std::vector<absl::StatusOr<std::string>> got = tier.Get(keys);
    for (size_t i = 0; i < batch; ++i) {
      CheckOk(got[i], "tier Get");
      CheckOk(UnframeValue(*got[i], kFingerprint, page_bytes), "UnframeValue");
    }
    const double get_ns = NanosBetween(t0, Clock::now());
    if (!timed) {  // the warm-up checks the bytes
      for (size_t i = 0; i < batch; ++i) {
        if (got[i]->compare(kTierValueHeaderBytes, page_bytes, pages[i]) != 0) {
          Die("tier Get: other bytes");
        }
      }
      return;
    }
    tier_put.Add(put_ns);
    tier_get.Add(get_ns);
  };
  auto raw_side = [&](bool timed) {
    Clock::time_point t0 = Clock::now();
    RawBatch(raw, raw_keys, &framed, 0);
    const double set_ns = NanosBetween(t0, Clock::now());
    t0 = Clock::now();
    RawBatch(raw, raw_keys, nullptr, framed[0].size());
    const double get_ns = NanosBetween(t0, Clock::now());
    if (!timed) return;
    raw_set.Add(set_ns);
    raw_get.Add(get_ns);
  };
  tier_side(false);
  raw_side(false);
  for (int rep = 0; rep < reps; ++rep) {  // alternate who goes first
    if (rep % 2 == 0) tier_side(true);
    raw_side(true);
    if (rep % 2 == 1) tier_side(true);
  }
  CheckOk(tier.Delete(keys), "tier Delete");
  for (const std::string& k : raw_keys) {
    RawReply(static_cast<redisReply*>(
        redisCommand(raw, "DEL %b", k.data(), k.size())));
  }
  const std::string config =
      absl::StrCat(SizeLabel(page_bytes), " x ", batch,
                   batch == 1 ? " page" : " pages", " per call");
  const std::string note = absl::StrCat(
      "median of ", reps, " calls; GB/s of page bytes; interleaved");
  AddRow(
      report, "Redis tier Put (FrameValue + Put)", config, "throughput", "GB/s",
      Gbps(bytes, tier_put.Median()),
      batch == 1 ? "raw hiredis SET, same bytes" : "raw hiredis SETs pipelined",
      Gbps(bytes, raw_set.Median()), note);
  AddRow(
      report, "Redis tier Get (Get + UnframeValue)", config, "throughput",
      "GB/s", Gbps(bytes, tier_get.Median()),
      batch == 1 ? "raw hiredis GET, same bytes" : "raw hiredis GETs pipelined",
      Gbps(bytes, raw_get.Median()), note);
}

void RunRedisCount(const Options& options, Report& report, PageTier& tier,
                   redisContext* raw, std::mt19937_64& rng) {
  std::vector<TierKey> keys;
  std::vector<std::string> redis_keys, values;
  for (size_t i = 0; i < kCountKeys; ++i) {
    keys.push_back({kNamespace, RandomBytes(32, rng)});  // like a page hash
    redis_keys.push_back(RedisTierKey(keys.back()));
    values.push_back(RandomBytes(64, rng));
  }
  const std::vector<absl::string_view> views(values.begin(), values.end());
  for (const absl::Status& s : tier.Put(keys, views)) CheckOk(s, "tier Put");
  const int calls = options.quick ? 50 : 500;
  Samples count, one, pipelined;
  for (int call = -5; call < calls; ++call) {  // 5 warm-up calls
    Clock::time_point t0 = Clock::now();
    absl::StatusOr<uint64_t> n = tier.CountPrefix(keys);
    const double count_ns = NanosBetween(t0, Clock::now());
    CheckOk(n, "CountPrefix");
    if (*n != kCountKeys) Die("CountPrefix: not all present");
    t0 = Clock::now();
    RawReply r(static_cast<redisReply*>(redisCommand(
        raw, "EXISTS %b", redis_keys[0].data(), redis_keys[0].size())));
    const double one_ns = NanosBetween(t0, Clock::now());
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1) Die("EXISTS");
    t0 = Clock::now();
    for (const std::string& k : redis_keys) {
      if (redisAppendCommand(raw, "EXISTS %b", k.data(), k.size()) !=
          REDIS_OK) {
        Die("redisAppendCommand");
      }
    }
    for (size_t i = 0; i < kCountKeys; ++i) {
      void* reply = nullptr;
      if (redisGetReply(raw, &reply) != REDIS_OK) Die("redisGetReply");
      RawReply owned(static_cast<redisReply*>(reply));
      if (owned->integer != 1) Die("EXISTS: not present");
    }
    const double pipelined_ns = NanosBetween(t0, Clock::now());
    if (call < 0) continue;
    count.Add(count_ns);
    one.Add(one_ns);
    pipelined.Add(pipelined_ns);
  }
  CheckOk(tier.Delete(keys), "tier Delete");
  const std::string config = "1,000 keys (32 bytes), all present";
  const std::string note = absl::StrCat("median of ", calls, " calls; p99 ",
                                        Num(count.Percentile(99) / 1e3), " us");
  const std::string one_rt = "one raw EXISTS round trip";
  AddRow(report, "Redis tier CountPrefix", config, "median time", "us",
         count.Median() / 1e3, one_rt, one.Median() / 1e3, note);
  AddRow(report, "Redis tier CountPrefix, per key", config,
         "median time / 1,000", "us", count.Median() / 1e3 / kCountKeys, one_rt,
         one.Median() / 1e3, "");
  AddRow(report, "Redis tier CountPrefix", config, "median time", "us",
         count.Median() / 1e3, "1,000 raw EXISTS pipelined, one connection",
         pipelined.Median() / 1e3, "");
}

void RunRedis(const Options& options, Report& report, TierResources& res,
              std::mt19937_64& rng) {
  if (testing::RedisServerProcess::FindBinary().empty()) {
    std::fprintf(stderr, "  no redis-server on PATH: Redis rows skipped\n");
    report.SetMeta("tier", "Redis rows skipped: no redis-server on PATH");
    return;
  }
  res.redis = std::make_unique<testing::RedisServerProcess>();
  CheckOk(res.redis->Start(), "redis-server");
  RedisTierOptions tier_options;
  tier_options.address = res.redis->address();
  tier_options.call_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<RedisTier>> tier =
      RedisTier::Open(tier_options);
  CheckOk(tier, "RedisTier::Open");
  RawConnection raw(redisConnectUnix(res.redis->socket_path().c_str()));
  if (!raw || raw->err != 0) Die("redisConnectUnix");
  for (size_t page : {kMiB, 8 * kMiB}) {
    for (size_t batch : {size_t{1}, size_t{8}}) {
      RunRedisTransfer(options, report, **tier, raw.get(), page, batch, rng);
    }
  }
  RunRedisCount(options, report, **tier, raw.get(), rng);
  raw.reset();
  tier->reset();
  res.redis.reset();
}

// --- The file tier ---

// Runs `dd args...` (status=none, stdio on /dev/null) and waits; dies if it
// fails.
void RunDd(std::vector<std::string> args) {
  args.insert(args.begin(), "dd");
  args.push_back("status=none");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd : {0, 1, 2}) {
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null",
                                     fd == 0 ? O_RDONLY : O_WRONLY, 0);
  }
  pid_t pid = -1;
  const int rc =
      posix_spawnp(&pid, "dd", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) Die("cannot spawn dd");
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    Die(absl::StrCat("dd failed: ", args[1], " ", args[2]));
  }
}

// What FileTier::Put does, bare: a new file dir/name, write, fdatasync,
// then (with `publish`) rename it to dir/value and fsync the directory.
// Without `publish` the new file stays (what dd does).
void DirectWrite(const std::string& dir, const std::string& name,
                 const std::string& value, bool publish) {
  const std::string tmp = dir + "/" + name, final_path = dir + "/value";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) Die("open " + tmp);
  for (size_t done = 0; done < value.size();) {
    const ssize_t n = write(fd, value.data() + done, value.size() - done);
    if (n <= 0) Die("write");
    done += static_cast<size_t>(n);
  }
  if (fdatasync(fd) != 0 || close(fd) != 0) Die("fdatasync");
  if (!publish) return;
  if (rename(tmp.c_str(), final_path.c_str()) != 0) Die("rename");
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || fsync(dir_fd) != 0 || close(dir_fd) != 0) Die("fsync dir");
}

// open, fstat, pread the whole file into *buffer, close.
void DirectRead(const std::string& path, std::string* buffer) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) Die("open " + path);
  buffer->resize(static_cast<size_t>(st.st_size));
  for (size_t done = 0; done < buffer->size();) {
    const ssize_t n = pread(fd, buffer->data() + done, buffer->size() - done,
                            static_cast<off_t>(done));
    if (n <= 0) Die("pread");
    done += static_cast<size_t>(n);
  }
  close(fd);
}

template <typename F>
double TimeNs(F&& f) {
  const Clock::time_point t0 = Clock::now();
  f();
  return NanosBetween(t0, Clock::now());
}

// dd's times and its spawn cost (dd count=0 of=/dev/null with the same bs:
// spawn, exec, its buffer, no copy), measured twice: back to back before the
// loop (`quiet`, the figure subtracted) and right before each dd in the loop
// (`before`, only reported). On this VM a process started right after an
// fdatasync took ~5 ms against ~1 ms (cause not found); the spawn before
// each dd takes that wait, so dd itself starts as in the quiet block.
struct DdSamples {
  Samples dd, before, quiet;
  // dd's median less the quiet spawn's; 0 if the copy drowned in the
  // spawn's noise.
  double CopyNs() const { return std::max(0.0, dd.Median() - quiet.Median()); }
  std::string Note() const {
    return absl::StrCat(
        "dd spawned per page; its spawn cost (dd count=0 of=/dev/null, ",
        quiet.size(), " back to back: median ", Num(quiet.Median() / 1e6),
        " ms) subtracted from dd's median ", Num(dd.Median() / 1e6),
        " ms; the same spawn right before each dd: median ",
        Num(before.Median() / 1e6), " ms");
  }
};

// One page of `page_bytes`, the tier's copy and the baselines' copies of it.
struct FileCase {
  std::string dir;  // the case's own temp dir
  size_t page_bytes = 0;
  std::string page, framed;
  std::string src;  // a file holding `framed`, dd's input
  std::string bs;   // dd's bs=: the whole framed value in one block
  TierKey key;
  int reps = 0;
};

double TimeDdSpawn(const FileCase& c) {
  return TimeNs([&] {
    RunDd({"if=" + c.src, "of=/dev/null", c.bs, "count=0"});
  });
}

void FileWrites(const FileCase& c, FileTier& tier, Report& report) {
  Samples put, direct, plain;
  DdSamples dd;
  for (int i = 0; i < 2 * c.reps; ++i) dd.quiet.Add(TimeDdSpawn(c));
  // rep 0 warms up (and creates the tier's dirs). The four writers take
  // turns going first (this VM's disk is sometimes throttled, and then
  // whoever writes after another 8 MiB waits). dd's and the plain write's
  // new files stay until the case ends (kept out of the timed loop).
  for (int rep = 0; rep <= c.reps; ++rep) {
    double s = 0, d = 0, p = 0, w = 0, f = 0;
    for (int turn = 0; turn < 4; ++turn) {
      switch ((rep + turn) % 4) {
        case 0:
          s = TimeDdSpawn(c);
          d = TimeNs([&] {
            RunDd({"if=" + c.src, "of=" + absl::StrCat(c.dir, "/dd-", rep),
                   c.bs, "count=1", "conv=fdatasync"});
          });
          break;
        case 1:
          p = TimeNs([&] {
            const std::string v = FrameValue(kFingerprint, c.page);
            CheckOk(tier.Put({c.key}, {absl::string_view(v)})[0],
                    "file tier Put");
          });
          break;
        case 2:
          w = TimeNs(
              [&] { DirectWrite(c.dir + "/direct", ".tmp", c.framed, true); });
          break;
        default:
          f = TimeNs([&] {
            DirectWrite(c.dir, absl::StrCat("plain-", rep), c.framed, false);
          });
      }
    }
    if (rep == 0) continue;
    put.Add(p);
    dd.dd.Add(d);
    dd.before.Add(s);
    direct.Add(w);
    plain.Add(f);
  }
  const std::string config = SizeLabel(c.page_bytes) + ", 1 page per call";
  const std::string name = "File tier Put (FrameValue + Put, fsync)";
  const std::string note =
      absl::StrCat("median of ", c.reps, "; GB/s of page bytes");
  AddRow(report, name, config, "throughput", "GB/s",
         Gbps(c.page_bytes, put.Median()),
         "dd conv=fdatasync to a new file, spawn subtracted",
         Gbps(c.page_bytes, dd.CopyNs()), note + "; " + dd.Note());
  AddRow(report, name, config, "throughput", "GB/s",
         Gbps(c.page_bytes, put.Median()),
         "in-process write + fdatasync + rename + dir fsync",
         Gbps(c.page_bytes, direct.Median()), note);
  AddRow(report, name, config, "throughput", "GB/s",
         Gbps(c.page_bytes, put.Median()),
         "in-process write + fdatasync of a new file (dd's calls)",
         Gbps(c.page_bytes, plain.Median()), note);
}

void FileReads(const FileCase& c, FileTier& tier, Report& report) {
  const std::string path = tier.PathOf(c.key);
  std::string buffer;
  Samples get, direct;
  DdSamples dd;
  for (int i = 0; i < 2 * c.reps; ++i) dd.quiet.Add(TimeDdSpawn(c));
  // Reads are cheap beside dd's spawn: more of them.
  const int reps = 3 * c.reps;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms the page cache
    const double g = TimeNs([&] {
      absl::StatusOr<std::string> v = std::move(tier.Get({c.key})[0]);
      CheckOk(v, "file tier Get");
      CheckOk(UnframeValue(*v, kFingerprint, c.page_bytes), "UnframeValue");
    });
    const double s = TimeDdSpawn(c);
    const double d = TimeNs([&] {
      RunDd({"if=" + path, "of=/dev/null", c.bs});
    });
    const double r = TimeNs([&] { DirectRead(path, &buffer); });
    if (buffer != c.framed) Die("file tier: other bytes");
    if (rep == 0) continue;
    get.Add(g);
    dd.dd.Add(d);
    dd.before.Add(s);
    direct.Add(r);
  }
  const std::string config = SizeLabel(c.page_bytes) + ", 1 page per call";
  const std::string name =
      "File tier Get (Get + UnframeValue), page cache warm";
  const std::string note =
      absl::StrCat("median of ", reps, "; GB/s of page bytes");
  AddRow(
      report, name, config, "throughput", "GB/s",
      Gbps(c.page_bytes, get.Median()),
      "dd of=/dev/null of the tier's file, page cache warm, spawn subtracted",
      Gbps(c.page_bytes, dd.CopyNs()), note + "; " + dd.Note());
  AddRow(report, name, config, "throughput", "GB/s",
         Gbps(c.page_bytes, get.Median()),
         "in-process open + fstat + pread + close of the tier's file",
         Gbps(c.page_bytes, direct.Median()), note);
}

void RunFilePage(const Options& options, Report& report, const std::string& dir,
                 size_t page_bytes, std::mt19937_64& rng) {
  FileCase c;
  c.dir = absl::StrCat(dir, "/", page_bytes);
  std::filesystem::create_directories(c.dir + "/tier");
  std::filesystem::create_directories(c.dir + "/direct");
  absl::StatusOr<std::unique_ptr<FileTier>> tier =
      FileTier::Open(c.dir + "/tier");
  CheckOk(tier, "FileTier::Open");
  c.page_bytes = page_bytes;
  c.page = RandomBytes(page_bytes, rng);
  c.framed = FrameValue(kFingerprint, c.page);
  c.src = c.dir + "/src";
  c.bs = absl::StrCat("bs=", c.framed.size());
  c.key = {kNamespace, absl::StrCat("file-page-", page_bytes)};
  c.reps = options.quick ? 3 : (page_bytes > kMiB ? 15 : 30);
  std::FILE* f = std::fopen(c.src.c_str(), "wb");
  if (!f ||
      std::fwrite(c.framed.data(), 1, c.framed.size(), f) != c.framed.size() ||
      std::fclose(f) != 0) {
    Die("write " + c.src);
  }
  FileWrites(c, **tier, report);
  FileReads(c, **tier, report);
  CheckOk((*tier)->Delete({c.key}), "file tier Delete");
}

std::string FilesystemType(const std::string& dir) {
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) != 0) return "unknown";
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53:
      return "ext2/3/4";
    case 0x01021994:
      return "tmpfs (fsync is a no-op)";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794c7630:
      return "overlayfs";
    default:
      return absl::StrCat("statfs type 0x", absl::Hex(fs.f_type));
  }
}

void RunFile(const Options& options, Report& report, TierResources& res,
             std::mt19937_64& rng) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/hostkv-tier-bench-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) Die("mkdtemp " + pattern);
  res.temp_dir = pattern;
  report.SetMeta(
      "file tier dir",
      absl::StrCat(res.temp_dir, " (", FilesystemType(res.temp_dir), ")"));
  for (size_t page : {kMiB, 8 * kMiB}) {
    RunFilePage(options, report, res.temp_dir, page, rng);
  }
}

}  // namespace

void RunTier(const Options& options, Report& report) {
  std::fprintf(stderr, "storage tiers in-process\n");
  static const bool registered = [] {
    return std::atexit(CleanUpAtExit) == 0;
  }();
  (void)registered;
  live_resources = new TierResources;
  std::mt19937_64 rng(42);
  RunFrame(options, report, rng);
  RunRedis(options, report, *live_resources, rng);
  RunFile(options, report, *live_resources, rng);
  delete live_resources;
  live_resources = nullptr;
}

}  // namespace hostkv::bench
