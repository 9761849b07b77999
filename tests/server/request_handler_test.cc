// The request layer with the real pools, allocator, sessions and copy engine
// behind it: every refusal names the right code, and refusals change nothing.
#include "server/service/request_handler.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/contract/op_signal.h"
#include "proto/contract/shm_segment.h"
#include "server/pool/pool_access.h"
#include "tests/server/handler_fixture.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using RequestHandlerTest = HandlerFixture;

TEST_F(RequestHandlerTest, UnknownNamesAreNotFound) {
  const SessionId s = OpenSession();
  v1::AllocRequest alloc;
  alloc.set_session_id(s);
  alloc.set_pool("nope");
  alloc.set_num_tokens(4);
  EXPECT_ERROR(NotFound, handler_.Alloc(alloc));
  v1::GetPoolRequest get;
  get.set_pool("nope");
  EXPECT_ERROR(NotFound, handler_.GetPool(get));
  v1::GetPoolStatsRequest stats;
  stats.set_pool("nope");
  EXPECT_ERROR(NotFound, handler_.GetPoolStats(stats));
  CreatePool("p");
  alloc.set_pool("p");
  SessionId unknown = s;
  unknown[0] = static_cast<char>(unknown[0] ^ 1);
  alloc.set_session_id(unknown);
  EXPECT_ERROR(NotFound, handler_.Alloc(alloc));
  alloc.set_session_id("short");
  EXPECT_ERROR(InvalidArgument, handler_.Alloc(alloc));
  alloc.set_session_id(unknown);
  EXPECT_ERROR(NotFound, handler_.Alloc(alloc));
  v1::UnregisterDeviceBuffersRequest unreg;
  unreg.set_session_id(s);
  unreg.set_import_id(77);
  EXPECT_ERROR(NotFound, handler_.UnregisterDeviceBuffers(unreg));
}

TEST_F(RequestHandlerTest, CreatePoolTwice) {
  CreatePool("p");
  v1::CreatePoolRequest request;
  *request.mutable_spec() = Spec("p");
  request.set_session_id(OpenSession());
  EXPECT_ERROR(AlreadyExists, handler_.CreatePool(request));
  request.set_attach_if_exists(true);
  EXPECT_OK(handler_.CreatePool(request));
  *request.mutable_spec() = Spec("p", 200);
  EXPECT_ERROR(AlreadyExists, handler_.CreatePool(request));
}

TEST_F(RequestHandlerTest, AttachNeedsTheSameMlaRowWidth) {
  v1::CreatePoolRequest request;
  v1::PoolSpec& spec = *request.mutable_spec();
  spec.set_name("dsa");
  spec.mutable_geometry()->set_dtype(v1::DTYPE_FP8_E4M3);
  auto* mla = spec.mutable_geometry()->mutable_mla();
  mla->set_num_layers(2);
  mla->set_kv_lora_rank(512);
  mla->set_qk_rope_head_dim(64);
  mla->set_kv_cache_dim(656);
  spec.set_page_size(4);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST);
  spec.set_capacity_tokens(8);
  request.set_session_id(OpenSession());
  request.set_attach_if_exists(true);
  auto created = handler_.CreatePool(request);
  ASSERT_OK(created);
  EXPECT_EQ(2u * 656, created->bytes_per_token());
  EXPECT_EQ(656u, created->spec().geometry().mla().kv_cache_dim());
  EXPECT_OK(handler_.CreatePool(request));  // the same spec attaches
  mla->set_kv_cache_dim(660);
  EXPECT_ERROR(AlreadyExists, handler_.CreatePool(request));
  mla->clear_kv_cache_dim();  // 576 elements: another row
  EXPECT_ERROR(AlreadyExists, handler_.CreatePool(request));
}

TEST_F(RequestHandlerTest, PoolOverBudgetIsRefusedAndNotCreated) {
  MemoryBudget small(1000, 0, [] { return uint64_t{1} << 40; });
  PoolRegistry pools(&small, Prefix() + "small.", PoolFillOptions{1});
  EXPECT_ERROR(ResourceExhausted,
               pools.Create(Spec("big"), false,
                            OwnerFor(Principal{}, v1::POOL_ACCESS_OWNER), Principal{}));
  EXPECT_TRUE(pools.List().empty());
  EXPECT_EQ(0u, small.reserved_bytes());
}

