// Session B's 1-page backup while session A has many large backups queued,
// through the daemon's TransferEngine in-process: one FIFO for all sessions
// (the engine before fair scheduling, TransferEngineOptions::fair = false)
// against per-session turns with sliced operations, in the same run.
//
//   fairness_bench [a_op_mib=256] [a_ops=40] [copy_threads=2]
//
// Prints, for each mode, B's latency (submit to finish) and how many of A's
// operations finished before B's.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/transfer/device_import.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_access.h"
#include "server/pool/pool_registry.h"
#include "server/sessions/signal_board.h"
#include "server/transfer/transfer_engine.h"

namespace hostkv {
namespace {

constexpr uint32_t kLayers = 32;
constexpr uint64_t kPageSize = 16;

struct Result {
  absl::Duration b_latency;
  int a_finished_before_b = 0;
  absl::Duration total;
};

Result RunScenario(bool fair, uint64_t a_op_bytes, int a_ops,
                   unsigned threads) {
  MemoryBudget budget(0, 0, [] { return uint64_t{1} << 40; });
  const std::string prefix =
      absl::StrCat("/hostkv-fairness-bench.", getpid(), ".");
  PoolRegistry pools(&budget, prefix, PoolFillOptions{threads});
  v1::PoolSpec spec;
  spec.set_name("p");
  auto* mha = spec.mutable_geometry()->mutable_mha();
  mha->set_num_layers(kLayers);
  mha->set_num_kv_heads(8);
  mha->set_head_dim(128);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.set_page_size(kPageSize);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  const uint64_t token_bytes = 2 * kLayers * 8 * 128 * 2;  // all layers, K+V
  const uint64_t tokens = std::max<uint64_t>(
      kPageSize, a_op_bytes / token_bytes / kPageSize * kPageSize);
  spec.set_capacity_tokens(tokens);
  std::shared_ptr<HostPool> pool =
      pools.Create(spec, false, OwnerFor(Principal{}, v1::POOL_ACCESS_OWNER),
                   Principal{})
          .value();
  const uint64_t stride = pool->geometry().token_stride();

  struct Rig {
    std::shared_ptr<SignalBoard> board;
    std::vector<uint8_t> device;
    std::shared_ptr<DeviceImport> import;
  };
  auto make_rig = [&](int n) {
    Rig rig;
    rig.board =
        SignalBoard::Create(absl::StrCat(prefix, "signals.", n), 256).value();
    rig.device.assign(2 * kLayers * tokens * stride, 1);
    std::vector<LayerBuffers> layers;
    for (uint32_t l = 0; l < kLayers; ++l) {
      layers.push_back({{&rig.device[(2 * l) * tokens * stride],
                         &rig.device[(2 * l + 1) * tokens * stride]}});
    }
    rig.import = DeviceImport::ForGpu(pool, tokens, std::move(layers), nullptr);
    return rig;
  };
  Rig a = make_rig(1), b = make_rig(2);

  absl::Mutex mu;
  int a_done = 0;
  int a_done_at_b = -1;
  absl::Time b_finished;
  TransferEngineOptions options;
  options.fair = fair;
  options.on_finish = [&](const TransferOp& op, bool) {
    absl::MutexLock lock(&mu);
    if (op.owner == 1) ++a_done;
    if (op.owner == 2) {
      a_done_at_b = a_done;
      b_finished = absl::Now();
    }
  };
  TransferEngine engine(threads, nullptr, nullptr, options);
  uint64_t next_id = 0;
  auto submit = [&](Rig& rig, OwnerTag owner, uint64_t n) {
    auto op = std::make_unique<TransferOp>();
    op->op_id = ++next_id;
    op->owner = owner;
    op->import = rig.import;
    op->signals = rig.board;
    op->signal_index = rig.board->Claim(op->op_id).value();
    op->layer_begin = 0;
    op->layer_end = kLayers;
    op->submitted = absl::Now();
    op->bytes = n * token_bytes;
    op->task.geometry = pool->geometry();
    op->task.host_base = pool->base();
    op->task.layers = rig.import->layers().data();
    op->task.runs = {{0, 0, n}};
    op->task.IndexRuns();
    op->task.direction = CopyDirection::kDeviceToHost;
    op->task.mechanism = CopyMechanism::kDirect;
    (void)engine.Submit(std::move(op)).value();
  };
  const absl::Time start = absl::Now();
  for (int i = 0; i < a_ops; ++i) submit(a, 1, tokens);
  const absl::Time b_submitted = absl::Now();
  submit(b, 2, kPageSize);
  engine.Drain();
  Result r;
  r.total = absl::Now() - start;
  absl::MutexLock lock(&mu);
  r.b_latency = b_finished - b_submitted;
  r.a_finished_before_b = a_done_at_b;
  return r;
}

}  // namespace
}  // namespace hostkv

int main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int ops = argc > 2 ? std::atoi(argv[2]) : 40;
  const unsigned threads = argc > 3 ? std::atoi(argv[3]) : 2;
  std::printf(
      "A: %d backups of %llu MiB queued; B: one 1-page backup; %u copy "
      "threads\n",
      ops, static_cast<unsigned long long>(mib), threads);
  double fifo_ms = 0;
  for (bool fair : {false, true}) {
    const hostkv::Result r = hostkv::RunScenario(fair, mib << 20, ops, threads);
    const double ms = absl::ToDoubleMilliseconds(r.b_latency);
    if (!fair) fifo_ms = ms;
    std::printf(
        "%-28s B latency %10.2f ms  A ops finished before B %3d/%d  all done "
        "in %.0f ms%s\n",
        fair ? "per-session turns (now)" : "one FIFO (before)", ms,
        r.a_finished_before_b, ops, absl::ToDoubleMilliseconds(r.total),
        fair ? absl::StrCat("  (",
                            static_cast<int>(fifo_ms / std::max(ms, 1e-3)),
                            "x lower)")
                   .c_str()
             : "");
  }
  return 0;
}
