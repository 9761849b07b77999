// Bad requests over the wire get precise codes, and the daemon keeps serving
// everyone else.
#include <signal.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

v1::PoolSpec Spec(const std::string& name) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_layout(v1::LAYOUT_PAGE_FIRST_DIRECT);
  spec.set_page_size(16);
  spec.set_capacity_tokens(1024);
  spec.mutable_geometry()->set_dtype(v1::DTYPE_FP16);
  spec.mutable_geometry()->mutable_mha()->set_num_layers(2);
  spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(2);
  spec.mutable_geometry()->mutable_mha()->set_head_dim(16);
  return spec;
}

class ErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.started()) << daemon_.log();
    alice_ = std::move(Client::Connect(daemon_.target(), "alice").value());
    bob_ = std::move(Client::Connect(daemon_.target(), "bob").value());
    ASSERT_OK(alice_->CreatePool(Spec("p")));
  }
  testing::DaemonProcess daemon_{{"--max_page_io=1MiB"}};
  std::unique_ptr<Client> alice_, bob_;
};

TEST_F(ErrorsTest, EachMistakeGetsItsCode) {
  EXPECT_ERROR(NotFound, alice_->Alloc("nope", 16));
  EXPECT_ERROR(InvalidArgument, alice_->Alloc("p", 17));
  auto pages = alice_->Alloc("p", 64);
  ASSERT_OK(pages);
  EXPECT_ERROR(InvalidArgument, alice_->Free("p", {{1000, 1}}));
  EXPECT_ERROR(FailedPrecondition, bob_->Free("p", *pages));
  EXPECT_ERROR(FailedPrecondition, bob_->ReadPages("p", *pages));
  ASSERT_OK(alice_->Free("p", *pages));
  EXPECT_ERROR(FailedPrecondition, alice_->Free("p", *pages));
  EXPECT_ERROR(ResourceExhausted, alice_->Alloc("p", 4096));

  v1::DeviceBuffer short_handle;
  short_handle.set_cuda_ipc_handle("0123456789");
  short_handle.set_size(1 << 20);
  EXPECT_ERROR(InvalidArgument,
               alice_->RegisterDeviceBuffers("p", 64, {short_handle, short_handle},
                                             {short_handle, short_handle}));
  v1::PoolSpec bad = Spec("bad");
  bad.set_page_size(0);
  EXPECT_ERROR(InvalidArgument, alice_->CreatePool(bad));
  EXPECT_ERROR(AlreadyExists, alice_->CreatePool(Spec("p"), false));
}

TEST_F(ErrorsTest, OversizedMessageIsRefusedByTheTransport) {
  auto pages = alice_->Alloc("p", 16);
  ASSERT_OK(pages);
  const std::string huge(3 << 20, 'x');  // over --max_page_io + 1 MiB
  EXPECT_ERROR(ResourceExhausted, alice_->WritePages("p", *pages, huge));
  EXPECT_ERROR(InvalidArgument, alice_->WritePages("p", *pages, "short"));
}

// Freed pages are zeroed before anyone gets them again: Bob, allocating the
// whole pool after Alice wrote every page and freed it (or her session
// ended), reads back only zeros.
TEST_F(ErrorsTest, FreedPagesComeBackZeroedToAnotherSession) {
  for (const bool end_session : {false, true}) {
    auto alice = Client::Connect(daemon_.target(), "alice2");
    ASSERT_OK(alice);
    auto pages = (*alice)->Alloc("p", 1024);  // the whole pool
    ASSERT_OK(pages);
    auto zeros = (*alice)->ReadPages("p", *pages);
    ASSERT_OK(zeros);
    ASSERT_FALSE(zeros->empty());
    const std::string secret(zeros->size(), '\xA5');
    ASSERT_OK((*alice)->WritePages("p", *pages, secret));
    auto written = (*alice)->ReadPages("p", *pages);
    ASSERT_OK(written);
    ASSERT_EQ(secret, *written);
    if (end_session) {
      alice->reset();  // Close: the daemon frees her pages
    } else {
      ASSERT_OK((*alice)->Free("p", *pages));
    }
    absl::StatusOr<std::vector<PageRange>> mine;
    for (int i = 0; i < 500; ++i) {  // a closed session frees asynchronously
      mine = bob_->Alloc("p", 1024);
      if (mine.ok()) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_OK(mine);
    auto read = bob_->ReadPages("p", *mine);
    ASSERT_OK(read);
    EXPECT_EQ(std::string(secret.size(), '\0'), *read) << end_session;
    ASSERT_OK(bob_->Free("p", *mine));
  }
}

TEST_F(ErrorsTest, DaemonKeepsServingAfterBadRequests) {
  auto mine = alice_->Alloc("p", 16);
  ASSERT_OK(mine);
  for (int i = 0; i < 50; ++i) {
    EXPECT_ERROR(InvalidArgument, alice_->Free("p", {{UINT64_MAX - 1, 5}}));
    EXPECT_ERROR(NotFound, alice_->Load("p", 1, *mine, {{UINT64_MAX, 16}}));
    EXPECT_ERROR(FailedPrecondition, alice_->ReadPages("p", {{7, 1}}));
  }
  // Bob still moves bytes.
  auto device = ShmDeviceBuffer::Create(4 * 32 * 64);
  ASSERT_OK(device);
  std::vector<v1::DeviceBuffer> k, v;
  for (int l = 0; l < 2; ++l) {
    k.push_back(device->Describe((2 * l) * 32 * 64, 32 * 64));
    v.push_back(device->Describe((2 * l + 1) * 32 * 64, 32 * 64));
  }
  auto import = bob_->RegisterDeviceBuffers("p", 32, k, v);
  ASSERT_OK(import);
  for (uint64_t i = 0; i < device->size(); ++i) device->data()[i] = i * 7 + 1;
  auto pages = bob_->Alloc("p", 32);
  ASSERT_OK(pages);
  auto op = bob_->Backup("p", *import, *pages, {{0, 32}});
  ASSERT_OK(op);
  ASSERT_OK(bob_->Wait(*op));
  std::vector<uint8_t> before(device->data(), device->data() + device->size());
  std::memset(device->data(), 0, device->size());
  op = bob_->Load("p", *import, *pages, {{0, 32}});
  ASSERT_OK(op);
  ASSERT_OK(bob_->Wait(*op));
  EXPECT_EQ(0, std::memcmp(before.data(), device->data(), device->size()));
  EXPECT_EQ(0, kill(daemon_.pid(), 0));
}

}  // namespace
}  // namespace hostkv