TEST_F(RequestHandlerTest, AllocNeedsWholePages) {
  CreatePool("p");
  const SessionId s = OpenSession();
  v1::AllocRequest request;
  request.set_session_id(s);
  request.set_pool("p");
  request.set_num_tokens(6);
  EXPECT_ERROR(InvalidArgument, handler_.Alloc(request));
  request.set_num_tokens(0);
  EXPECT_ERROR(InvalidArgument, handler_.Alloc(request));
  request.set_num_tokens(17 * kPageSize);  // pool has 16 pages
  EXPECT_ERROR(ResourceExhausted, handler_.Alloc(request));
  v1::AllocResponse ok = Alloc(s, 8);
  ASSERT_EQ(1, ok.pages_size());
  EXPECT_EQ(2u, ok.pages(0).num_pages());
}

TEST_F(RequestHandlerTest, FreeChecksOwnership) {
  CreatePool("p");
  const SessionId alice = OpenSession();
  const SessionId bob = OpenSession();
  Alloc(alice, 8);  // pages 0, 1
  Alloc(bob, 8);    // pages 2, 3
  EXPECT_ERROR(FailedPrecondition, Free(alice, 2, 1));
  EXPECT_ERROR(FailedPrecondition, Free(alice, 1, 2));  // 2 is Bob's
  EXPECT_ERROR(InvalidArgument, Free(alice, 16, 1));
  EXPECT_ERROR(InvalidArgument, Free(alice, 0, 0));
  ASSERT_OK(Free(alice, 0, 2));
  EXPECT_ERROR(FailedPrecondition, Free(alice, 0, 2));  // twice
  // Freeing no pages (every page of a publish was cached) is a no-op.
  v1::FreeRequest empty;
  empty.set_session_id(bob);
  empty.set_pool("p");
  auto freed = handler_.Free(empty);
  ASSERT_OK(freed);
  EXPECT_EQ(0u, freed->pages_freed());
  auto stats = handler_.GetPoolStats(v1::GetPoolStatsRequest());
  ASSERT_OK(stats);
  EXPECT_EQ(2u, stats->pools(0).used_pages());
}

TEST_F(RequestHandlerTest, RegistrationValidatesHandles) {
  CreatePool("p");
  const SessionId s = OpenSession();
  auto request = Registration(s);
  request.mutable_k_buffers(1)->set_cuda_ipc_handle(std::string(63, 'x'));
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  // One registration uses one kind of handle.
  request.mutable_k_buffers(1)->set_cuda_ipc_handle(std::string(64, 'x'));
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request.mutable_k_buffers(1)->clear_cuda_ipc_handle();
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  // GPU signal words belong to CUDA registrations only.
  request = Registration(s);
  request.mutable_gpu_signals()->set_shm_name("/x");
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));

  // Well-formed CUDA registrations: refused by a daemon without a CUDA
  // backend, after the fields are checked.
  auto cuda = Registration(s);
  for (auto* buffers : {cuda.mutable_k_buffers(), cuda.mutable_v_buffers()}) {
    for (v1::DeviceBuffer& b : *buffers) b.set_cuda_ipc_handle(std::string(64, 'h'));
  }
  EXPECT_ERROR(FailedPrecondition, handler_.RegisterDeviceBuffers(cuda));
  cuda.mutable_gpu_signals()->set_cuda_ipc_handle(std::string(64, 's'));
  EXPECT_ERROR(FailedPrecondition, handler_.RegisterDeviceBuffers(cuda));
  request = cuda;
  request.mutable_k_buffers(2)->set_device_uuid(std::string(15, 'u'));
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = cuda;
  request.mutable_v_buffers(0)->set_device(-1);
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = cuda;
  request.mutable_gpu_signals()->set_cuda_ipc_handle(std::string(65, 's'));
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = cuda;
  request.mutable_gpu_signals()->set_shm_name("/x");
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));

  request = Registration(s);
  request.mutable_v_buffers()->RemoveLast();
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = Registration(s);
  request.mutable_k_buffers(0)->set_size(kDeviceSlots * kStride - 1);
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = Registration(s);
  request.mutable_k_buffers(2)->set_offset(UINT64_MAX - 10);
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = Registration(s);
  // The last buffer moved one row further runs past the segment end.
  request.mutable_v_buffers(2)->set_offset((2 * kLayers - 1) * kDeviceSlots * kStride + kStride);
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = Registration(s);
  request.set_token_slots(0);
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request = Registration(s);
  request.mutable_k_buffers(0)->set_shm_name("/../../etc/passwd");
  EXPECT_ERROR(InvalidArgument, handler_.RegisterDeviceBuffers(request));
  request.mutable_k_buffers(0)->set_shm_name("/hostkv-test-no-such-segment");
  EXPECT_ERROR(NotFound, handler_.RegisterDeviceBuffers(request));
  request.mutable_k_buffers(0)->set_shm_name(Prefix() + "pool.p");
  EXPECT_ERROR(PermissionDenied, handler_.RegisterDeviceBuffers(request));
  EXPECT_EQ(0u, pools_.Get("p").value()->imports().load());
  EXPECT_OK(handler_.RegisterDeviceBuffers(Registration(s)));
  EXPECT_EQ(1u, pools_.Get("p").value()->imports().load());
}

