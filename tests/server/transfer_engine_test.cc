// TransferEngine scheduling: each session's operations run in its submission
// order; sessions take turns, so one session's long queue does not hold
// another's small operation; loads go ahead of backups; Abandon finishes a
// session's queued operations at once; a device buffer truncated under a
// copy fails that operation only. Assertions are on completion order and
// counts, never on times.
#include "server/transfer/transfer_engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/transfer/device_import.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_access.h"
#include "server/pool/pool_registry.h"
#include "server/sessions/signal_board.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/sanitizers.h"

namespace hostkv {
namespace {

constexpr uint32_t kLayers = 8;
constexpr uint64_t kTokens = 1024;  // pool capacity and device slots

std::string Prefix() {
  return absl::StrCat("/hostkv-engine-test.", getpid(), ".");
}

// Holds the dispatcher at the start of the first CPU operation (the engine
// calls AwaitIdle(owner) before each) until the test opens it, so that a
// test can queue everything before anything runs. No CUDA imports.
class GateBackend : public GpuBackend {
 public:
  std::string Describe() const override { return "gate"; }
  std::unique_ptr<PoolPinning> StartPinning(
      const std::string&, uint8_t*, uint64_t, uint64_t,
      std::function<absl::Status()>, std::function<void(bool)>) override {
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<DeviceImport>> OpenImport(
      std::shared_ptr<HostPool>, const GpuImportSpec&) override {
    return absl::UnimplementedError("gate");
  }
  absl::Status Enqueue(std::unique_ptr<TransferOp> op) override {
    FinishOp(std::move(op), true);
    return absl::UnimplementedError("gate");
  }
  void AwaitIdle(std::optional<OwnerTag>) override {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(&open_));
    --waiting_;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Blocks until the dispatcher waits at the gate.
  void AwaitDispatcherHeld() {
    absl::MutexLock lock(&mu_);
    auto held = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ > 0; };
    mu_.Await(absl::Condition(&held));
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// One session's side: its signal board and a CPU import whose device
// buffers live in a memfd mapping (so a test can truncate it under a copy).
struct SessionRig {
  OwnerTag owner = kNoOwner;
  std::shared_ptr<SignalBoard> board;
  std::shared_ptr<DeviceImport> import;
  int fd = -1;
  uint8_t* device = nullptr;
  uint64_t device_bytes = 0;
  uint64_t next_op = 0;

  ~SessionRig() {
    import.reset();
    if (device != nullptr) munmap(device, device_bytes);
    if (fd >= 0) close(fd);
  }
  uint8_t* buffer(uint32_t layer, uint32_t kv, uint64_t stride) const {
    return device + (2 * layer + kv) * kTokens * stride;
  }
};

struct Finished {
  OwnerTag owner;
  uint64_t op_id;
  bool failed;
};

class TransferEngineTest : public ::testing::Test {
 protected:
  TransferEngineTest()
      : budget_(0, 0, [] { return uint64_t{1} << 40; }),
        pools_(&budget_, Prefix(), PoolFillOptions{1}) {
    v1::PoolSpec spec;
    spec.set_name("p");
    auto* mha = spec.mutable_geometry()->mutable_mha();
    mha->set_num_layers(kLayers);
    mha->set_num_kv_heads(2);
    mha->set_head_dim(64);
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    spec.set_page_size(4);
    spec.set_layout(v1::LAYOUT_PAGE_FIRST);
    spec.set_capacity_tokens(kTokens);
    auto pool = pools_.Create(spec, false,
                              OwnerFor(Principal{}, v1::POOL_ACCESS_OWNER),
                              Principal{});
    EXPECT_OK(pool);
    pool_ = *pool;
    TransferEngineOptions options;
    // One layer per slice: a whole-pool operation takes kLayers turns.
    options.slice_bytes = kTokens * stride() * 2;
    options.on_finish = [this](const TransferOp& op, bool failed) {
      absl::MutexLock lock(&mu_);
      finished_.push_back({op.owner, op.op_id, failed});
    };
    engine_ = std::make_unique<TransferEngine>(2, nullptr, &gate_, options);
  }
  ~TransferEngineTest() override {
    gate_.Open();
    engine_.reset();  // drains before the rigs go
  }

  uint64_t stride() const { return pool_->geometry().token_stride(); }

  SessionRig& AddSession() {
    auto rig = std::make_unique<SessionRig>();
    rig->owner = static_cast<OwnerTag>(rigs_.size() + 1);
    auto board = SignalBoard::Create(
        absl::StrCat(Prefix(), "signals.", rig->owner), 128);
    EXPECT_OK(board);
    rig->board = *board;
    rig->device_bytes = 2 * kLayers * kTokens * stride();
    rig->fd = memfd_create("hostkv-engine-test", 0);
    EXPECT_EQ(0, ftruncate(rig->fd, static_cast<off_t>(rig->device_bytes)));
    void* p = mmap(nullptr, rig->device_bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED, rig->fd, 0);
    EXPECT_NE(MAP_FAILED, p);
    rig->device = static_cast<uint8_t*>(p);
    std::vector<LayerBuffers> layers;
    for (uint32_t l = 0; l < kLayers; ++l) {
      layers.push_back(
          {{rig->buffer(l, 0, stride()), rig->buffer(l, 1, stride())}});
    }
    rig->import =
        DeviceImport::ForGpu(pool_, kTokens, std::move(layers), nullptr);
    rigs_.push_back(std::move(rig));
    return *rigs_.back();
  }

  // A copy of `tokens` tokens between host token `host` and device slot
  // `slot` of `rig`, every layer, with its signal record claimed.
  std::unique_ptr<TransferOp> MakeOp(SessionRig& rig, CopyDirection direction,
                                     uint64_t host, uint64_t slot,
                                     uint64_t tokens) {
    auto op = std::make_unique<TransferOp>();
    op->op_id = ++rig.next_op;
    op->owner = rig.owner;
    op->import = rig.import;
    op->signals = rig.board;
    auto index = rig.board->Claim(op->op_id);
    EXPECT_OK(index);
    op->signal_index = *index;
    op->layer_begin = 0;
    op->layer_end = kLayers;
    op->submitted = absl::Now();
    op->bytes = tokens * stride() * 2 * kLayers;
    op->task.geometry = pool_->geometry();
    op->task.host_base = pool_->base();
    op->task.layers = rig.import->layers().data();
    op->task.runs = {{host, slot, tokens}};
    op->task.IndexRuns();
    op->task.direction = direction;
    op->task.mechanism = CopyMechanism::kDirect;
    return op;
  }

  // Submits MakeOp's copy. Returns its op id.
  uint64_t Submit(SessionRig& rig, CopyDirection direction, uint64_t host,
                  uint64_t slot, uint64_t tokens) {
    std::unique_ptr<TransferOp> op = MakeOp(rig, direction, host, slot, tokens);
    const uint64_t id = op->op_id;
    absl::StatusOr<uint64_t> signal_value = engine_->Submit(std::move(op));
    EXPECT_OK(signal_value);
    if (signal_value.ok()) EXPECT_EQ(0u, *signal_value);  // CPU imports
    return id;
  }
  uint64_t Backup(SessionRig& rig, uint64_t host, uint64_t slot, uint64_t n) {
    return Submit(rig, CopyDirection::kDeviceToHost, host, slot, n);
  }
  uint64_t Load(SessionRig& rig, uint64_t host, uint64_t slot, uint64_t n) {
    return Submit(rig, CopyDirection::kHostToDevice, host, slot, n);
  }

  // Submits a first operation of `rig` and waits until the dispatcher holds
  // it at the gate: everything submitted next is queued behind it.
  uint64_t SubmitHeld(SessionRig& rig, CopyDirection direction) {
    const uint64_t id = Submit(rig, direction, 0, 0, kTokens);
    gate_.AwaitDispatcherHeld();
    return id;
  }

  std::vector<Finished> RunAll() {
    gate_.Open();
    engine_->Drain();
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  std::vector<Finished> FinishedSoFar() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

  static size_t IndexOf(const std::vector<Finished>& order, OwnerTag owner,
                        uint64_t op_id) {
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i].owner == owner && order[i].op_id == op_id) return i;
    }
    ADD_FAILURE() << "op " << op_id << " of session " << owner
                  << " never finished";
    return order.size();
  }
  static std::vector<uint64_t> OpsOf(const std::vector<Finished>& order,
                                     OwnerTag owner) {
    std::vector<uint64_t> ids;
    for (const Finished& f : order) {
      if (f.owner == owner) ids.push_back(f.op_id);
    }
    return ids;
  }

