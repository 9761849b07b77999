// The command ring, daemon side (server/service/ring_server.h) with the
// client's end (client/command_ring_client.h) and raw writes into the
// shared segment where a client misbehaves: the same handler answers as
// over gRPC, for the ring's session only, and nothing a client writes into
// the segment makes the daemon misbehave.
#include "server/service/ring_server.h"

#include <atomic>
#include <thread>
#include <vector>

#include "client/command_ring_client.h"
#include "server/service/ring_call.h"
#include "server/service/ring_quota.h"
#include "tests/server/handler_fixture.h"

namespace hostkv {
namespace {

class RingServerTest : public HandlerFixture {
 protected:
  void SetUp() override {
    CreatePool("p");
    session_ = OpenSession();
    Start(kRingSlots, kRingSlotBytes);
  }

  void Start(uint32_t slots, uint32_t slot_bytes, RingGrant grant = {}) {
    client_.reset();
    ring_.reset();
    auto ring = RingServer::Start(&handler_, session_, std::move(grant),
                                  RingServer::kDefaultSpin, slots, slot_bytes);
    ASSERT_OK(ring);
    ring_ = std::move(*ring);
    auto fd = ring_->ClientFd();
    ASSERT_OK(fd);
    auto mapped = ShmSegment::MapFd(fd->get(), "ring", ShmSegment::Access::kReadWrite);
    ASSERT_OK(mapped);
    raw_ = std::move(*mapped);
    auto client = RingClient::Map(fd->get(), ring_->size());
    ASSERT_OK(client);
    client_ = std::move(*client);
  }

  template <typename Response>
  absl::StatusOr<Response> Call(RingMethod method,
                                const google::protobuf::Message& request) {
    auto answer = client_->Call(method, request.SerializeAsString(),
                                absl::Seconds(10), [] { return false; });
    if (!answer.has_value()) return absl::UnimplementedError("use gRPC");
    if (!answer->ok()) return answer->status();
    Response response;
    if (!response.ParseFromString(**answer)) return absl::InternalError("parse");
    return response;
  }

  // Writes a slot by hand and waits for its answer: (code, answer).
  std::pair<uint32_t, std::string> RawCall(uint32_t method, const std::string& payload,
                                           uint32_t length) {
    const auto* h = reinterpret_cast<const RingHeader*>(raw_.data());
    RingSlot* slot = RingSlotAt(raw_.data(), h->slot_bytes, h->slots - 1);
    const uint64_t capacity = h->slot_bytes - sizeof(RingSlot);
    std::memcpy(RingPayload(slot), payload.data(), std::min<uint64_t>(payload.size(), capacity));
    slot->method = method;
    slot->length = length;
    slot->state.store(kSlotSubmitted);
    auto* header = reinterpret_cast<RingHeader*>(raw_.data());
    header->doorbell.fetch_add(1);
    FutexWakeShared(&header->doorbell);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (slot->state.load() != kSlotAnswered && absl::Now() < deadline) {
      FutexWaitShared(&slot->state, kSlotSubmitted, absl::Milliseconds(10));
    }
    EXPECT_EQ(slot->state.load(), kSlotAnswered);
    std::string answer(reinterpret_cast<const char*>(RingPayload(slot)),
                       std::min<uint64_t>(slot->length, capacity));
    const uint32_t code = slot->code;
    slot->state.store(kSlotFree);
    return {code, answer};
  }

  v1::AllocRequest AllocRequest(uint64_t tokens, const std::string& session = "") {
    v1::AllocRequest r;
    r.set_session_id(session);
    r.set_pool("p");
    r.set_num_tokens(tokens);
    return r;
  }