// token_slots x token_stride must not wrap around: with a 2^24-byte row
// and 2^40 slots the product is 2^64, which once passed as "0 bytes needed"
// and let transfers address memory outside the buffer.
TEST_F(RequestHandlerTest, BufferSizeProductCannotOverflow) {
  v1::CreatePoolRequest create;
  v1::PoolSpec& spec = *create.mutable_spec();
  spec.set_name("wide");
  auto* mha = spec.mutable_geometry()->mutable_mha();
  mha->set_num_layers(1);
  mha->set_num_kv_heads(256);
  mha->set_head_dim(32768);  // bf16: 2^24 bytes per row
  spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
  spec.set_page_size(1);
  spec.set_layout(v1::LAYOUT_LAYER_FIRST);
  spec.set_capacity_tokens(1);
  create.set_session_id(OpenSession());
  ASSERT_OK(handler_.CreatePool(create));
  const SessionId s = OpenSession();
  v1::RegisterDeviceBuffersRequest request = Registration(s);
  request.set_pool("wide");
  request.set_token_slots(1ull << 40);
  while (request.k_buffers_size() > 1) request.mutable_k_buffers()->RemoveLast();
  while (request.v_buffers_size() > 1) request.mutable_v_buffers()->RemoveLast();
  auto r = handler_.RegisterDeviceBuffers(request);
  EXPECT_EQ(absl::StatusCode::kInvalidArgument, r.status().code()) << r.status();
  EXPECT_NE(std::string::npos, r.status().message().find("2^50")) << r.status();
}

