#include "tests/bench/daemon_util.h"

#include <dirent.h>
#include <sched.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/bench/sections.h"

namespace hostkv::bench {

v1::PoolSpec MhaSpec(const std::string& name, uint32_t layers, uint32_t heads,
                     uint32_t head_dim, v1::Dtype dtype, uint32_t page_size,
                     v1::Layout layout, uint64_t capacity_tokens) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_layout(layout);
  spec.set_page_size(page_size);
  spec.set_capacity_tokens(capacity_tokens);
  spec.mutable_geometry()->set_dtype(dtype);
  v1::MhaGeometry* m = spec.mutable_geometry()->mutable_mha();
  m->set_num_layers(layers);
  m->set_num_kv_heads(heads);
  m->set_head_dim(head_dim);
  return spec;
}

v1::PoolSpec MlaSpec(const std::string& name, uint32_t layers,
                     uint32_t kv_lora_rank, uint32_t rope_dim, v1::Dtype dtype,
                     uint32_t page_size, v1::Layout layout,
                     uint64_t capacity_tokens) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_layout(layout);
  spec.set_page_size(page_size);
  spec.set_capacity_tokens(capacity_tokens);
  spec.mutable_geometry()->set_dtype(dtype);
  v1::MlaGeometry* m = spec.mutable_geometry()->mutable_mla();
  m->set_num_layers(layers);
  m->set_kv_lora_rank(kv_lora_rank);
  m->set_qk_rope_head_dim(rope_dim);
  return spec;
}

DeviceBuffers MakeDeviceBuffers(const v1::Pool& pool, uint64_t token_slots) {
  DeviceBuffers d;
  const bool mla = pool.spec().geometry().has_mla();
  const uint32_t layers = mla ? pool.spec().geometry().mla().num_layers()
                              : pool.spec().geometry().mha().num_layers();
  d.planes = mla ? 1 : 2;
  d.token_slots = token_slots;
  d.buffer_bytes = token_slots * pool.token_stride();
  absl::StatusOr<ShmDeviceBuffer> shm =
      ShmDeviceBuffer::Create(d.buffer_bytes * layers * d.planes);
  CheckOk(shm, "creating device buffers");
  d.shm = std::make_unique<ShmDeviceBuffer>(std::move(*shm));
  TrackSegment(d.shm->name(), true);
  // Fault the pages in here, so that no copy pays for it.
  Touch(d.shm->data(), d.shm->size(), 1);
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t kv = 0; kv < d.planes; ++kv) {
      const uint64_t offset = (uint64_t{l} * d.planes + kv) * d.buffer_bytes;
      (kv == 0 ? d.k : d.v).push_back(d.shm->Describe(offset, d.buffer_bytes));
    }
  }
  return d;
}

grpc::ChannelArguments ClientChannelArgs() {
  grpc::ChannelArguments args;  // as client/client.cc sets them
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  return args;
}

HealthCaller::HealthCaller(const std::string& target)
    : channel_(grpc::CreateCustomChannel(
          target, grpc::InsecureChannelCredentials(), ClientChannelArgs())),
      stub_(grpc::health::v1::Health::NewStub(channel_)) {
  if (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                  std::chrono::seconds(5))) {
    Die("health channel: cannot connect to " + target);
  }
}

void HealthCaller::Check() {
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub_->Check(&context, request_, &response);
  if (!status.ok()) Die("health check failed: " + status.error_message());
}

void HealthCaller::CheckWithDeadline() {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub_->Check(&context, request_, &response);
  if (!status.ok()) Die("health check failed: " + status.error_message());
}

TimedOp Timed(std::function<void()> f) {
  return [f = std::move(f)] {
    const Clock::time_point t0 = Clock::now();
    f();
    return NanosBetween(t0, Clock::now());
  };
}

void Interleave(int warmup, int rounds, int per_round, const TimedOp& op,
                const TimedOp& base, Samples* op_ns, Samples* base_ns) {
  for (int i = 0; i < warmup; ++i) {
    op();
    base();
  }
  op_ns->Reserve(op_ns->size() + rounds * per_round);
  base_ns->Reserve(base_ns->size() + rounds * per_round);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < per_round; ++i) op_ns->Add(op());
    for (int i = 0; i < per_round; ++i) base_ns->Add(base());
  }
}