  SessionId session_;
  std::unique_ptr<RingServer> ring_;
  std::unique_ptr<RingClient> client_;
  ShmSegment raw_;
};

uint64_t Pages(const google::protobuf::RepeatedPtrField<v1::PageRun>& runs) {
  uint64_t n = 0;
  for (const auto& r : runs) n += r.num_pages();
  return n;
}

TEST_F(RingServerTest, AllocAndFreeAsTheRingsSession) {
  auto alloc = Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(8));
  ASSERT_OK(alloc);
  ASSERT_EQ(Pages(alloc->pages()), 2u);  // page size 4
  // The pages are the ring's session's: it frees them over the handler...
  const v1::PageRun run = alloc->pages(0);
  v1::FreeRequest free;
  free.set_pool("p");
  *free.add_pages() = run;
  auto freed = Call<v1::FreeResponse>(RingMethod::kFree, free);
  ASSERT_OK(freed);
  EXPECT_EQ(freed->pages_freed(), run.num_pages());
  // ...and a second free of the same pages is the handler's refusal.
  auto again = Call<v1::FreeResponse>(RingMethod::kFree, free);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
      << again.status();
  EXPECT_NE(again.status().message().find("is not allocated"), std::string::npos);
  EXPECT_EQ(ring_->calls(), 3u);
}

TEST_F(RingServerTest, TheRequestsSessionIdIsIgnored) {
  const SessionId other = OpenSession();
  auto alloc = Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(4, other));
  ASSERT_OK(alloc);
  const v1::PageRun run = alloc->pages(0);
  // Not `other`'s pages: it cannot free them...
  EXPECT_FALSE(Free(other, run.first_page(), run.num_pages()).ok());
  // ...the ring's session can.
  EXPECT_OK(Free(session_, run.first_page(), run.num_pages()));
}

TEST_F(RingServerTest, HandlerErrorsComeBackAsOverGrpc) {
  // The same refusal as the handler gives directly: an unknown pool.
  v1::AllocRequest bad = AllocRequest(4);
  bad.set_pool("nope");
  auto direct = [&] {
    v1::AllocRequest r = bad;
    r.set_session_id(session_);
    return handler_.Alloc(r).status();
  }();
  auto ring = Call<v1::AllocResponse>(RingMethod::kAlloc, bad);
  EXPECT_EQ(ring.status().code(), direct.code());
  EXPECT_EQ(ring.status().message(), direct.message());
  // A load of pages the session does not own.
  const uint64_t import = Register(session_);
  auto load = Call<v1::TransferResponse>(RingMethod::kLoad,
                                         Transfer("", import, 0, 1, 0, 4));
  EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition) << load.status();
}

TEST_F(RingServerTest, BackupAndLoadMoveBytes) {
  const uint64_t import = Register(session_);
  auto alloc = Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(4));
  ASSERT_OK(alloc);
  const uint64_t page = alloc->pages(0).first_page();
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint64_t slot = 0; slot < 4; ++slot) {
      std::memset(DeviceRow(0, layer, slot), 0x40 + layer, kStride);
      std::memset(DeviceRow(1, layer, slot), 0x50 + layer, kStride);
    }
  }
  auto backup = Call<v1::TransferResponse>(RingMethod::kBackup,
                                           Transfer("", import, page, 1, 0, 4));
  ASSERT_OK(backup);
  std::shared_ptr<Session> s = *sessions_.Get(session_);
  s->signals()->AwaitIdle();
  auto load = Call<v1::TransferResponse>(RingMethod::kLoad,
                                         Transfer("", import, page, 1, 8, 4));
  ASSERT_OK(load);
  s->signals()->AwaitIdle();
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint64_t slot = 8; slot < 12; ++slot) {
      EXPECT_EQ(DeviceRow(0, layer, slot)[0], 0x40 + layer);
      EXPECT_EQ(DeviceRow(1, layer, slot)[kStride - 1], 0x50 + layer);
    }
  }
}

