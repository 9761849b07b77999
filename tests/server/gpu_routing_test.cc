// The daemon's side of the GPU backend, on the CPU: the request layer, the
// pool registry and the transfer engine driven against a scripted
// GpuBackend. It checks what the daemon promises around the CUDA code:
// pinning gates transfers and health, CUDA registrations reach the backend
// and only it, signal values follow submission order (a client's own values
// are claimed in that order, and refused unqueued unless they rise),
// backups' "KV written" waits are released when an import or session goes,
// and Unregister and CloseSession wait for the import's operations.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/transfer/device_import.h"
#include "server/transfer/gpu_backend.h"
#include "server/transfer/gpu_op_tracker.h"
#include "server/pool/host_pool.h"
#include "server/transfer/kv_word_page.h"
#include "server/transfer/signal_sequence.h"
#include "server/service/request_handler.h"
#include "server/transfer/transfer_engine.h"
#include "proto/contract/status_macros.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

constexpr uint32_t kLayers = 2;
constexpr uint64_t kSlots = 32;

std::string Prefix() { return absl::StrCat("/hostkv-gpu-test.", getpid(), "."); }

// Pinning that finishes when the test says so.
class ScriptedPinning : public PoolPinning {
 public:
  explicit ScriptedPinning(std::function<void(bool)> done)
      : done_(std::move(done)) {}
  Progress progress() const override {
    absl::MutexLock lock(&mu_);
    Progress p;
    p.state = state_;
    p.total_bytes = 100;
    p.pinned_bytes = state_ == v1::PIN_PINNED ? 100 : 40;
    p.error = state_ == v1::PIN_FAILED ? "scripted failure" : "";
    return p;
  }
  uint8_t* device_base() const override {
    return reinterpret_cast<uint8_t*>(0x1000);
  }
  uint64_t chunk_bytes() const override { return 0; }
  void Finish(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      state_ = ok ? v1::PIN_PINNED : v1::PIN_FAILED;
    }
    done_(ok);
  }

 private:
  const std::function<void(bool)> done_;
  mutable absl::Mutex mu_;
  v1::PinState state_ ABSL_GUARDED_BY(mu_) = v1::PIN_PINNING;
};

// Its "KV written" word is a real KvWordPage, as CudaImportState's (there
// also registered with CUDA), released the same way: a CPU store.
class ScriptedImport : public GpuImportState {
 public:
  explicit ScriptedImport(std::atomic<int>* destroyed)
      : destroyed_(destroyed), kv_word_(KvWordPage::Create().value()) {}
  ~ScriptedImport() override { destroyed_->fetch_add(1); }
  int device() const override { return 0; }
  bool has_signals() const override { return true; }
  // The CUDA import's own sequence (SignalSequence), from 0.
  absl::StatusOr<uint64_t> NextSignalValue() override {
    return signal_values_.Next();
  }
  absl::Status ClaimSignalValue(uint64_t value) override {
    return signal_values_.Claim(value);
  }
  void ReleaseWaits() override {
    released_.fetch_add(1);
    kv_word_->Release();
  }
  absl::StatusOr<ScopedFd> FetchKvWord() const override {
    return kv_word_->Duplicate();
  }
  const KvWordPage& kv_word() const { return *kv_word_; }
  std::atomic<int> released_{0};

 private:
  std::atomic<int>* const destroyed_;
  SignalSequence signal_values_;
  const std::unique_ptr<KvWordPage> kv_word_;
};