TEST_F(RequestHandlerTest, TransferValidatesEveryField) {
  CreatePool("p");
  CreatePool("q");
  const SessionId s = OpenSession();
  const SessionId other = OpenSession();
  const uint64_t import = Register(s);
  const uint64_t q_import = Register(s, "q");
  Alloc(s, 8);      // pages 0, 1
  Alloc(other, 4);  // page 2
  EXPECT_OK(handler_.Backup(Transfer(s, import, 0, 2, 8, 8)));

  EXPECT_ERROR(FailedPrecondition, handler_.Load(Transfer(s, import, 2, 1, 0, 4)));
  EXPECT_ERROR(FailedPrecondition, handler_.Load(Transfer(s, import, 5, 1, 0, 4)));
  EXPECT_ERROR(InvalidArgument, handler_.Load(Transfer(s, import, 99, 1, 0, 4)));
  EXPECT_ERROR(InvalidArgument, handler_.Load(Transfer(s, import, 0, 2, 60, 8)));
  EXPECT_ERROR(InvalidArgument,
               handler_.Load(Transfer(s, import, 0, 2, UINT64_MAX, 8)));
  EXPECT_ERROR(InvalidArgument, handler_.Load(Transfer(s, import, 0, 2, 0, 7)));
  EXPECT_ERROR(NotFound, handler_.Load(Transfer(s, 999, 0, 2, 0, 8)));
  EXPECT_ERROR(NotFound, handler_.Load(Transfer(other, import, 2, 1, 0, 4)));
  EXPECT_ERROR(InvalidArgument, handler_.Load(Transfer(s, q_import, 0, 2, 0, 8)));
  // "KV written" waits exist for CUDA imports with GPU signals only.
  auto waits = Transfer(s, import, 0, 2, 0, 8);
  waits.set_wait_kv_written(1);
  EXPECT_ERROR(InvalidArgument, handler_.Backup(waits));
  EXPECT_ERROR(InvalidArgument, handler_.Load(waits));
  // So are client-picked signal values.
  auto valued = Transfer(s, import, 0, 2, 0, 8);
  valued.set_signal_value(5);
  auto refused = handler_.Backup(valued);
  EXPECT_ERROR(InvalidArgument, refused);
  EXPECT_NE(std::string::npos, refused.status().message().find("gpu_signals"))
      << refused.status();
  EXPECT_ERROR(InvalidArgument, handler_.Load(valued));
  // And waits on the GPU only: a CPU import's record is its only progress.
  auto quiet = Transfer(s, import, 0, 2, 0, 8);
  quiet.set_gpu_waits_only(true);
  auto refused_quiet = handler_.Load(quiet);
  EXPECT_ERROR(InvalidArgument, refused_quiet);
  EXPECT_NE(std::string::npos,
            refused_quiet.status().message().find("gpu_waits_only"))
      << refused_quiet.status();

  auto request = Transfer(s, import, 0, 2, 0, 4);
  auto* dup = request.add_device_slots();
  dup->set_first_slot(2);  // overlaps [0, 4)
  dup->set_num_slots(4);
  EXPECT_ERROR(InvalidArgument, handler_.Load(request));

  request = Transfer(s, import, 0, 1, 0, 4);
  request.set_layer_begin(2);
  request.set_layer_end(2);
  EXPECT_ERROR(InvalidArgument, handler_.Load(request));
  request.set_layer_end(kLayers + 1);
  EXPECT_ERROR(InvalidArgument, handler_.Load(request));
  request.set_layer_end(0);
  request.set_mechanism(static_cast<v1::CopyMechanism>(5));
  EXPECT_ERROR(InvalidArgument, handler_.Load(request));
  request.set_mechanism(v1::MECHANISM_KERNEL);
  EXPECT_OK(handler_.Load(request));
}

TEST_F(RequestHandlerTest, TransferRunsMayComeAsFlatPairs) {
  CreatePool("p");
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 8);  // pages 0, 1
  v1::TransferRequest request;
  request.set_session_id(s);
  request.set_pool("p");
  request.set_import_id(import);
  for (uint64_t v : {1, 1, 0, 1}) request.add_host_page_pairs(v);  // page 1, page 0
  for (uint64_t v : {20, 4, 2, 4}) request.add_device_slot_pairs(v);
  auto op = handler_.Backup(request);
  ASSERT_OK(op);
  EXPECT_EQ(8u, op->num_tokens());
  sessions_.Get(s).value()->signals()->AwaitIdle();

  v1::TransferRequest both = request;
  both.add_host_pages()->set_num_pages(1);
  EXPECT_ERROR(InvalidArgument, handler_.Load(both));
  both = request;
  both.add_device_slots()->set_num_slots(1);
  EXPECT_ERROR(InvalidArgument, handler_.Load(both));
  v1::TransferRequest odd = request;
  odd.add_host_page_pairs(3);
  EXPECT_ERROR(InvalidArgument, handler_.Load(odd));
  v1::TransferRequest empty_run = request;
  empty_run.set_host_page_pairs(1, 0);
  EXPECT_ERROR(InvalidArgument, handler_.Load(empty_run));
  v1::TransferRequest far = request;
  far.set_device_slot_pairs(0, kDeviceSlots - 1);
  EXPECT_ERROR(InvalidArgument, handler_.Load(far));
  v1::TransferRequest twice = request;
  twice.set_host_page_pairs(2, 1);  // page 1 twice
  EXPECT_ERROR(InvalidArgument, handler_.Load(twice));
  EXPECT_OK(handler_.Load(request));
}

