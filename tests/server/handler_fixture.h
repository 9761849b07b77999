// The request layer over the real pools, allocator, sessions and copy
// engine (no gRPC): the fixture of request_handler_test and
// cache_requests_test.
#ifndef HOSTKV_TESTS_SERVER_HANDLER_FIXTURE_H_
#define HOSTKV_TESTS_SERVER_HANDLER_FIXTURE_H_

#include <unistd.h>

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "proto/contract/shm_segment.h"
#include "server/service/request_handler.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {

constexpr uint32_t kLayers = 3;
constexpr uint32_t kHeads = 2;
constexpr uint32_t kHeadDim = 4;
constexpr uint32_t kPageSize = 4;
constexpr uint64_t kDeviceSlots = 64;
constexpr uint64_t kStride = kHeads * kHeadDim * 2;  // bf16

inline std::string Prefix() { return absl::StrCat("/hostkv-test.", getpid(), "."); }

// The handler over real parts; `limits` default to 64 KiB page I/O and the
// test's segment prefix.
class HandlerFixture : public ::testing::Test {
 protected:
  explicit HandlerFixture(RequestLimits limits = RequestLimits{1 << 16, Prefix()},
                          CacheOptions cache = {})
      : budget_(0, 0, [] { return uint64_t{1} << 40; }),
        pools_(&budget_, Prefix(), PoolFillOptions{1}, nullptr, PoolQuota{}, cache),
        sessions_(Prefix(), 4),
        transfers_(2, nullptr),
        handler_(std::move(limits), &budget_, &pools_, &sessions_, &transfers_) {}

  // Opens a session and attaches it as this process (as the session socket
  // would); `attach` false leaves it unattached.
  // `uid` is the peer's (a session of another user, as far as the handler
  // can tell).
  SessionId OpenSession(bool attach = true, uint32_t uid = getuid()) {
    auto r = handler_.OpenSession(v1::OpenSessionRequest());
    EXPECT_OK(r);
    if (!r.ok()) return SessionId();
    {
      absl::MutexLock lock(&numbers_mu_);  // tests open sessions from threads
      numbers_[r->session_id()] = r->session_number();
    }
    if (attach) {
      EXPECT_OK(handler_.AttachSession(
          r->session_id(),
          PeerCredentials{static_cast<uint32_t>(getpid()), uid,
                          uid == getuid() ? getgid() : uid}));
    }
    return r->session_id();
  }

  v1::PoolSpec Spec(const std::string& name, uint64_t tokens = 60) {
    v1::PoolSpec spec;
    spec.set_name(name);
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    auto* mha = spec.mutable_geometry()->mutable_mha();
    mha->set_num_layers(kLayers);
    mha->set_num_kv_heads(kHeads);
    mha->set_head_dim(kHeadDim);
    spec.set_page_size(kPageSize);
    spec.set_layout(v1::LAYOUT_PAGE_FIRST);
    spec.set_capacity_tokens(tokens);  // 64 slots = 16 pages
    return spec;
  }

  // Creates pool `name` as this process's uid, through a session that
  // closes again, and waits until all its memory is resident (a pool fills
  // in the background: pages not yet resident are handed out to nobody,
  // the tier's fetches included).
  void CreatePool(const std::string& name) {
    v1::CreatePoolRequest request;
    *request.mutable_spec() = Spec(name);
    request.set_session_id(OpenSession());
    ASSERT_OK(handler_.CreatePool(request));
    v1::CloseSessionRequest close;
    close.set_session_id(request.session_id());
    ASSERT_OK(handler_.CloseSession(close));
    auto pool = pools_.Get(name);
    ASSERT_OK(pool);
    ASSERT_OK((*pool)->WaitFilled());
  }

  v1::AllocResponse Alloc(const SessionId& session, uint64_t tokens,
                          const std::string& pool = "p") {
    v1::AllocRequest request;
    request.set_session_id(session);
    request.set_pool(pool);
    request.set_num_tokens(tokens);
    auto r = handler_.Alloc(request);
    EXPECT_OK(r);
    return r.ok() ? *r : v1::AllocResponse();
  }

  absl::StatusOr<v1::FreeResponse> Free(const SessionId& session, uint64_t first,
                                        uint64_t count) {
    v1::FreeRequest request;
    request.set_session_id(session);
    request.set_pool("p");
    auto* run = request.add_pages();
    run->set_first_page(first);
    run->set_num_pages(count);
    return handler_.Free(request);
  }

  // One device segment holding K and V of every layer, kDeviceSlots rows.
  v1::RegisterDeviceBuffersRequest Registration(const SessionId& session,
                                                const std::string& pool = "p") {
    if (device_.data() == nullptr) {
      device_ = *ShmSegment::Create(
          absl::StrCat("/hostkv-test-dev.", getpid(), ".", counter_++),
          2 * kLayers * kDeviceSlots * kStride, 0600);
    }
    v1::RegisterDeviceBuffersRequest request;
    request.set_session_id(session);
    request.set_pool(pool);
    request.set_token_slots(kDeviceSlots);
    for (uint32_t i = 0; i < 2 * kLayers; ++i) {
      v1::DeviceBuffer* b =
          i % 2 == 0 ? request.add_k_buffers() : request.add_v_buffers();
      b->set_shm_name(device_.name());
      b->set_offset(i * kDeviceSlots * kStride);
      b->set_size(kDeviceSlots * kStride);
    }
    return request;
  }

  uint64_t Register(const SessionId& session, const std::string& pool = "p") {
    auto r = handler_.RegisterDeviceBuffers(Registration(session, pool));
    EXPECT_OK(r);
    return r.ok() ? r->import_id() : 0;
  }

  v1::TransferRequest Transfer(const SessionId& session, uint64_t import,
                               uint64_t first_page, uint64_t pages,
                               uint64_t first_slot, uint64_t slots) {
    v1::TransferRequest request;
    request.set_session_id(session);
    request.set_pool("p");
    request.set_import_id(import);
    auto* h = request.add_host_pages();
    h->set_first_page(first_page);
    h->set_num_pages(pages);
    auto* d = request.add_device_slots();
    d->set_first_slot(first_slot);
    d->set_num_slots(slots);
    return request;
  }

  uint8_t* DeviceRow(uint32_t kv, uint32_t layer, uint64_t slot) {
    return device_.data() + ((2 * layer + kv) * kDeviceSlots + slot) * kStride;
  }

  MemoryBudget budget_;
  PoolRegistry pools_;
  SessionRegistry sessions_;
  TransferEngine transfers_;
  RequestHandler handler_;
  ShmSegment device_;
  // Session id -> public number; written under numbers_mu_ (OpenSession may
  // run on several threads), read by test bodies once those have joined.
  absl::Mutex numbers_mu_;
  std::map<SessionId, uint32_t> numbers_;
  static inline int counter_ = 0;
};

}  // namespace hostkv

#endif  // HOSTKV_TESTS_SERVER_HANDLER_FIXTURE_H_