// A GpuBackend whose operations stay "on the GPU" until the test completes
// them, in order. It keeps them in the GpuOpTracker the CUDA backend uses,
// with the same lifetime rules: Enqueue holds the import for its whole run,
// the watchdog (Watchdog(), run when the test says) looks at imports
// through the tracker's own references and releases overdue mark waits.
class ScriptedBackend : public GpuBackend {
 public:
  std::string Describe() const override { return "scripted"; }
  std::unique_ptr<PoolPinning> StartPinning(
      const std::string&, uint8_t*, uint64_t, uint64_t,
      std::function<absl::Status()>, std::function<void(bool)> done) override {
    auto pinning = std::make_unique<ScriptedPinning>(std::move(done));
    absl::MutexLock lock(&mu_);
    pinnings_.push_back(pinning.get());
    return pinning;
  }
  absl::StatusOr<std::unique_ptr<DeviceImport>> OpenImport(
      std::shared_ptr<HostPool> pool, const GpuImportSpec& spec) override {
    RETURN_IF_ERROR(CheckImportShape(pool->geometry(), spec.token_slots,
                                     spec.k.size(), spec.v.size()));
    auto state = std::make_unique<ScriptedImport>(&imports_destroyed_);
    ScriptedImport* raw = state.get();
    std::vector<LayerBuffers> layers(pool->geometry().num_layers,
                                     LayerBuffers{{nullptr, nullptr}});
    auto import = DeviceImport::ForGpu(std::move(pool), spec.token_slots,
                                       std::move(layers), std::move(state));
    absl::MutexLock lock(&mu_);
    imports_.push_back(raw);
    return import;
  }
  absl::Status Enqueue(std::unique_ptr<TransferOp> op) override {
    // As CudaBackend::Enqueue: the import is held until the call returns,
    // although the operation may be finished as soon as it is tracked.
    const std::shared_ptr<DeviceImport> import = op->import;
    tracker_.Begin(op->owner);
    auto entry = std::make_unique<GpuOpTracker::Entry>();
    entry->enqueued = absl::Now();
    if (op->wait_kv_written != 0) {
      entry->wait_deadline = entry->enqueued + wait_timeout_;
    }
    {
      absl::MutexLock lock(&mu_);
      enqueued_.push_back({op->op_id, op->signal_value, op->wait_kv_written,
                           op->signals->cancelled(), op->task.direction,
                           op->host_layer_progress});
    }
    entry->op = std::move(op);
    const uint64_t id = tracker_.Add(std::move(entry));
    {
      absl::MutexLock lock(&mu_);
      held_.push_back(id);
    }
    if (after_add_) after_add_();
    // Still usable here: `import` keeps it alive.
    ScriptedImport* state = static_cast<ScriptedImport*>(import->gpu());
    enqueue_saw_device_.store(state->device());
    return absl::OkStatus();
  }
  void AwaitIdle(std::optional<OwnerTag> owner) override {
    tracker_.AwaitIdle(owner, absl::InfiniteDuration());
  }

  // Completes the oldest held operation as the completion thread would.
  bool CompleteOldest(bool failed = false) {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      if (held_.empty()) return false;
      id = held_.front();
      held_.pop_front();
    }
    std::unique_ptr<GpuOpTracker::Entry> entry = tracker_.Take(id);
    if (entry == nullptr) return true;  // finished by someone else
    std::unique_ptr<TransferOp> op = std::move(entry->op);
    const OwnerTag owner = op->owner;
    // As CudaBackend::Finish: a transfer let through by a release failed.
    if (op->wait_kv_written != 0 &&
        static_cast<ScriptedImport*>(op->import->gpu())->released_.load() > 0) {
      failed = true;
    }
    if (!failed) {
      op->host_pages.Release();
      op->signals->Publish(op->signal_index, op->layer_end - op->layer_begin);
    }
    if (failed) failures_.fetch_add(1);
    FinishOp(std::move(op), failed);
    tracker_.End(owner, nullptr);
    return true;
  }
  void CompleteAll() {
    while (CompleteOldest()) {
    }
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  // One round of CudaBackend's watchdog: releases the mark waits of overdue
  // operations; returns what it looked at (each with its import held).
  std::vector<GpuOpTracker::Watched> Watchdog(absl::Time now) {
    std::vector<GpuOpTracker::Watched> watched = tracker_.Watch(now);
    for (const GpuOpTracker::Watched& w : watched) {
      auto* state = static_cast<ScriptedImport*>(w.import->gpu());
      if (w.wait_overdue && state->released_.load() == 0) state->ReleaseWaits();
    }
    return watched;
  }

  struct Enqueued {
    uint64_t op_id;
    uint64_t signal_value;
    uint64_t wait_kv_written;
    bool cancelled;
    CopyDirection direction;
    bool host_layer_progress;
  };
  std::vector<Enqueued> enqueued() {
    absl::MutexLock lock(&mu_);
    return enqueued_;
  }
  ScriptedPinning* pinning(size_t i) {
    absl::MutexLock lock(&mu_);
    return pinnings_.at(i);
  }
  ScriptedImport* import(size_t i) {
    absl::MutexLock lock(&mu_);
    return imports_.at(i);
  }
  int imports_destroyed() const { return imports_destroyed_.load(); }
  int failures() const { return failures_.load(); }
  // Runs inside Enqueue right after the operation is tracked (a race with
  // the completion thread, made certain).
  void set_after_add(std::function<void()> fn) { after_add_ = std::move(fn); }
  void set_wait_timeout(absl::Duration timeout) { wait_timeout_ = timeout; }
  int enqueue_saw_device() const { return enqueue_saw_device_.load(); }

 private:
  GpuOpTracker tracker_;
  absl::Duration wait_timeout_ = absl::Seconds(60);
  std::function<void()> after_add_;
  std::atomic<int> imports_destroyed_{0};
  std::atomic<int> failures_{0};
  std::atomic<int> enqueue_saw_device_{-1};
  absl::Mutex mu_;
  std::deque<uint64_t> held_ ABSL_GUARDED_BY(mu_);
  std::vector<Enqueued> enqueued_ ABSL_GUARDED_BY(mu_);
  std::vector<ScriptedPinning*> pinnings_ ABSL_GUARDED_BY(mu_);
  std::vector<ScriptedImport*> imports_ ABSL_GUARDED_BY(mu_);
};