TEST_F(RequestHandlerTest, LoadCopiesOnlyTheRequestedLayers) {
  CreatePool("p");
  const SessionId s = OpenSession();
  const uint64_t import = Register(s);
  Alloc(s, 8);
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint64_t t = 0; t < 8; ++t)
        std::memset(DeviceRow(kv, l, 10 + t), 1 + kv + 2 * l, kStride);
  auto backup = handler_.Backup(Transfer(s, import, 0, 2, 10, 8));
  ASSERT_OK(backup);
  auto session = sessions_.Get(s).value();
  session->signals()->AwaitIdle();
  auto load = Transfer(s, import, 0, 2, 40, 8);
  load.set_layer_begin(1);
  load.set_layer_end(2);
  auto op = handler_.Load(load);
  ASSERT_OK(op);
  EXPECT_EQ(1u, op->num_layers());
  EXPECT_EQ(8u, op->num_tokens());
  EXPECT_EQ(8u * 2 * kStride, op->bytes());
  session->signals()->AwaitIdle();
  for (uint32_t kv = 0; kv < 2; ++kv) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      const uint8_t want = l == 1 ? 1 + kv + 2 * l : 0;
      for (uint64_t t = 0; t < 8; ++t) {
        ASSERT_EQ(want, DeviceRow(kv, l, 40 + t)[0]) << kv << " " << l << " " << t;
        ASSERT_EQ(want, DeviceRow(kv, l, 40 + t)[kStride - 1]);
      }
    }
  }
}

// UnregisterDeviceBuffers returns only once no copy uses the buffers: the
// engine may free them right after. The import is then closed (the pool
// counts no registration). Copies of 64 MiB each keep the queue busy when
// the call comes.
TEST_F(RequestHandlerTest, UnregisterWaitsForTheImportsCopies) {
  constexpr uint32_t kBigHeads = 8, kBigHeadDim = 1024;  // bf16: 16 KiB rows
  constexpr uint64_t kBigStride = kBigHeads * kBigHeadDim * 2;
  constexpr uint64_t kBigSlots = 1024;
  v1::CreatePoolRequest create;
  *create.mutable_spec() = Spec("big");
  auto* mha = create.mutable_spec()->mutable_geometry()->mutable_mha();
  mha->set_num_kv_heads(kBigHeads);
  mha->set_head_dim(kBigHeadDim);
  create.mutable_spec()->set_capacity_tokens(kBigSlots);
  create.set_session_id(OpenSession());
  ASSERT_OK(handler_.CreatePool(create));
  ShmSegment device = *ShmSegment::Create(
      absl::StrCat("/hostkv-test-big.", getpid()),
      2 * kLayers * kBigSlots * kBigStride, 0600);
  const SessionId s = OpenSession();
  v1::RegisterDeviceBuffersRequest registration;
  registration.set_session_id(s);
  registration.set_pool("big");
  registration.set_token_slots(kBigSlots);
  for (uint32_t i = 0; i < 2 * kLayers; ++i) {
    v1::DeviceBuffer* b = i % 2 == 0 ? registration.add_k_buffers()
                                     : registration.add_v_buffers();
    b->set_shm_name(device.name());
    b->set_offset(i * kBigSlots * kBigStride);
    b->set_size(kBigSlots * kBigStride);
  }
  auto import = handler_.RegisterDeviceBuffers(registration);
  ASSERT_OK(import);
  Alloc(s, kBigSlots, "big");
  auto session = sessions_.Get(s).value();
  for (int i = 0; i < 4; ++i) {  // as many as the session's records allow
    v1::TransferRequest backup = Transfer(s, import->import_id(), 0,
                                          kBigSlots / kPageSize, 0, kBigSlots);
    backup.set_pool("big");
    ASSERT_OK(handler_.Backup(backup));
  }
  ASSERT_GT(session->signals()->in_flight(), 0u);
  v1::UnregisterDeviceBuffersRequest unregister;
  unregister.set_session_id(s);
  unregister.set_import_id(import->import_id());
  ASSERT_OK(handler_.UnregisterDeviceBuffers(unregister));
  EXPECT_EQ(0u, session->signals()->in_flight());
  EXPECT_EQ(0u, pools_.Get("big").value()->import_count());
  EXPECT_ERROR(NotFound, handler_.UnregisterDeviceBuffers(unregister));
}