  MemoryBudget budget_;
  PoolRegistry pools_;
  std::shared_ptr<HostPool> pool_;
  GateBackend gate_;
  std::vector<std::unique_ptr<SessionRig>> rigs_;
  absl::Mutex mu_;
  std::vector<Finished> finished_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<TransferEngine> engine_;  // last: goes first
};

TEST_F(TransferEngineTest, KeepsEachSessionsSubmissionOrder) {
  SessionRig& a = AddSession();
  SessionRig& b = AddSession();
  SubmitHeld(a, CopyDirection::kDeviceToHost);
  // Session A mixes backups and loads; B's loads tempt the scheduler to let
  // A's loads jump ahead of A's backups.
  for (int i = 0; i < 6; ++i) {
    if (i % 2 == 0) {
      Backup(a, 0, 0, kTokens);
    } else {
      Load(a, 0, 0, 4);
    }
    Load(b, 8 * i, 8 * i, 4);
  }
  const std::vector<Finished> order = RunAll();
  EXPECT_EQ((std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}),
            OpsOf(order, a.owner));
  EXPECT_EQ((std::vector<uint64_t>{1, 2, 3, 4, 5, 6}), OpsOf(order, b.owner));
  for (const Finished& f : order) EXPECT_FALSE(f.failed);
}

// A load of pages whose backup is still queued reads what the backup wrote,
// even while other sessions' loads are preferred.
TEST_F(TransferEngineTest, LoadAfterQueuedBackupOfTheSamePagesSeesItsData) {
  SessionRig& a = AddSession();
  SessionRig& b = AddSession();
  const uint64_t s = stride();
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      uint8_t* buf = a.buffer(l, kv, s);
      for (uint64_t i = 0; i < 16 * s; ++i)
        buf[i] = static_cast<uint8_t>(l * 31 + kv * 7 + i);
    }
  }
  SubmitHeld(a, CopyDirection::kDeviceToHost);
  Backup(a, /*host=*/64, /*slot=*/0, 16);  // device slots 0..15 -> host 64..
  Load(b, 0, 0, 4);
  Load(a, /*host=*/64, /*slot=*/512, 16);  // host 64.. -> device 512..
  RunAll();
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      EXPECT_EQ(0, std::memcmp(a.buffer(l, kv, s), a.buffer(l, kv, s) + 512 * s,
                               16 * s))
          << "layer " << l << " plane " << kv;
    }
  }
}

