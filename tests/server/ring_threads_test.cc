// A uid's command rings served by few threads (server/service/ring_threads.h):
// ceil(--ring_cpu_per_uid) threads however many rings the uid opens, each
// ring answered as its own session's, a ring added while the thread sleeps
// served at once, and rings leaving while the others go on.
#include "server/service/ring_threads.h"

#include <memory>
#include <vector>

#include "client/command_ring_client.h"
#include "server/service/ring_quota.h"
#include "server/service/ring_server.h"
#include "tests/server/handler_fixture.h"

namespace hostkv {
namespace {

class RingThreadsTest : public HandlerFixture {
 protected:
  struct Ring {
    SessionId session;
    std::unique_ptr<RingServer> server;
    std::unique_ptr<RingClient> client;
  };

  void SetUp() override { CreatePool("p"); }

  // A ring of a new session of `uid`, through `quota`.
  Ring Open(RingQuota& quota, uid_t uid) {
    Ring r;
    r.session = OpenSession();
    auto grant = quota.Grant(uid, RingSegmentBytes(kRingSlots, kRingSlotBytes));
    EXPECT_OK(grant);
    auto server = RingServer::Start(&handler_, r.session, std::move(*grant));
    EXPECT_OK(server);
    r.server = std::move(*server);
    auto fd = r.server->ClientFd();
    EXPECT_OK(fd);
    auto client = RingClient::Map(fd->get(), r.server->size());
    EXPECT_OK(client);
    r.client = std::move(*client);
    return r;
  }

  // Allocates 4 tokens (one page) over `r`'s ring; the page's first index.
  absl::StatusOr<uint64_t> AllocOver(Ring& r) {
    v1::AllocRequest request;
    request.set_pool("p");
    request.set_num_tokens(4);
    auto answer = r.client->Call(RingMethod::kAlloc, request.SerializeAsString(),
                                 absl::Seconds(10), [] { return false; });
    if (!answer.has_value()) return absl::UnimplementedError("use gRPC");
    if (!answer->ok()) return answer->status();
    v1::AllocResponse response;
    if (!response.ParseFromString(**answer) || response.pages_size() != 1) {
      return absl::InternalError("a bad answer");
    }
    return response.pages(0).first_page();
  }
};

TEST_F(RingThreadsTest, AUidsRingsShareCeilOfItsShareInThreads) {
  if (!RingThreads::CanWaitOnMany()) GTEST_SKIP() << "no futex_waitv: a thread per ring";
  RingQuota quota(RingLimits{.cpu_per_uid = 1.5}, nullptr);
  std::vector<Ring> rings;
  for (int i = 0; i < 6; ++i) rings.push_back(Open(quota, 4242));
  Ring other = Open(quota, 4343);
  // Every ring answers, each as its own session: the page is that session's.
  for (Ring& r : rings) {
    auto page = AllocOver(r);
    ASSERT_OK(page);
    EXPECT_OK(Free(r.session, *page, 1));
    EXPECT_EQ(r.server->calls(), 1u);
  }
  ASSERT_OK(AllocOver(other));
  EXPECT_EQ(quota.threads_of(4242)->threads(), 2u);  // ceil(1.5), not 6
  EXPECT_EQ(quota.threads_of(4343)->threads(), 1u);
}

TEST_F(RingThreadsTest, NoBoundIsAThreadPerRing) {
  RingQuota quota(RingLimits{.cpu_per_uid = 0}, nullptr);
  std::vector<Ring> rings;
  for (int i = 0; i < 3; ++i) rings.push_back(Open(quota, 4242));
  for (Ring& r : rings) ASSERT_OK(AllocOver(r));
  EXPECT_EQ(quota.threads_of(4242)->threads(), 3u);
}

TEST_F(RingThreadsTest, ARingAddedWhileTheThreadSleepsIsServedAtOnce) {
  if (!RingThreads::CanWaitOnMany()) GTEST_SKIP() << "no futex_waitv: a thread per ring";
  RingQuota quota(RingLimits{.cpu_per_uid = 1}, nullptr);
  Ring first = Open(quota, 4242);
  ASSERT_OK(AllocOver(first));
  absl::SleepFor(absl::Milliseconds(50));  // past the spin: asleep on one doorbell
  Ring second = Open(quota, 4242);
  EXPECT_EQ(second.server->size(), first.server->size());
  // Answered after the thread took the new ring's doorbell, not at the end
  // of its bounded (1 s) sleep.
  const absl::Time start = absl::Now();
  ASSERT_OK(AllocOver(second));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(quota.threads_of(4242)->threads(), 1u);
}

TEST_F(RingThreadsTest, RingsLeaveWhileTheOthersGoOn) {
  RingQuota quota(RingLimits{.cpu_per_uid = 1}, nullptr);
  std::vector<Ring> rings;
  for (int i = 0; i < 4; ++i) rings.push_back(Open(quota, 4242));
  for (Ring& r : rings) ASSERT_OK(AllocOver(r));
  rings[1].server->Stop();
  rings.erase(rings.begin() + 1);  // waits until its thread let it go
  rings.erase(rings.begin());
  for (Ring& r : rings) {
    ASSERT_OK(AllocOver(r));
    EXPECT_EQ(r.server->calls(), 2u);
  }
  EXPECT_EQ(quota.rings_of(4242), 2u);
  std::shared_ptr<RingThreads> threads = quota.threads_of(4242);
  EXPECT_EQ(threads->threads(), 1u);
  rings.clear();
  // The last ring gone, its thread ends.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (threads->threads() != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(threads->threads(), 0u);
  EXPECT_EQ(quota.rings_of(4242), 0u);
  EXPECT_EQ(quota.threads_of(4242), nullptr);
}

}  // namespace
}  // namespace hostkv