TEST_F(RequestHandlerTest, PageIoChecksSizes) {
  CreatePool("p");
  const SessionId s = OpenSession();
  Alloc(s, 16 * kPageSize);
  const uint64_t page_bytes = 2 * kLayers * kPageSize * kStride;  // 768
  v1::WritePagesRequest write;
  write.set_session_id(s);
  write.set_pool("p");
  auto* run = write.add_pages();
  run->set_first_page(3);
  run->set_num_pages(2);
  write.set_data(std::string(2 * page_bytes - 1, 'x'));
  EXPECT_ERROR(InvalidArgument, handler_.WritePages(write));
  write.set_data(std::string(2 * page_bytes, 'x'));
  ASSERT_OK(handler_.WritePages(write));
  v1::ReadPagesRequest read;
  read.set_session_id(s);
  read.set_pool("p");
  *read.mutable_pages() = write.pages();
  auto data = handler_.ReadPages(read);
  ASSERT_OK(data);
  EXPECT_EQ(write.data(), data->data());
  read.mutable_pages(0)->set_first_page(0);
  read.mutable_pages(0)->set_num_pages(16);  // 12 KiB > the 64 KiB limit? no
  EXPECT_OK(handler_.ReadPages(read));
  RequestHandler tight(RequestLimits{page_bytes, Prefix()}, &budget_, &pools_,
                       &sessions_, &transfers_);
  EXPECT_ERROR(InvalidArgument, tight.ReadPages(read));
}

TEST_F(RequestHandlerTest, CloseSessionReleasesEverything) {
  CreatePool("p");
  const SessionId s = OpenSession();
  Register(s);
  Alloc(s, 12);
  v1::DeletePoolRequest del;
  del.set_pool("p");
  del.set_session_id(s);
  EXPECT_ERROR(FailedPrecondition, handler_.DeletePool(del));
  v1::CloseSessionRequest close;
  close.set_session_id(s);
  auto closed = handler_.CloseSession(close);
  ASSERT_OK(closed);
  EXPECT_EQ(3u, closed->pages_freed());
  EXPECT_EQ(1u, closed->imports_closed());
  EXPECT_ERROR(NotFound, handler_.CloseSession(close));
  EXPECT_ERROR(NotFound, handler_.DeletePool(del));  // the session is gone
  del.set_session_id(OpenSession());
  EXPECT_OK(handler_.DeletePool(del));
  EXPECT_ERROR(NotFound, handler_.DeletePool(del));
  v1::CloseSessionRequest last;
  last.set_session_id(del.session_id());
  ASSERT_OK(handler_.CloseSession(last));
  EXPECT_EQ(0u, budget_.reserved_bytes());
}