class GpuRoutingTest : public ::testing::Test {
 protected:
  GpuRoutingTest()
      : budget_(0, 0, [] { return uint64_t{1} << 40; }),
        pools_(&budget_, Prefix(), PoolFillOptions{1}, &gpu_),
        sessions_(Prefix(), 8),
        transfers_(1, nullptr, &gpu_),
        handler_(RequestLimits{1 << 16, Prefix()}, &budget_, &pools_,
                 &sessions_, &transfers_, nullptr, &gpu_) {
    pools_.SetObserver([this](const std::string& pool, bool serving) {
      absl::MutexLock lock(&health_mu_);
      health_[pool] = serving;
    });
  }
  // Completes "GPU" operations until the transfer engine has drained.
  ~GpuRoutingTest() override {
    std::atomic<bool> drained{false};
    std::thread completer([&] {
      while (!drained.load()) {
        gpu_.CompleteAll();
        absl::SleepFor(absl::Milliseconds(1));
      }
    });
    transfers_.Drain();
    drained.store(true);
    completer.join();
  }

  bool Serving(const std::string& pool) {
    absl::MutexLock lock(&health_mu_);
    return health_[pool];
  }

  void CreatePool(const std::string& name) {
    v1::CreatePoolRequest request;
    v1::PoolSpec& spec = *request.mutable_spec();
    spec.set_name(name);
    auto* mha = spec.mutable_geometry()->mutable_mha();
    mha->set_num_layers(kLayers);
    mha->set_num_kv_heads(2);
    mha->set_head_dim(4);
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    spec.set_page_size(4);
    spec.set_layout(v1::LAYOUT_PAGE_FIRST);
    spec.set_capacity_tokens(60);
    request.set_session_id(OpenSession());  // unattached, as the CUDA tests
    ASSERT_OK(handler_.CreatePool(request));
  }

  SessionId OpenSession() {
    auto r = handler_.OpenSession(v1::OpenSessionRequest());
    EXPECT_OK(r);
    return r.ok() ? r->session_id() : SessionId();
  }

  v1::RegisterDeviceBuffersRequest CudaRegistration(const SessionId& session) {
    v1::RegisterDeviceBuffersRequest r;
    r.set_session_id(session);
    r.set_pool("p");
    r.set_token_slots(kSlots);
    for (uint32_t i = 0; i < 2 * kLayers; ++i) {
      v1::DeviceBuffer* b = i % 2 == 0 ? r.add_k_buffers() : r.add_v_buffers();
      b->set_cuda_ipc_handle(std::string(64, static_cast<char>('a' + i)));
      b->set_size(1 << 20);
    }
    r.mutable_gpu_signals()->set_cuda_ipc_handle(std::string(64, 's'));
    r.mutable_gpu_signals()->set_size(4096);
    return r;
  }

  uint64_t Register(const SessionId& session) {
    auto r = handler_.RegisterDeviceBuffers(CudaRegistration(session));
    EXPECT_OK(r);
    return r.ok() ? r->import_id() : 0;
  }