TEST_F(TransferEngineTest, SmallOpOfAnotherSessionDoesNotWaitForALongQueue) {
  SessionRig& a = AddSession();
  SessionRig& b = AddSession();
  SubmitHeld(a, CopyDirection::kDeviceToHost);
  for (int i = 0; i < 20; ++i) Backup(a, 0, 0, kTokens);
  const uint64_t small = Backup(b, 0, 0, 4);
  const std::vector<Finished> order = RunAll();
  ASSERT_EQ(22u, order.size());
  size_t a_before = 0;
  for (size_t i = 0; i < IndexOf(order, b.owner, small); ++i) {
    if (order[i].owner == a.owner) ++a_before;
  }
  // Turns alternate slice by slice: B's op runs within A's first op.
  EXPECT_LE(a_before, 1u) << "of A's 21 operations";
}

TEST_F(TransferEngineTest, LoadsGoAheadOfBackupsAcrossSessions) {
  SessionRig& a = AddSession();
  SessionRig& b = AddSession();
  SessionRig& c = AddSession();
  SubmitHeld(a, CopyDirection::kDeviceToHost);
  for (int i = 0; i < 4; ++i) Backup(a, 0, 0, kTokens);
  const uint64_t b1 = Backup(b, 0, 0, 4);
  Backup(b, 0, 0, 4);
  const uint64_t c1 = Load(c, 0, 0, 4);
  const std::vector<Finished> order = RunAll();
  // C's turn comes after A's and B's, but its op is a load: it goes first.
  EXPECT_EQ(0u, IndexOf(order, c.owner, c1));
  EXPECT_LT(IndexOf(order, c.owner, c1), IndexOf(order, b.owner, b1));
}

