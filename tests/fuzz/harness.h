// The state machine behind request_fuzzer: a RequestHandler with the real
// memory budget, pools, sessions and copy engine, driven by one fuzz input
// at a time and checked against a model of what each session owns.
//
// Its members are defined by topic:
//   harness.cc                  construction, one input's lifetime, op dispatch
//   harness_model.cc            keeping the model in step, invariant checks
//   harness_pickers.cc          choosing ids, names, values and page runs
//   harness_pools_sessions.cc   pool and session requests, GetPoolStats
//   harness_slots.cc            Alloc, Free, HandOverPages, page IO, buffer
//   meta harness_imports.cc          Register (well-formed and mangled),
//   Unregister harness_transfers.cc        Load, Backup and the
//   Backup-then-Load round trip
#ifndef HOSTKV_TESTS_FUZZ_HARNESS_H_
#define HOSTKV_TESTS_FUZZ_HARNESS_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/copy_plan.h"
#include "proto/contract/shm_segment.h"
#include "server/host_pool.h"
#include "server/memory_budget.h"
#include "server/pool_registry.h"
#include "server/request_handler.h"
#include "server/session_registry.h"
#include "server/slot_allocator.h"
#include "server/transfer_engine.h"
#include "tests/fuzz/fuzz_model.h"

namespace hostkv::fuzz {

// Owns the daemon's parts (budget, pools, sessions, engine, handler), two
// device segments standing in for GPU memory, and the model. Not
// thread-safe: libFuzzer calls RunOne from one thread; copies run on the
// engine's threads and are waited for through the sessions' signal boards.
class Harness {
 public:
  Harness();
  ~Harness();

  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  void RunOne(const uint8_t* data, size_t size);

 private:
  enum Op : uint8_t {
    kAlloc,
    kFree,
    kLoad,
    kBackup,
    kReadPages,
    kWritePages,
    kGetPageBufferMeta,
    kRegister,
    kUnregister,
    kCreatePool,
    kDeletePool,
    kOpenSession,
    kCloseSession,
    kGetPoolStats,
    kGetPool,
    kListPools,
    kRoundTrip,
    kHandOver,
    kRenewSession,
    kAttachSession,
    kExpireIdle,
    kOpCount
  };

  // harness.cc
  void Step();
  void Note(bool ok) { last_ok_ = ok; }
  void Dispatch(int op);
  void PrintStats() const;

  // ---- state ------------------------------------------------------------

  // harness.cc
  void Quiesce();
  void TearDown();
  void SetUp();

  // harness_model.cc
  absl::Status Attach(uint64_t id, uint32_t uid);
  bool MayRegister(const SessionModel* m) const;
  void Reconcile();
  void AllocFor(size_t live_index, const std::string& pool, uint64_t pages);
  static bool IsBasePool(const std::string& name);
  void AddLive(uint64_t id);
  SessionModel* FindLive(uint64_t id);
  void CloseLive(size_t index, bool expect_ok, bool end = false);
  void CheckInvariants();
  void CheckOwnedPagesReadable();

  // ---- pickers ----------------------------------------------------------

  // harness_pickers.cc
  uint64_t PickU64(uint64_t n);
  bool OneIn(int n);
  int PickLiveIndex();
  uint64_t PickSessionId();
  std::string PickPoolName();
  std::vector<PageRun> PickPageRuns(const SessionModel* session,
                                    const std::string& pool_name,
                                    uint64_t num_pages,
                                    uint64_t max_pages = UINT64_MAX);
  static void SetRuns(const std::vector<PageRun>& runs,
                      google::protobuf::RepeatedPtrField<v1::PageRun>* out);
  static bool DistinctPages(const std::vector<PageRun>& runs,
                            uint64_t num_pages, std::vector<uint64_t>* pages);
  static bool AllOwned(const SessionModel* s, const std::string& pool,
                       const std::vector<uint64_t>& pages);
  std::shared_ptr<HostPool> FindPool(const std::string& name);

  // ---- requests ---------------------------------------------------------

  // harness_slots.cc
  void DoAlloc();
  void DoFree();
  void DoReadPages();
  void DoWritePages();
  void DoGetPageBufferMeta();
  void DoHandOver();

  // harness_transfers.cc
  std::vector<SlotSpan> PickDeviceRuns(uint64_t tokens, uint64_t slots);
  const ImportModel* PickImport(const SessionModel* m, const std::string& pool);
  const ImportModel* BuildTransfer(v1::TransferRequest* r);
  static std::vector<PageRun> HostRuns(const v1::TransferRequest& r);
  void AfterTransfer(uint64_t session_id, bool allow_running);
  void DoTransfer(bool load);
  void DoRoundTrip();

  // harness_imports.cc
  absl::StatusOr<v1::RegisterDeviceBuffersResponse> RegisterValid(
      size_t live_index, const std::string& pool_name, uint64_t token_slots,
      uint64_t base);
  void BuildRegistration(const HostPool& pool, uint64_t token_slots,
                         uint64_t base, v1::RegisterDeviceBuffersRequest* r,
                         ImportModel* model);
  void Mangle(v1::RegisterDeviceBuffersRequest* r, const HostPool* pool);
  void DoRegister();
  void DoUnregister();

  // harness_pools_sessions.cc
  void DoCreatePool();
  void DoDeletePool();
  void DoOpenSession();
  void DoCloseSession();
  void DoAttachSession();
  void DoExpireIdle();
  void DoGetPoolStats();

  const std::string prefix_;
  MemoryBudget budget_;
  PoolRegistry pools_;
  SessionRegistry sessions_;
  TransferEngine transfers_;
  RequestHandler handler_;
  ShmSegment device_;
  ShmSegment small_device_;

  FuzzedDataProvider* fdp_ = nullptr;
  std::vector<SessionModel> live_;
  std::vector<uint64_t> closed_ids_;
  int outstanding_ = 0;  // transfers accepted and not waited for
  bool last_ok_ = false;
  uint64_t calls_[kOpCount][2] = {};  // [op][succeeded]
};

}  // namespace hostkv::fuzz

#endif  // HOSTKV_TESTS_FUZZ_HARNESS_H_