  v1::TransferRequest Transfer(const SessionId& session, uint64_t import,
                               uint64_t first_page) {
    v1::TransferRequest r;
    r.set_session_id(session);
    r.set_pool("p");
    r.set_import_id(import);
    auto* h = r.add_host_pages();
    h->set_first_page(first_page);
    h->set_num_pages(1);
    auto* d = r.add_device_slots();
    d->set_first_slot(4 * first_page);
    d->set_num_slots(4);
    return r;
  }

  void Alloc(const SessionId& session, uint64_t tokens) {
    v1::AllocRequest r;
    r.set_session_id(session);
    r.set_pool("p");
    r.set_num_tokens(tokens);
    EXPECT_OK(handler_.Alloc(r));
  }

  // Polls `done` until it holds or 10 s pass; returns its last answer.
  static bool WaitUntil(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!done() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return done();
  }

  // A pinned pool "p", a session with a CUDA import, and a backup of page
  // 0 held by the backend, waiting for a "KV written" mark the engine never
  // makes. Returns the session and the import.
  std::pair<SessionId, uint64_t> SubmitBlockedBackup() {
    CreatePool("p");
    gpu_.pinning(0)->Finish(true);
    const SessionId s = OpenSession();
    const uint64_t import = Register(s);
    Alloc(s, 8);
    auto backup = Transfer(s, import, 0);
    backup.set_wait_kv_written(1000);
    EXPECT_OK(handler_.Backup(backup));
    EXPECT_TRUE(WaitUntil([this] { return gpu_.held() == 1; }));
    return {s, import};
  }

  bool WaitsReleased() {
    return WaitUntil([this] { return gpu_.import(0)->released_.load() > 0; });
  }

  ScriptedBackend gpu_;
  absl::Mutex health_mu_;
  std::map<std::string, bool> health_ ABSL_GUARDED_BY(health_mu_);
  MemoryBudget budget_;
  PoolRegistry pools_;
  SessionRegistry sessions_;
  TransferEngine transfers_;
  RequestHandler handler_;
};

TEST_F(GpuRoutingTest, PinningGatesHealthAndCudaTransfers) {
  CreatePool("p");
  EXPECT_FALSE(Serving("p"));
  auto stats = handler_.GetPoolStats(v1::GetPoolStatsRequest());
  ASSERT_OK(stats);
  EXPECT_EQ(v1::BACKEND_CUDA, stats->pools(0).backend());
  EXPECT_EQ(v1::PIN_PINNING, stats->pools(0).pin_state());
  EXPECT_EQ(40u, stats->pools(0).pinned_bytes());

  const SessionId s = OpenSession();
  const uint64_t import = Register(s);  // allowed while pinning
  Alloc(s, 8);
  auto early = handler_.Load(Transfer(s, import, 0));
  EXPECT_EQ(absl::StatusCode::kUnavailable, early.status().code());
  EXPECT_NE(std::string::npos, early.status().message().find("40%"))
      << early.status();

  gpu_.pinning(0)->Finish(/*ok=*/true);
  EXPECT_TRUE(Serving("p"));
  auto get = v1::GetPoolRequest();
  get.set_pool("p");
  auto described = handler_.GetPool(get);
  ASSERT_OK(described);
  EXPECT_TRUE(described->pinned());
  EXPECT_EQ(v1::BACKEND_CUDA, described->backend());
  EXPECT_OK(handler_.Load(Transfer(s, import, 0)));
}

TEST_F(GpuRoutingTest, FailedPinningLeavesThePoolNotServingAndSaysWhy) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(/*ok=*/false);
  EXPECT_FALSE(Serving("p"));
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 8);
  auto r = handler_.Load(Transfer(s, import, 0));
  EXPECT_EQ(absl::StatusCode::kFailedPrecondition, r.status().code());
  EXPECT_NE(std::string::npos, r.status().message().find("scripted failure"))
      << r.status();
}

TEST_F(GpuRoutingTest, SignalValuesFollowSubmissionOrder) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 16);
  std::vector<uint64_t> values;
  for (uint64_t page = 0; page < 4; ++page) {
    auto r = page % 2 == 0 ? handler_.Load(Transfer(s, import, page))
                           : handler_.Backup(Transfer(s, import, page));
    ASSERT_OK(r);
    values.push_back(r->signal_value());
  }
  EXPECT_EQ((std::vector<uint64_t>{1, 2, 3, 4}), values);
  // The dispatcher hands them to the backend in that order.
  WaitUntil([this] { return gpu_.enqueued().size() >= 4; });
  const auto enqueued = gpu_.enqueued();
  ASSERT_EQ(4u, enqueued.size());
  for (size_t i = 0; i < enqueued.size(); ++i) {
    EXPECT_EQ(i + 1, enqueued[i].signal_value);
  }
  gpu_.CompleteAll();
  auto session = sessions_.Get(s).value();
  session->signals()->AwaitIdle();
  EXPECT_EQ(0u, session->signals()->in_flight());
}

