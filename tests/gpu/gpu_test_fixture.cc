#include "tests/gpu/gpu_test_fixture.h"

#include <cuda_runtime_api.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kernels/cuda/driver_api.h"
#include "proto/contract/status_macros.h"
#include "tests/testing/status_matchers.h"

namespace hostkv::gpu_testing {

void SuiteDaemon::Start() {
  std::string why;
  if (!CudaDevicePresent(&why)) return;
  // This process's context keeps the GPU initialized, so the daemon's CUDA
  // start-up is quick even without persistence mode.
  cudaFree(nullptr);
  // Small pinning chunks: most pools get several registrations, so copies
  // that cross a registration boundary (DIRECT pieces, layer_first) and the
  // kernel's single device range over many chunks are exercised.
  auto daemon = StartCudaDaemon({"--memory_budget=2GiB", "--pin_chunk=64KiB"},
                                absl::Seconds(45));
  if (daemon.ok()) {
    daemon_ = daemon->release();
    usable_ = true;
  } else {
    error_ = std::string(daemon.status().message());
  }
}

void SuiteDaemon::Stop() {
  if (daemon_ == nullptr) return;
  const ::testing::TestSuite* suite =
      ::testing::UnitTest::GetInstance()->current_test_suite();
  if (const char* dir = std::getenv("HOSTKV_GPU_TEST_LOGS")) {
    const std::string name = absl::StrReplaceAll(
        suite != nullptr ? suite->name() : "suite", {{"/", "_"}});
    std::ofstream(absl::StrCat(dir, "/", name, ".hostkvd.log"))
        << daemon_->log();
  }
  if (suite != nullptr && suite->Failed()) PrintLogTail();
  delete daemon_;
  daemon_ = nullptr;
}

void SuiteDaemon::PrintLogTail() {
  if (daemon_ == nullptr) return;
  const std::string log = daemon_->log();
  const size_t from = log.size() > 6000 ? log.size() - 6000 : 0;
  std::fprintf(stderr, "---- end of the hostkvd log ----\n%s\n----\n",
               log.c_str() + from);
}

void SuiteDaemon::GiveUp(const std::string& why) {
  if (!usable()) return;
  usable_ = false;
  error_ =
      absl::StrCat("an earlier test of this suite gave up on hostkvd: ", why);
  std::fprintf(stderr, "giving up on hostkvd: %s\n", why.c_str());
  PrintLogTail();
  if (daemon_->Stop(SIGTERM, 5000) == -1) daemon_->Stop(SIGKILL, 5000);
}

absl::Status AwaitOperation(Client& client, const Operation& op) {
  absl::Status status = client.Wait(op, kWaitTimeout);
  if (absl::IsDeadlineExceeded(status)) {
    SuiteDaemon::GiveUp(
        absl::StrCat("operation ", op.op_id, ": ", status.message()));
  }
  return status;
}

v1::PoolSpec Spec(const std::string& name, const Model& m, v1::Layout layout,
                  uint32_t page_size, uint64_t capacity_tokens) {
  return Bf16PoolSpec(name, m.mla, m.layers, m.heads, m.dim, layout, page_size,
                      capacity_tokens);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Start(const v1::PoolSpec& spec,
                                                      uint64_t slots,
                                                      uint32_t shared_from,
                                                      uint64_t misalign) {
  return StartOn(SuiteDaemon::get()->target(), spec, slots, shared_from,
                 misalign);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::StartOn(
    const std::string& target, const v1::PoolSpec& spec, uint64_t slots,
    uint32_t shared_from, uint64_t misalign) {
  std::unique_ptr<Engine> e(new Engine);
  ASSIGN_OR_RETURN(e->client_, Client::Connect(target, "engine"));
  ASSIGN_OR_RETURN(e->pool_, e->client_->CreatePool(spec));
  RETURN_IF_ERROR(AwaitPinned(*e->client_, spec.name(), absl::Seconds(60)));
  KvCacheShape shape;
  const bool mla = spec.geometry().has_mla();
  shape.layers = mla ? spec.geometry().mla().num_layers()
                     : spec.geometry().mha().num_layers();
  shape.planes = mla ? 1 : 2;
  shape.token_slots = slots;
  shape.token_stride = e->pool_.token_stride();
  shape.shared_from = shared_from;
  shape.misalign = misalign;
  ASSIGN_OR_RETURN(e->cache_, EngineKvCache::Create(shape));
  int device = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  ASSIGN_OR_RETURN(e->signals_, GpuSignals::Create(shape.layers, device));
  ASSIGN_OR_RETURN(e->import_id_, e->client_->RegisterDeviceBuffers(
                                      spec.name(), slots, e->cache_->k(),
                                      e->cache_->v(), &e->signals_->buffer()));
  RETURN_IF_ERROR(e->signals_->AttachKvWord(*e->client_, e->import_id_));
  return e;
}

Engine::~Engine() {
  if (client_ != nullptr) client_->Close().IgnoreError();
}

absl::Status DeletePool(const std::string& name) {
  if (!SuiteDaemon::usable()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::unique_ptr<Client> admin,
                   Client::Connect(SuiteDaemon::get()->target(), "admin"));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (true) {
    absl::Status status = admin->DeletePool(name);
    if (!absl::IsFailedPrecondition(status) || absl::Now() > deadline) {
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void EndEngines(const std::string& pool,
                const std::vector<std::unique_ptr<Engine>*>& engines) {
  for (std::unique_ptr<Engine>* e : engines) EXPECT_OK((*e)->Close());
  EXPECT_OK(DeletePool(pool));
  for (std::unique_ptr<Engine>* e : engines) e->reset();
}

absl::StatusOr<std::vector<PageRange>> ScatteredPages(Client& client,
                                                      const std::string& pool,
                                                      uint32_t page_size) {
  RETURN_IF_ERROR(client.Alloc(pool, 8 * page_size).status());
  RETURN_IF_ERROR(client.Free(pool, {{1, 1}, {3, 1}, {5, 1}}).status());
  return client.Alloc(pool, 6 * page_size);
}

void AbortStuckStream(const absl::Status& why, Engine& e, const Operation& op) {
  std::fprintf(stderr, "FATAL: engine stream stuck: %s\n",
               std::string(why.message()).c_str());
  for (uint32_t l = 0; l <= e.layers(); ++l) {
    absl::StatusOr<uint64_t> word = e.signals().ReadWord(l);
    std::fprintf(stderr, "  word[%u] = %s (op %llu signals %llu)\n", l,
                 word.ok() ? std::to_string(*word).c_str()
                           : word.status().ToString().c_str(),
                 static_cast<unsigned long long>(op.op_id),
                 static_cast<unsigned long long>(op.signal_value));
  }
  SuiteDaemon::GiveUp("an engine stream is stuck");
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(3);
}

}  // namespace hostkv::gpu_testing
