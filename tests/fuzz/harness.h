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
//                               meta
//   harness_imports.cc          Register (well-formed and mangled),
//                               Unregister
//   harness_passed_fds.cc       AcceptPassedFd (sealed memfds and others),
//                               FetchPoolSegment
//   harness_transfers.cc        Load, Backup and the Backup-then-Load round
//                               trip
//   harness_cache.cc            Publish, Lookup, Release, CopyPages
//
// Every reply is checked against the model, errors by their code: a
// malformed session id (not 16 bytes) is INVALID_ARGUMENT and an unknown one
// NOT_FOUND; using a pool the session's uid may not use, deleting one it
// does not own, and registering segments of another uid are
// PERMISSION_DENIED; RESOURCE_EXHAUSTED comes exactly when one of the
// harness's small limits (fuzz_model.h) is reached, and names its flag.
#ifndef HOSTKV_TESTS_FUZZ_HARNESS_H_
#define HOSTKV_TESTS_FUZZ_HARNESS_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "hostkv/v1/hostkv.pb.h"
#include "kernels/copy_plan.h"
#include "proto/contract/shm_segment.h"
#include "server/pool/host_pool.h"
#include "server/pool/memory_budget.h"
#include "server/pool/pool_registry.h"
#include "proto/contract/command_ring.h"
#include "server/service/request_handler.h"
#include "server/service/ring_call.h"
#include "server/sessions/session_registry.h"
#include "server/pool/slot_allocator.h"
#include "server/transfer/transfer_engine.h"
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
    kPassFd,
    kFetchPoolSegment,
    kPublish,
    kLookup,
    kRelease,
    kCopyPages,
    kListEvictions,
    kExplainMisses,
    kSweepClaims,
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
  bool IsIntactBasePool(const HostPool& pool) const;

  // harness_model.cc
  absl::Status Attach(const SessionId& id, const PeerCredentials& peer);
  bool OwnsDeviceSegments(const SessionModel* m) const;
  // What a request naming a pool that does not exist gets: NotFound, or
  // InvalidArgument ("pool is required") for the empty name.
  static bool IsUnknownPoolAnswer(const std::string& pool, const absl::Status& s) {
    return pool.empty() ? absl::IsInvalidArgument(s) : absl::IsNotFound(s);
  }
  bool CheckSessionAnswer(const SessionId& id, const absl::Status& s,
                          const char* what);
  static void CheckExhausted(const absl::Status& s, bool limit_hit,
                             const char* flag, const char* what);
  uint32_t AttachedOfUid(uint32_t uid) const;
  uint32_t UnattachedCount() const;
  uint32_t ImportsOfUid(uint32_t uid) const;
  uint32_t PassedOfUid(uint32_t uid) const;
  void Reconcile();
  void AllocFor(size_t live_index, const std::string& pool, uint64_t pages);
  static bool IsBasePool(const std::string& name);
  void AddLive(const std::shared_ptr<Session>& session);
  SessionModel* FindLive(const SessionId& id);
  void CloseLive(size_t index, bool expect_ok, bool end = false);
  void CheckInvariants();
  void CheckOwnedPagesReadable();

  // ---- pickers ----------------------------------------------------------

  // harness_pickers.cc
  uint64_t PickU64(uint64_t n);
  bool OneIn(int n);
  int PickLiveIndex();
  SessionId PickSessionId();
  PeerCredentials PickPeer();
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
  void AfterTransfer(const SessionId& session_id, bool allow_running);
  void DoTransfer(bool load);
  void DoRoundTrip();

  // harness_imports.cc
  // Where a registration's buffers lie: a named segment or a passed fd.
  struct DeviceTarget {
    std::string shm_name;     // empty with passed_fd
    uint64_t passed_fd = 0;   // 0: shm_name
    uint8_t* data = nullptr;  // the harness's mapping (null if unknown)
    uint64_t size = 0;        // 0 if unknown
    std::shared_ptr<ShmSegment> mapping;
  };
  DeviceTarget DeviceSegment() const;
  DeviceTarget PickTarget(const SessionModel* m, bool* known);
  absl::StatusOr<v1::RegisterDeviceBuffersResponse> RegisterValid(
      size_t live_index, const std::string& pool_name, uint64_t token_slots,
      uint64_t base, const DeviceTarget& target);
  static void BuildRegistration(const HostPool& pool, uint64_t token_slots,
                                uint64_t base, const DeviceTarget& target,
                                v1::RegisterDeviceBuffersRequest* r,
                                ImportModel* model);
  static uint64_t ImportBytes(const PoolGeometry& g, uint64_t token_slots);
  absl::StatusCode ExpectedCleanRegister(const SessionModel& m,
                                         const HostPool& pool,
                                         const DeviceTarget& target,
                                         bool target_known,
                                         uint64_t bytes) const;
  void CheckAcceptedBuffers(const v1::RegisterDeviceBuffersRequest& r,
                            const SessionModel& m, const HostPool& pool);
  void Mangle(v1::RegisterDeviceBuffersRequest* r, const HostPool* pool);
  void DoRegister();
  void DoUnregister();

  // harness_passed_fds.cc
  DeviceTarget PassSealedMemfd(size_t live_index, uint64_t size);
  void DoPassFd();
  void DoFetchPoolSegment();

  // harness_cache.cc
  std::string PickNamespace();
  std::string PickCacheKey();
  // Whether the model's session `m` may publish or look up in `ns` of
  // `pool` as the daemon's record of its owner says (nobody: yes).
  bool MayUseNamespace(const HostPool& pool, const std::string& ns,
                       const SessionModel& m) const;
  void DoPublish();
  void DoLookup();
  void DoRelease();
  void DoCopyPages();
  void DoListEvictions();
  void DoExplainMisses();
  void DoSweepClaims();
  // Cached pages of every pool the model says no session references are
  // not referenced; the allocator's cached pages are the cache's.
  void CheckCacheInvariants(const HostPool& pool);

  // harness_pools_sessions.cc
  void DoCreatePool();
  void DoDeletePool();
  void DoOpenSession();
  void DoCloseSession();
  void DoAttachSession();
  void DoExpireIdle();
  void DoGetPoolStats();
  void CheckCreatePool(const v1::CreatePoolRequest& r,
                       const absl::StatusOr<v1::Pool>& s, const SessionModel& m,
                       bool existed);
  void OpenAttached();

  // The handler's answer to `r`: from `direct()` (the handler's method, as
  // gRPC calls it), or, when the input says so, through the command ring's
  // entry point (RunRingCall, as a ring of the request's session runs it).
  // Every model check then holds for both ways in. A request the ring
  // cannot carry (a string field that is not UTF-8, an answer that might
  // not fit) goes direct, as the clients send it over gRPC.
  template <typename Response, typename Request, typename Direct>
  absl::StatusOr<Response> ViaRingOrDirect(RingMethod method, const Request& r,
                                           Direct direct) {
    if (!fdp_->ConsumeBool()) return direct();
    RingAnswer a = RunRingCall(handler_, pools_, r.session_id(),
                               static_cast<uint32_t>(method),
                               r.SerializeAsString(), absl::InfiniteFuture(),
                               kRingSlotBytes - sizeof(RingSlot));
    ++ring_calls_;
    if (a.code == kRingUseGrpc ||
        (a.code == static_cast<uint32_t>(absl::StatusCode::kInvalidArgument) &&
         a.answer.find("is not a valid") != std::string::npos)) {
      return direct();
    }
    if (a.code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(a.code), a.answer);
    }
    Response response;
    if (!response.ParseFromString(a.answer)) {
      return absl::InternalError("the ring's answer did not parse");
    }
    return response;
  }

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
  std::vector<SessionId> closed_ids_;
  // Every pool's owner as the harness expects it (base pools included).
  std::map<std::string, v1::PoolOwner> pool_owners_;
  int outstanding_ = 0;  // transfers accepted and not waited for
  bool last_ok_ = false;
  uint64_t calls_[kOpCount][2] = {};  // [op][succeeded]
  uint64_t passed_fd_imports_ = 0;    // registrations through passed fds
  uint64_t ring_calls_ = 0;           // requests through RunRingCall
  uint64_t passed_fd_round_trips_ = 0;
};

}  // namespace hostkv::fuzz

#endif  // HOSTKV_TESTS_FUZZ_HARNESS_H_