TEST_F(RingServerTest, GarbageIsRefusedAndTheRingGoesOn) {
  // An unparsable request.
  auto [code, answer] = RawCall(static_cast<uint32_t>(RingMethod::kAlloc),
                                std::string(40, '\xff'), 40);
  EXPECT_EQ(code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(answer.find("not a valid Alloc request"), std::string::npos) << answer;
  // An unknown method.
  std::tie(code, answer) = RawCall(99, "", 0);
  EXPECT_EQ(code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(answer.find("unknown command ring method 99"), std::string::npos) << answer;
  // A length beyond the slot.
  std::tie(code, answer) =
      RawCall(static_cast<uint32_t>(RingMethod::kFree), "", 0xFFFFFFFFu);
  EXPECT_EQ(code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  // Nothing was allocated by any of it, and the ring still serves.
  auto alloc = Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(64));
  ASSERT_OK(alloc);
  EXPECT_EQ(Pages(alloc->pages()), 16u);  // the whole pool: none was taken
}

TEST_F(RingServerTest, AnswersThatMightNotFitGoOverGrpc) {
  Start(4, 4096);  // payload 4032 bytes
  v1::LookupRequest lookup;
  lookup.set_pool("p");
  lookup.set_namespace_("ns");
  for (int i = 0; i < 200; ++i) lookup.add_keys(absl::StrCat("k", i));
  auto answer = client_->Call(RingMethod::kLookup, lookup.SerializeAsString(),
                              absl::Seconds(10), [] { return false; });
  EXPECT_FALSE(answer.has_value());  // kRingUseGrpc: not run
  // A request that does not fit a slot is not even sent.
  lookup.clear_keys();
  lookup.add_keys(std::string(64, 'k'));
  for (int i = 0; i < 100; ++i) lookup.add_keys(std::string(60, 'a' + i % 26));
  EXPECT_FALSE(client_->Call(RingMethod::kLookup, lookup.SerializeAsString(),
                             absl::Seconds(10), [] { return false; })
                   .has_value());
  // Small calls still go through.
  ASSERT_OK(Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(4)));
}

TEST_F(RingServerTest, ListEvictionsAnswersAsTheHandler) {
  // Fill the pool with published pages, then evict three of them.
  auto alloc = Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(64));
  ASSERT_OK(alloc);
  v1::PublishRequest publish;
  publish.set_pool("p");
  publish.set_namespace_("ns");
  uint64_t n = 0;
  for (const v1::PageRun& run : alloc->pages()) {
    for (uint64_t i = 0; i < run.num_pages(); ++i) {
      v1::CacheItem* item = publish.add_items();
      item->set_key(absl::StrCat("k", n++));
      item->set_page(run.first_page() + i);
    }
  }
  ASSERT_OK(Call<v1::PublishResponse>(RingMethod::kPublish, publish));
  ASSERT_OK(Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(12)));
  v1::ListEvictionsRequest list;
  list.set_pool("p");
  list.set_namespace_("ns");
  list.set_max_keys(100);
  auto ring = Call<v1::ListEvictionsResponse>(RingMethod::kListEvictions, list);
  ASSERT_OK(ring);
  EXPECT_EQ(3, ring->keys_size());
  EXPECT_EQ(3u, ring->next());
  list.set_session_id(session_);
  auto direct = handler_.ListEvictions(list);
  ASSERT_OK(direct);
  EXPECT_EQ(direct->SerializeAsString(), ring->SerializeAsString());
  // An answer that might not fit a slot goes over gRPC.
  list.set_max_keys(65536);
  EXPECT_FALSE(client_->Call(RingMethod::kListEvictions, list.SerializeAsString(),
                             absl::Seconds(10), [] { return false; })
                   .has_value());
}

// A Publish whose page a copy still fills would wait: the ring does not run
// it (the client sends it over gRPC, which waits), and nothing changed.
TEST_F(RingServerTest, APublishThatWouldWaitGoesOverGrpc) {
  auto alloc = Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(4));
  ASSERT_OK(alloc);
  const uint64_t page = alloc->pages(0).first_page();
  auto pinned = PinnedPages::Pin(pools_.Get("p").value(), {{page, 1}},
                                 sessions_.Get(session_).value()->tag());
  ASSERT_OK(pinned);
  v1::PublishRequest publish;
  publish.set_pool("p");
  publish.set_namespace_("ns");
  v1::CacheItem* item = publish.add_items();
  item->set_key("k0");
  item->set_page(page);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(client_->Call(RingMethod::kPublish, publish.SerializeAsString(),
                             absl::Seconds(10), [] { return false; })
                   .has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not --cache_publish_wait (30 s)
  EXPECT_FALSE(pools_.Get("p").value()->cache().IsCached(page));
  pinned->Release();
  auto published = Call<v1::PublishResponse>(RingMethod::kPublish, publish);
  ASSERT_OK(published);
  EXPECT_EQ(published->cached(), 1u);
  EXPECT_TRUE(pools_.Get("p").value()->cache().IsCached(page));
}