TEST_F(GpuRoutingTest, ClientSignalValuesAreEchoedAndReachTheBackend) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 16);
  auto load = Transfer(s, import, 0);
  load.set_signal_value(10);
  auto first = handler_.Load(load);
  ASSERT_OK(first);
  EXPECT_EQ(10u, first->signal_value());
  // 0 after a claimed value: the daemon picks one above it.
  auto picked = handler_.Backup(Transfer(s, import, 1));
  ASSERT_OK(picked);
  EXPECT_EQ(11u, picked->signal_value());
  auto backup = Transfer(s, import, 2);
  backup.set_signal_value(40);  // gaps are allowed
  auto third = handler_.Backup(backup);
  ASSERT_OK(third);
  EXPECT_EQ(40u, third->signal_value());
  auto again = handler_.Load(Transfer(s, import, 3));
  ASSERT_OK(again);
  EXPECT_EQ(41u, again->signal_value());
  ASSERT_TRUE(WaitUntil([this] { return gpu_.enqueued().size() >= 4; }));
  const auto enqueued = gpu_.enqueued();
  ASSERT_EQ(4u, enqueued.size());
  EXPECT_EQ(10u, enqueued[0].signal_value);
  EXPECT_EQ(11u, enqueued[1].signal_value);
  EXPECT_EQ(40u, enqueued[2].signal_value);
  EXPECT_EQ(41u, enqueued[3].signal_value);
  EXPECT_EQ(first->op_id(), enqueued[0].op_id);
  EXPECT_EQ(again->op_id(), enqueued[3].op_id);
}

// gpu_waits_only: the backend is told to publish no per-layer host
// progress (CudaBackend then launches no host callback per layer).
TEST_F(GpuRoutingTest, GpuWaitsOnlyReachesTheBackend) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 16);
  auto quiet = Transfer(s, import, 0);
  quiet.set_gpu_waits_only(true);
  ASSERT_OK(handler_.Load(quiet));
  ASSERT_OK(handler_.Backup(Transfer(s, import, 1)));
  ASSERT_TRUE(WaitUntil([this] { return gpu_.enqueued().size() >= 2; }));
  const auto enqueued = gpu_.enqueued();
  EXPECT_FALSE(enqueued[0].host_layer_progress);
  EXPECT_TRUE(enqueued[1].host_layer_progress);
}

TEST_F(GpuRoutingTest, ClientSignalValueNotAboveTheLastIsRefusedUnqueued) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 16);
  auto load = Transfer(s, import, 0);
  load.set_signal_value(5);
  ASSERT_OK(handler_.Load(load));
  std::shared_ptr<Session> session = sessions_.Get(s).value();
  const uint32_t in_flight = session->signals()->in_flight();
  EXPECT_EQ(1u, in_flight);
  // Equal to the last value, and below it.
  for (uint64_t value : {uint64_t{5}, uint64_t{4}, uint64_t{1}}) {
    auto backup = Transfer(s, import, 1);
    backup.set_signal_value(value);
    auto refused = handler_.Backup(backup);
    EXPECT_ERROR(InvalidArgument, refused);
    EXPECT_NE(std::string::npos,
              refused.status().message().find("not above the import's last "
                                              "signal value 5"))
        << refused.status();
    // Its signal record is free again and its page is not held.
    EXPECT_EQ(in_flight, session->signals()->in_flight());
  }
  auto too_big = Transfer(s, import, 1);
  too_big.set_signal_value(uint64_t{1} << 63);
  EXPECT_ERROR(InvalidArgument, handler_.Backup(too_big));
  // The refused values changed nothing: 0 picks one above 5, and page 1
  // (pinned by none of the refused backups) can be backed up.
  auto next = handler_.Backup(Transfer(s, import, 1));
  ASSERT_OK(next);
  EXPECT_EQ(6u, next->signal_value());
  ASSERT_TRUE(WaitUntil([this] { return gpu_.enqueued().size() >= 2; }));
  absl::SleepFor(absl::Milliseconds(20));  // room for a wrongly queued op
  const auto enqueued = gpu_.enqueued();
  ASSERT_EQ(2u, enqueued.size());
  EXPECT_EQ(5u, enqueued[0].signal_value);
  EXPECT_EQ(6u, enqueued[1].signal_value);
  EXPECT_EQ(next->op_id(), enqueued[1].op_id);
}