TEST_F(RequestHandlerTest, StatsShowUsagePerSession) {
  CreatePool("p");
  const SessionId a = OpenSession();
  const SessionId b = OpenSession();
  Alloc(a, 8);
  Alloc(b, 20);
  Register(b);
  auto stats = handler_.GetPoolStats(v1::GetPoolStatsRequest());
  ASSERT_OK(stats);
  ASSERT_EQ(1, stats->pools_size());
  const v1::PoolStats& p = stats->pools(0);
  EXPECT_EQ(16u, p.capacity_pages());
  EXPECT_EQ(7u, p.used_pages());
  EXPECT_EQ(9u, p.free_pages());
  EXPECT_EQ(28u, p.used_tokens());
  EXPECT_EQ(7u * 2 * kLayers * kPageSize * kStride, p.used_bytes());
  ASSERT_EQ(2, p.sessions_size());
  uint64_t pages_a = 0, pages_b = 0, imports_b = 0;
  for (const auto& su : p.sessions()) {
    if (su.session_number() == numbers_[a]) pages_a = su.pages();
    if (su.session_number() == numbers_[b]) {
      pages_b = su.pages();
      imports_b = su.imports();
    }
  }
  EXPECT_EQ(2u, pages_a);
  EXPECT_EQ(5u, pages_b);
  EXPECT_EQ(1u, imports_b);
  EXPECT_EQ(2u, stats->open_sessions());
  ASSERT_EQ(2, stats->sessions_size());
  for (const v1::SessionInfo& info : stats->sessions()) {
    EXPECT_TRUE(info.attached());
    EXPECT_EQ(static_cast<uint32_t>(getpid()), info.pid());
    EXPECT_EQ(info.session_number() == numbers_[a] ? 2u : 5u, info.pages());
  }
}

TEST_F(RequestHandlerTest, UnattachedSessionCannotRegisterShmNames) {
  const SessionId s = OpenSession(/*attach=*/false);
  v1::CreatePoolRequest create;  // the unverified session's own pool
  *create.mutable_spec() = Spec("u");
  create.set_session_id(s);
  ASSERT_OK(handler_.CreatePool(create));
  EXPECT_ERROR(FailedPrecondition,
               handler_.RegisterDeviceBuffers(Registration(s, "u")));
  RequestLimits trusting{1 << 16, Prefix()};
  trusting.allow_unverified_shm_names = true;
  RequestHandler handler(trusting, &budget_, &pools_, &sessions_, &transfers_);
  EXPECT_OK(handler.RegisterDeviceBuffers(Registration(s, "u")));
}

TEST_F(RequestHandlerTest, SegmentsOfAnotherUserAreRefused) {
  CreatePool("p");
  auto r = handler_.OpenSession(v1::OpenSessionRequest());
  ASSERT_OK(r);
  // The segments are this process's; the peer claims another uid.
  const uint32_t other_uid = getuid() + 4242;
  ASSERT_OK(handler_.AttachSession(r->session_id(),
                                   PeerCredentials{1, other_uid, other_uid}));
  v1::CreatePoolRequest create;  // a pool the other user may use
  *create.mutable_spec() = Spec("o");
  create.set_session_id(r->session_id());
  ASSERT_OK(handler_.CreatePool(create));
  auto refused = handler_.RegisterDeviceBuffers(Registration(r->session_id(), "o"));
  EXPECT_ERROR(PermissionDenied, refused);
  EXPECT_NE(std::string::npos, refused.status().message().find("belongs to uid"))
      << refused.status();
  EXPECT_ERROR(FailedPrecondition,
               handler_.AttachSession(r->session_id(), PeerCredentials{}));
}

TEST_F(RequestHandlerTest, IdleUnattachedSessionsExpire) {
  const SessionId idle = OpenSession(/*attach=*/false);
  v1::CreatePoolRequest create;  // usable by unverified sessions (and root)
  *create.mutable_spec() = Spec("p");
  create.set_session_id(idle);
  ASSERT_OK(handler_.CreatePool(create));
  const SessionId attached = OpenSession();
  Alloc(idle, 8);
  Alloc(attached, 8);
  handler_.ExpireIdleSessions(absl::Hours(1));  // nobody is that idle
  EXPECT_OK(sessions_.Get(idle));
  absl::SleepFor(absl::Milliseconds(5));
  handler_.ExpireIdleSessions(absl::Milliseconds(1));
  auto expired = sessions_.Get(idle);
  EXPECT_ERROR(NotFound, expired);
  EXPECT_NE(std::string::npos, expired.status().message().find("lease expired"))
      << expired.status();
  EXPECT_OK(sessions_.Get(attached));  // attached sessions have no lease
  EXPECT_EQ(14u, pools_.Get("p").value()->allocator().free_pages());
  EXPECT_OK(handler_.EndSession(attached, "test"));
  EXPECT_ERROR(NotFound, handler_.EndSession(attached, "test"));
  EXPECT_EQ(16u, pools_.Get("p").value()->allocator().free_pages());
}