TEST_F(RingServerTest, ConcurrentCallersShareTheSlots) {
  constexpr int kThreads = 4, kRounds = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        auto alloc = Call<v1::AllocResponse>(RingMethod::kAlloc, AllocRequest(4));
        if (!alloc.ok()) {
          ++failures;
          continue;
        }
        v1::FreeRequest free;
        free.set_pool("p");
        *free.mutable_pages() = alloc->pages();
        if (!Call<v1::FreeResponse>(RingMethod::kFree, free).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(ring_->calls(), uint64_t{2} * kThreads * kRounds);
}

// A client that re-marks a slot "submitted" writing back only the request's
// first bytes makes the daemon copy and parse all of it again: the CPU its
// uid's rings take is bounded by the uid's account, not by how often the
// client writes the word.
TEST_F(RingServerTest, ResubmissionsAreBoundByTheUidsCpuShare) {
  RingQuota quota(RingLimits{.cpu_per_uid = 0.1}, nullptr);
  auto grant = quota.Grant(4242, RingSegmentBytes(kRingSlots, kRingSlotBytes));
  ASSERT_OK(grant);
  RingCpuAccount* account = grant->cpu();
  // A second grant of the uid keeps its account once the ring is gone.
  auto keep = quota.Grant(4242, 0);
  ASSERT_OK(keep);
  Start(kRingSlots, kRingSlotBytes, std::move(*grant));
  // The largest Lookup a slot holds: thousands of keys to parse and hash.
  v1::LookupRequest lookup;
  lookup.set_pool("p");
  lookup.set_namespace_("n");
  const uint64_t capacity = kRingSlotBytes - sizeof(RingSlot);
  while (lookup.ByteSizeLong() + 80 < capacity) {
    lookup.add_keys(absl::StrCat(std::string(48, 'k'), lookup.keys_size()));
  }
  const std::string payload = lookup.SerializeAsString();
  auto* h = reinterpret_cast<RingHeader*>(raw_.data());
  for (uint32_t i = 0; i < h->slots; ++i) {
    RingSlot* slot = RingSlotAt(raw_.data(), h->slot_bytes, i);
    std::memcpy(RingPayload(slot), payload.data(), payload.size());
    slot->method = static_cast<uint32_t>(RingMethod::kLookup);
  }
  const absl::Duration window = absl::Seconds(1);
  const absl::Time end = absl::Now() + window;
  while (absl::Now() < end) {
    for (uint32_t i = 0; i < h->slots; ++i) {
      RingSlot* slot = RingSlotAt(raw_.data(), h->slot_bytes, i);
      if (slot->state.load() == kSlotSubmitted) continue;
      // The answer overwrote the request's first bytes: 256 put back.
      std::memcpy(RingPayload(slot), payload.data(), 256);
      slot->length = static_cast<uint32_t>(payload.size());
      slot->state.store(kSlotSubmitted);
    }
    h->doorbell.fetch_add(1);
    FutexWakeShared(&h->doorbell);
    absl::SleepFor(absl::Microseconds(100));
  }
  const uint64_t calls = ring_->calls();
  ring_.reset();  // the thread ends and charges what it used
  EXPECT_GT(calls, 0u);
  // 0.1 cores for 1 s and the 50 ms burst, with a pass over the 8 slots
  // that may start before the account is overdrawn.
  EXPECT_LT(account->charged(), absl::Milliseconds(100 + 50 + 150))
      << calls << " calls";
}

TEST_F(RingServerTest, StopsPromptlyWhenIdle) {
  absl::SleepFor(absl::Milliseconds(20));  // the thread sleeps on the doorbell
  const absl::Time start = absl::Now();
  ring_.reset();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

}  // namespace
}  // namespace hostkv