TEST_F(GpuRoutingTest, TheLargestSignalValueEndsTheImportsValues) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 8);
  auto load = Transfer(s, import, 0);
  load.set_signal_value(kMaxSignalValue);
  auto last = handler_.Load(load);
  ASSERT_OK(last);
  EXPECT_EQ((uint64_t{1} << 63) - 1, last->signal_value());
  // No value is above it: a picked one would pass the 2^63 bound.
  EXPECT_ERROR(FailedPrecondition, handler_.Backup(Transfer(s, import, 1)));
  std::shared_ptr<Session> session = sessions_.Get(s).value();
  EXPECT_EQ(1u, session->signals()->in_flight());
}

TEST_F(GpuRoutingTest, MarkWaitsReachTheBackendForLoadsAndBackups) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 8);
  auto backup = Transfer(s, import, 0);
  backup.set_wait_kv_written(7);
  ASSERT_OK(handler_.Backup(backup));
  // A load waits for the engine's compute stream to let go of the slots.
  auto load = Transfer(s, import, 1);
  load.set_wait_kv_written(9);
  ASSERT_OK(handler_.Load(load));
  backup.set_wait_kv_written(uint64_t{1} << 63);
  EXPECT_ERROR(InvalidArgument, handler_.Backup(backup));
  load.set_wait_kv_written(uint64_t{1} << 63);
  EXPECT_ERROR(InvalidArgument, handler_.Load(load));
  WaitUntil([this] { return gpu_.enqueued().size() >= 2; });
  const auto enqueued = gpu_.enqueued();
  ASSERT_EQ(2u, enqueued.size());
  EXPECT_EQ(7u, enqueued[0].wait_kv_written);
  EXPECT_EQ(CopyDirection::kDeviceToHost, enqueued[0].direction);
  EXPECT_EQ(9u, enqueued[1].wait_kv_written);
  EXPECT_EQ(CopyDirection::kHostToDevice, enqueued[1].direction);
}

TEST_F(GpuRoutingTest, UnregisterReleasesWaitsAndWaitsForTheOperations) {
  const auto [s, import] = SubmitBlockedBackup();
  ASSERT_EQ(1u, gpu_.held());
  v1::UnregisterDeviceBuffersRequest unregister;
  unregister.set_session_id(s);
  unregister.set_import_id(import);
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    EXPECT_OK(handler_.UnregisterDeviceBuffers(unregister));
    returned.store(true);
  });
  // ReleaseWaits comes first, then the call waits for the operation.
  WaitsReleased();
  EXPECT_EQ(1, gpu_.import(0)->released_.load());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(returned.load()) << "returned with a copy still on the GPU";
  gpu_.CompleteAll();
  caller.join();
  EXPECT_TRUE(returned.load());
  auto pool = pools_.Get("p").value();
  EXPECT_EQ(0u, pool->import_count());
}

TEST_F(GpuRoutingTest, SessionEndReleasesWaitsAndWaitsForTheOperations) {
  const auto [s, import] = SubmitBlockedBackup();
  v1::CloseSessionRequest close;
  close.set_session_id(s);
  std::thread closer([&] { EXPECT_OK(handler_.CloseSession(close)); });
  WaitsReleased();
  EXPECT_GE(gpu_.import(0)->released_.load(), 1);
  gpu_.CompleteAll();
  closer.join();
  EXPECT_EQ(0u, pools_.Get("p").value()->import_count());
}