TEST_F(RequestHandlerTest, HandOverMovesOwnership) {
  CreatePool("p");
  const SessionId old_engine = OpenSession();
  const SessionId new_engine = OpenSession();
  Alloc(old_engine, 12);  // pages 0..2
  v1::HandOverPagesRequest request;
  request.set_session_id(old_engine);
  request.set_pool("p");
  auto* run = request.add_pages();
  run->set_first_page(0);
  run->set_num_pages(3);
  request.set_to_session_number(numbers_[new_engine] + 1000);
  EXPECT_ERROR(NotFound, handler_.HandOverPages(request));
  request.set_to_session_number(numbers_[new_engine]);
  auto moved = handler_.HandOverPages(request);
  ASSERT_OK(moved);
  EXPECT_EQ(3u, moved->pages());
  EXPECT_ERROR(FailedPrecondition, handler_.HandOverPages(request));
  EXPECT_ERROR(FailedPrecondition, Free(old_engine, 0, 3));
  v1::CloseSessionRequest close;
  close.set_session_id(old_engine);
  EXPECT_EQ(0u, handler_.CloseSession(close)->pages_freed());
  EXPECT_OK(Free(new_engine, 0, 3));
}

// Pages cannot be handed to a session that may not use their pool: it
// would then read and write them.
TEST_F(RequestHandlerTest, HandOverToASessionThePoolRefusesIsDenied) {
  CreatePool("p");  // this uid's, access owner
  const SessionId owner = OpenSession();
  Alloc(owner, 4);
  auto r = handler_.OpenSession(v1::OpenSessionRequest());
  ASSERT_OK(r);
  const uint32_t other_uid = getuid() + 4242;
  ASSERT_OK(handler_.AttachSession(r->session_id(),
                                   PeerCredentials{1, other_uid, other_uid}));
  v1::HandOverPagesRequest request;
  request.set_session_id(owner);
  request.set_pool("p");
  auto* run = request.add_pages();
  run->set_first_page(0);
  run->set_num_pages(1);
  request.set_to_session_number(r->session_number());
  EXPECT_ERROR(PermissionDenied, handler_.HandOverPages(request));
  EXPECT_OK(Free(owner, 0, 1));  // still the owner's
}

TEST_F(RequestHandlerTest, PageBufferMetaChecksRange) {
  CreatePool("p");
  v1::GetPageBufferMetaRequest request;
  request.set_pool("p");
  auto* run = request.add_pages();
  run->set_first_page(15);
  run->set_num_pages(2);
  EXPECT_ERROR(InvalidArgument, handler_.GetPageBufferMeta(request));
  run->set_num_pages(1);
  auto meta = handler_.GetPageBufferMeta(request);
  ASSERT_OK(meta);
  ASSERT_EQ(2, meta->pieces_size());  // page_first: K then V
  EXPECT_EQ(15u * kPageSize * kLayers * kStride, meta->pieces(0).offset());
  EXPECT_EQ(kLayers * kPageSize * kStride, meta->pieces(0).size());
}

TEST_F(RequestHandlerTest, ShutdownRefusesNewWork) {
  CreatePool("p");
  const SessionId s = OpenSession();
  handler_.BeginShutdown();
  v1::AllocRequest request;
  request.set_session_id(s);
  request.set_pool("p");
  request.set_num_tokens(4);
  EXPECT_ERROR(Unavailable, handler_.Alloc(request));
  EXPECT_ERROR(Unavailable, handler_.OpenSession(v1::OpenSessionRequest()));
  EXPECT_OK(handler_.GetPoolStats(v1::GetPoolStatsRequest()));
}

}  // namespace
}  // namespace hostkv