TEST_F(TransferEngineTest, BackupsAreNotStarvedByLoads) {
  SessionRig& a = AddSession();
  SessionRig& b = AddSession();
  SubmitHeld(a, CopyDirection::kHostToDevice);
  for (int i = 0; i < 30; ++i) Load(a, 0, 0, kTokens);
  const uint64_t backup = Backup(b, 0, 0, 4);
  const std::vector<Finished> order = RunAll();
  // max_loads_ahead (8) slices of A's loads at most, one layer each: B's
  // backup finishes within A's first two operations.
  size_t a_before = 0;
  for (size_t i = 0; i < IndexOf(order, b.owner, backup); ++i) {
    if (order[i].owner == a.owner) ++a_before;
  }
  EXPECT_LE(a_before, 2u);
}

TEST_F(TransferEngineTest, AbandonFinishesQueuedOpsAsFailedAtOnce) {
  SessionRig& a = AddSession();
  SessionRig& b = AddSession();
  const uint64_t running = SubmitHeld(a, CopyDirection::kDeviceToHost);
  for (int i = 0; i < 9; ++i) Backup(a, 0, 0, kTokens);
  const uint64_t other = Backup(b, 0, 0, 4);
  // The dispatcher is still held at the gate: nothing has run.
  EXPECT_EQ(9u, engine_->Abandon(a.owner));
  std::vector<Finished> now = FinishedSoFar();
  ASSERT_EQ(9u, now.size());
  for (const Finished& f : now) {
    EXPECT_EQ(a.owner, f.owner);
    EXPECT_TRUE(f.failed);
    EXPECT_NE(running, f.op_id);
  }
  EXPECT_EQ(1u, a.board->in_flight());  // only the op in progress
  const std::vector<Finished> order = RunAll();
  ASSERT_EQ(11u, order.size());
  EXPECT_TRUE(order[IndexOf(order, a.owner, running)].failed)
      << "the op in progress stops at its next layer";
  EXPECT_FALSE(order[IndexOf(order, b.owner, other)].failed);
  EXPECT_EQ(0u, a.board->in_flight());
}

// A client truncates the segment of its device buffers: its operations fail,
// the engine and the other sessions carry on.
TEST_F(TransferEngineTest, TruncatedDeviceBufferFailsOnlyThatSessionsOps) {
  if (::hostkv::testing::kThreadSanitizer) GTEST_SKIP() << ::hostkv::testing::kNoFaultGuardUnderTsan;
  SessionRig& a = AddSession();
  SessionRig& b = AddSession();
  ASSERT_EQ(0, ftruncate(a.fd, 0));
  const uint64_t a1 = Load(a, 0, 0, kTokens);
  const uint64_t a2 = Backup(a, 0, 0, 4);  // later ops through the import too
  const uint64_t s = stride();
  for (uint64_t i = 0; i < 4 * s; ++i)
    b.buffer(3, 1, s)[i] = static_cast<uint8_t>(i * 5);
  const uint64_t b1 = Backup(b, 128, 0, 4);
  const uint64_t b2 = Load(b, 128, 100, 4);
  const std::vector<Finished> order = RunAll();
  ASSERT_EQ(4u, order.size());
  EXPECT_TRUE(order[IndexOf(order, a.owner, a1)].failed);
  EXPECT_TRUE(order[IndexOf(order, a.owner, a2)].failed);
  EXPECT_FALSE(order[IndexOf(order, b.owner, b1)].failed);
  EXPECT_FALSE(order[IndexOf(order, b.owner, b2)].failed);
  EXPECT_EQ(0,
            std::memcmp(b.buffer(3, 1, s), b.buffer(3, 1, s) + 100 * s, 4 * s));
}

// Client-picked signal values are for CUDA imports with signal words: a CPU
// import's operation carrying one is refused and never queued.
TEST_F(TransferEngineTest, ASignalValueOnACpuImportIsRefusedUnqueued) {
  SessionRig& a = AddSession();
  std::unique_ptr<TransferOp> op =
      MakeOp(a, CopyDirection::kDeviceToHost, 0, 0, 4);
  op->signal_value = 7;
  ASSERT_EQ(1u, a.board->in_flight());
  EXPECT_ERROR(InvalidArgument, engine_->Submit(std::move(op)));
  EXPECT_EQ(0u, a.board->in_flight());  // its record is free again
  EXPECT_EQ(0u, engine_->queued());
  const uint64_t ok = Backup(a, 0, 0, 4);  // signal value 0: accepted
  const std::vector<Finished> order = RunAll();
  ASSERT_EQ(1u, order.size()) << "the refused operation ran";
  EXPECT_EQ(ok, order[0].op_id);
  EXPECT_FALSE(order[0].failed);
}

}  // namespace
}  // namespace hostkv