TEST_F(GpuRoutingTest, AWaitPastItsDeadlineIsReleasedAndReportedFailed) {
  gpu_.set_wait_timeout(absl::Milliseconds(1));
  const auto [s, import] = SubmitBlockedBackup();
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(1u, gpu_.Watchdog(absl::Now()).size());
  EXPECT_EQ(1, gpu_.import(0)->released_.load());
  // A second round does not release again.
  gpu_.Watchdog(absl::Now());
  EXPECT_EQ(1, gpu_.import(0)->released_.load());
  gpu_.CompleteAll();  // the stream passes the released wait
  auto session = sessions_.Get(s).value();
  session->signals()->AwaitIdle();
  // Reported failed: what it copied may not be what the engine meant.
  EXPECT_EQ(1, gpu_.failures());
  // Unregister then returns at once: nothing is left in flight.
  v1::UnregisterDeviceBuffersRequest unregister;
  unregister.set_session_id(s);
  unregister.set_import_id(import);
  EXPECT_OK(handler_.UnregisterDeviceBuffers(unregister));
}

TEST_F(GpuRoutingTest, WaitsWithinTheirDeadlineAreNotReleased) {
  const auto [s, import] = SubmitBlockedBackup();  // 60 s deadline
  ASSERT_EQ(1u, gpu_.Watchdog(absl::Now()).size());
  EXPECT_EQ(0, gpu_.import(0)->released_.load());
  ASSERT_EQ(1u, gpu_.Watchdog(absl::Now() + absl::Seconds(61)).size());
  EXPECT_EQ(1, gpu_.import(0)->released_.load());
  gpu_.CompleteAll();
}

TEST_F(GpuRoutingTest, TheWatchdogsViewKeepsAnImportAliveAfterItsLastOp) {
  const auto [s, import] = SubmitBlockedBackup();
  std::vector<GpuOpTracker::Watched> watched = gpu_.Watchdog(absl::Now());
  ASSERT_EQ(1u, watched.size());
  // The completion thread finishes the operation and the engine
  // unregisters: everything but the watchdog's view drops the import.
  gpu_.CompleteAll();
  v1::UnregisterDeviceBuffersRequest unregister;
  unregister.set_session_id(s);
  unregister.set_import_id(import);
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    EXPECT_OK(handler_.UnregisterDeviceBuffers(unregister));
    returned.store(true);
  });
  absl::SleepFor(absl::Milliseconds(50));
  // The view counts as a use: the stream it queries is not closed under it.
  EXPECT_FALSE(returned.load());
  EXPECT_EQ(0, gpu_.imports_destroyed());
  EXPECT_EQ(0, watched[0].import->gpu()->device());  // still there to query
  watched.clear();
  caller.join();
  EXPECT_TRUE(returned.load());
  EXPECT_TRUE(WaitUntil([this] { return gpu_.imports_destroyed() == 1; }));
}

TEST_F(GpuRoutingTest, EnqueueKeepsTheImportWhenItsOpIsFinishedMeanwhile) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 8);
  std::atomic<bool> finished_early{false};
  std::atomic<int> destroyed_inside{-1};
  std::thread unregisterer;
  gpu_.set_after_add([&] {
    // The watchdog's failure path, between the tracking and the rest of
    // Enqueue: it finishes the operation, and the engine unregisters.
    finished_early.store(gpu_.CompleteOldest(/*failed=*/true));
    unregisterer = std::thread([&] {
      v1::UnregisterDeviceBuffersRequest unregister;
      unregister.set_session_id(s);
      unregister.set_import_id(import);
      EXPECT_OK(handler_.UnregisterDeviceBuffers(unregister));
    });
    absl::SleepFor(absl::Milliseconds(50));
    // Only Enqueue's own reference is left, and it holds.
    destroyed_inside.store(gpu_.imports_destroyed());
  });
  ASSERT_OK(handler_.Load(Transfer(s, import, 0)));
  ASSERT_TRUE(WaitUntil([this] { return gpu_.enqueue_saw_device() == 0; }));
  EXPECT_TRUE(finished_early.load());
  EXPECT_EQ(0, destroyed_inside.load());
  EXPECT_TRUE(WaitUntil([this] { return gpu_.imports_destroyed() == 1; }));
  unregisterer.join();
  gpu_.set_after_add(nullptr);
}

}  // namespace
}  // namespace hostkv

namespace hostkv {
namespace {

// What an engine does with the page kFetchKvWord hands it: map it and
// write its marks there; the daemon's release reaches its mapping.
class EngineKvWord {
 public:
  explicit EngineKvWord(int fd)
      : page_(mmap(nullptr, KvWordPage::kPageBytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0)) {}
  ~EngineKvWord() {
    if (page_ != MAP_FAILED) munmap(page_, KvWordPage::kPageBytes);
  }
  bool mapped() const { return page_ != MAP_FAILED; }
  std::atomic_ref<uint64_t> word() const {
    return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(page_));
  }