void AddLatencyRows(Report& report, const std::string& section,
                    const std::string& name, const std::string& config,
                    const Samples& op_ns, const Samples& base_ns,
                    const std::string& baseline, const Target& p50_target,
                    const Target& p99_target, const std::string& note) {
  for (int p : {50, 99}) {
    Row row;
    row.section = section;
    row.name = name;
    row.config = config;
    row.metric = absl::StrCat("p", p, " latency");
    row.unit = "us";
    row.value = op_ns.Percentile(p) / 1e3;
    row.baseline = absl::StrCat(baseline, " p", p);
    row.baseline_value = base_ns.Percentile(p) / 1e3;
    row.target = p == 50 ? p50_target : p99_target;
    row.note = absl::StrCat(note, note.empty() ? "" : "; ", "n=", op_ns.size());
    report.Add(row);
  }
}

std::vector<PageRange> Pages(uint64_t first, uint64_t count) {
  return {PageRange{first, count}};
}

namespace {

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Die("cannot bind a TCP port");
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::vector<std::string>& DaemonFlags() {
  static std::vector<std::string> flags;
  return flags;
}

constexpr int kSchedBatch = 1000;
constexpr int kSchedIdle = 1001;

int& DaemonCopyNice() {
  static int nice = 0;
  return nice;
}

// Sets the nice value of every thread of `pid` still named "hostkvd": the
// daemon's own threads (the copy dispatcher and workers, the session
// monitor, the main thread), not gRPC's ("grpcpp_sync_ser", ...).
void ReniceOwnThreads(pid_t pid, int nice) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(dir + "/" + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "hostkvd") {
      const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
      if (nice == kSchedBatch || nice == kSchedIdle) {
        // SCHED_BATCH: a woken copy thread does not preempt the thread that
        // woke it (the gRPC handler); SCHED_IDLE: runs only on idle CPUs.
        sched_param param{};
        sched_setscheduler(tid, nice == kSchedBatch ? SCHED_BATCH : SCHED_IDLE,
                           &param);
      } else {
        setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice);
      }
    }
  }
  closedir(d);
}

}  // namespace

void SetDaemonFlags(std::vector<std::string> flags) {
  DaemonFlags() = std::move(flags);
}

void SetDaemonCopyNice(int nice) { DaemonCopyNice() = nice; }

namespace {

absl::Mutex live_mu;
std::vector<pid_t>& LiveDaemons() {
  static auto* pids = new std::vector<pid_t>;
  return *pids;
}
std::vector<std::string>& LiveSegments() {
  static auto* names = new std::vector<std::string>;
  return *names;
}

// At exit (Die() exits without unwinding): SIGTERM the daemons still
// running, which remove their segments, and unlink our device buffers.
void CleanUpAtExit() {
  absl::MutexLock lock(&live_mu);
  for (pid_t pid : LiveDaemons()) kill(pid, SIGTERM);
  for (const std::string& name : LiveSegments()) shm_unlink(name.c_str());
}

void Track(pid_t pid) {
  static const bool registered = [] { return std::atexit(CleanUpAtExit) == 0; }();
  (void)registered;
  absl::MutexLock lock(&live_mu);
  LiveDaemons().push_back(pid);
}

void Untrack(pid_t pid) {
  absl::MutexLock lock(&live_mu);
  std::erase(LiveDaemons(), pid);
}

}  // namespace

void TrackSegment(const std::string& name, bool live) {
  absl::MutexLock lock(&live_mu);
  if (live) {
    LiveSegments().push_back(name);
  } else {
    std::erase(LiveSegments(), name);
  }
}

void DaemonStopper::operator()(testing::DaemonProcess* daemon) const {
  const pid_t pid = daemon->pid();
  if (daemon->Stop(SIGTERM, 15000) == -1) {
    std::fprintf(stderr, "hostkvd %d did not stop on SIGTERM; killing it\n", pid);
  }
  Untrack(pid);
  delete daemon;  // SIGKILLs it if it is still running
}

DaemonHandle StartDaemon(bool tcp) {
  // DaemonProcess passes --log_level=debug; the last flag wins, and info is
  // the daemon's production default.
  std::vector<std::string> args = {"--log_level=info"};
  std::string listen;
  if (tcp) {
    listen = absl::StrCat("tcp:", FreeTcpPort());
    // A TCP session has no session socket; registering shm buffers by name
    // then needs this flag.
    args.push_back("--allow_unverified_shm_names");
  }
  args.insert(args.end(), DaemonFlags().begin(), DaemonFlags().end());
  DaemonHandle daemon(new testing::DaemonProcess(args, listen));
  if (!daemon->started()) Die("hostkvd did not start:\n" + daemon->log());
  Track(daemon->pid());
  if (DaemonCopyNice() != 0) ReniceOwnThreads(daemon->pid(), DaemonCopyNice());
  return daemon;
}

}  // namespace hostkv::bench