 private:
  void* const page_;
};

class KvWordRoutingTest : public GpuRoutingTest {
 protected:
  // A session attached as the session socket attaches one (a peer uid).
  SessionId OpenAttached() {
    auto attached = handler_.OpenAttachedSession("engine", Engine());
    EXPECT_OK(attached);
    return attached.ok() ? attached->session->id() : SessionId();
  }
  static PeerCredentials Engine() {
    PeerCredentials peer;
    peer.pid = static_cast<uint32_t>(getpid());
    peer.uid = static_cast<uint32_t>(getuid());
    peer.gid = static_cast<uint32_t>(getgid());
    return peer;
  }
};

TEST_F(KvWordRoutingTest, TheEngineGetsTheImportsSealedPage) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenAttached();
  const uint64_t import = Register(s);
  auto fd = handler_.FetchKvWord(s, Engine(), import);
  ASSERT_OK(fd);
  struct stat st{};
  ASSERT_EQ(0, fstat(fd->get(), &st));
  EXPECT_EQ(static_cast<off_t>(KvWordPage::kPageBytes), st.st_size);
  const int seals = fcntl(fd->get(), F_GET_SEALS);
  EXPECT_EQ(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL,
            seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
  EXPECT_NE(0, fcntl(fd->get(), F_GETFD) & FD_CLOEXEC);
  EngineKvWord engine(fd->get());
  ASSERT_TRUE(engine.mapped());
  EXPECT_EQ(0u, engine.word().load());
  // The engine's mark is the word the daemon waits on.
  engine.word().store(7);
  EXPECT_EQ(7u, gpu_.import(0)->kv_word().Load());
}

TEST_F(KvWordRoutingTest, UnregisterReleasesTheEnginesMappingToo) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenAttached();
  const uint64_t import = Register(s);
  auto fd = handler_.FetchKvWord(s, Engine(), import);
  ASSERT_OK(fd);
  EngineKvWord engine(fd->get());
  ASSERT_TRUE(engine.mapped());
  v1::UnregisterDeviceBuffersRequest unregister;
  unregister.set_session_id(s);
  unregister.set_import_id(import);
  ASSERT_OK(handler_.UnregisterDeviceBuffers(unregister));
  EXPECT_EQ(KvWordPage::kReleased, engine.word().load());
  // The import is gone: so is its page (for this session).
  EXPECT_ERROR(NotFound, handler_.FetchKvWord(s, Engine(), import));
}

TEST_F(KvWordRoutingTest, SessionEndReleasesTheEnginesMapping) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenAttached();
  const uint64_t import = Register(s);
  auto fd = handler_.FetchKvWord(s, Engine(), import);
  ASSERT_OK(fd);
  EngineKvWord engine(fd->get());
  ASSERT_TRUE(engine.mapped());
  ASSERT_OK(handler_.EndSession(s, "disconnected"));
  EXPECT_EQ(KvWordPage::kReleased, engine.word().load());
}

TEST_F(KvWordRoutingTest, OnlyTheSessionsPeerGetsItsOwnImportsPage) {
  CreatePool("p");
  gpu_.pinning(0)->Finish(true);
  const SessionId s = OpenAttached();
  const uint64_t import = Register(s);
  EXPECT_ERROR(NotFound, handler_.FetchKvWord(s, Engine(), import + 100));
  PeerCredentials stranger = Engine();
  stranger.uid += 1;
  EXPECT_ERROR(PermissionDenied, handler_.FetchKvWord(s, stranger, import));
  // Another session of the same user does not see this session's imports.
  const SessionId other = OpenAttached();
  EXPECT_ERROR(NotFound, handler_.FetchKvWord(other, Engine(), import));
  // A session opened over gRPC has no peer to hand descriptors to.
  const SessionId unattached = OpenSession();
  EXPECT_ERROR(PermissionDenied,
               handler_.FetchKvWord(unattached, Engine(), import));
  EXPECT_ERROR(NotFound,
               handler_.FetchKvWord(SessionId(16, 'x'), Engine(), import));
}

}  // namespace
}  // namespace hostkv
