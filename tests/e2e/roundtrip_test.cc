// The real daemon, driven through the client library: every layout, MHA and
// MLA, page sizes 1/16/64, both mechanisms; bytes compared after backup ->
// clear -> load, with scattered host pages and unaligned device slots.
#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"
#include "proto/contract/shm_segment.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/pool_segment.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

using Param = std::tuple<bool /*mla*/, v1::Layout, uint32_t /*page*/,
                         v1::CopyMechanism>;

uint8_t Pattern(uint32_t kv, uint32_t layer, uint64_t row, uint64_t i) {
  uint64_t h = (kv + 1) * 0x9E3779B97F4A7C15ull ^ (layer + 1) * 0xC2B2AE3D27D4EB4Full ^
               (row + 1) * 0x165667B19E3779F9ull ^ (i + 1) * 0x27D4EB2F165667C5ull;
  h ^= h >> 29;
  return static_cast<uint8_t>(h * 0xBF58476D1CE4E5B9ull >> 56);
}

class RoundTripTest : public ::testing::TestWithParam<Param> {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new testing::DaemonProcess();
    ASSERT_TRUE(daemon_->started()) << daemon_->log();
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }

  void SetUp() override {
    auto [mla, layout, page_size, mechanism] = GetParam();
    mla_ = mla;
    ps_ = page_size;
    mechanism_ = mechanism;
    auto client = Client::Connect(daemon_->target(), "roundtrip");
    ASSERT_OK(client);
    client_ = std::move(*client);
    v1::PoolSpec spec;
    name_ = absl::StrCat(mla ? "mla-" : "mha-", v1::Layout_Name(layout), "-",
                         page_size, "-", v1::CopyMechanism_Name(mechanism));
    spec.set_name(name_);
    spec.set_layout(layout);
    spec.set_page_size(page_size);
    spec.set_capacity_tokens(32 * page_size);
    spec.mutable_geometry()->set_dtype(v1::DTYPE_BF16);
    if (mla) {
      spec.mutable_geometry()->mutable_mla()->set_num_layers(kLayers);
      spec.mutable_geometry()->mutable_mla()->set_kv_lora_rank(12);
      spec.mutable_geometry()->mutable_mla()->set_qk_rope_head_dim(4);
    } else {
      spec.mutable_geometry()->mutable_mha()->set_num_layers(kLayers);
      spec.mutable_geometry()->mutable_mha()->set_num_kv_heads(3);
      spec.mutable_geometry()->mutable_mha()->set_head_dim(8);
    }
    auto pool = client_->CreatePool(spec);
    ASSERT_OK(pool);
    pool_ = *pool;
    planes_ = mla ? 1 : 2;
    stride_ = pool_.token_stride();
  }

  void TearDown() override {
    if (client_ != nullptr) {
      EXPECT_OK(client_->Close());
      client_.reset();
      EXPECT_OK(Client::Connect(daemon_->target(), "cleanup").value()->DeletePool(name_));
    }
  }

  // K planes live in one segment and V planes in another, all layers each.
  void MakeDevice(uint64_t slots) {
    slots_ = slots;
    for (uint32_t kv = 0; kv < planes_; ++kv) {
      auto buffer = ShmDeviceBuffer::Create(kLayers * slots * stride_);
      ASSERT_OK(buffer);
      device_.push_back(std::make_unique<ShmDeviceBuffer>(std::move(*buffer)));
    }
    std::vector<v1::DeviceBuffer> k, v;
    for (uint32_t l = 0; l < kLayers; ++l) {
      k.push_back(device_[0]->Describe(l * slots * stride_, slots * stride_));
      if (planes_ == 2) {
        v.push_back(device_[1]->Describe(l * slots * stride_, slots * stride_));
      }
    }
    auto import = client_->RegisterDeviceBuffers(name_, slots, k, v);
    ASSERT_OK(import);
    import_ = *import;
  }

  uint8_t* Row(uint32_t kv, uint32_t layer, uint64_t slot) {
    return device_[kv]->data() + (layer * slots_ + slot) * stride_;
  }

  // Device slot of position i in the concatenation of `runs`.
  static uint64_t SlotAt(const std::vector<SlotRange>& runs, uint64_t i) {
    for (const SlotRange& r : runs) {
      if (i < r.num_slots) return r.first_slot + i;
      i -= r.num_slots;
    }
    return UINT64_MAX;
  }

  // Host pages with holes: pages 1, 3, 5 then a run of three. (Not by
  // reusing freed pages: those come back only once the scrubber zeroed them.)
  std::vector<PageRange> ScatteredPages() {
    std::vector<PageRange> pages;
    for (uint64_t p = 0; p < 8; ++p) {
      auto one = client_->Alloc(name_, ps_);
      EXPECT_OK(one);
      EXPECT_EQ(1u, one->size());
      EXPECT_EQ(p, one->front().first_page);
      if (p % 2 == 1 && p < 6) pages.push_back(one->front());
    }
    auto run = client_->Alloc(name_, 3 * ps_);
    EXPECT_OK(run);
    pages.insert(pages.end(), run->begin(), run->end());
    EXPECT_OK(client_->Free(name_, {{0, 1}, {2, 1}, {4, 1}, {6, 2}}));
    return pages;
  }

  static constexpr uint32_t kLayers = 3;
  static inline testing::DaemonProcess* daemon_ = nullptr;
  std::unique_ptr<Client> client_;
  std::string name_;
  v1::Pool pool_;
  bool mla_ = false;
  uint32_t ps_ = 1, planes_ = 2;
  uint64_t stride_ = 0, slots_ = 0, import_ = 0;
  v1::CopyMechanism mechanism_;
  std::vector<std::unique_ptr<ShmDeviceBuffer>> device_;
};

TEST_P(RoundTripTest, BackupClearLoadRestoresEveryByte) {
  const uint64_t tokens = 6 * ps_;
  MakeDevice(2 * tokens + 32);
  const std::vector<PageRange> pages = ScatteredPages();
  ASSERT_EQ(4u, pages.size());  // {1}, {3}, {5}, {8..10}
  const std::vector<SlotRange> from = {{tokens + 7, tokens / 2},
                                       {3, tokens - tokens / 2}};
  const std::vector<SlotRange> to = {{1, tokens / 3},
                                     {tokens + 20, tokens - tokens / 3}};
  for (uint32_t kv = 0; kv < planes_; ++kv)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint64_t i = 0; i < tokens; ++i)
        for (uint64_t b = 0; b < stride_; ++b)
          Row(kv, l, SlotAt(from, i))[b] = Pattern(kv, l, i, b);

  TransferOptions options;
  options.mechanism = mechanism_;
  auto backup = client_->Backup(name_, import_, pages, from, options);
  ASSERT_OK(backup);
  EXPECT_EQ(kLayers, backup->num_layers);
  EXPECT_EQ(tokens, backup->num_tokens);
  EXPECT_EQ(tokens * planes_ * kLayers * stride_, backup->bytes);
  ASSERT_OK(client_->Wait(*backup));
  for (auto& d : device_) std::memset(d->data(), 0, d->size());

  auto load = client_->Load(name_, import_, pages, to, options);
  ASSERT_OK(load);
  uint64_t wrong = 0;
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_OK(client_->WaitLayer(*load, l));
    for (uint32_t kv = 0; kv < planes_; ++kv)
      for (uint64_t i = 0; i < tokens; ++i)
        for (uint64_t b = 0; b < stride_; ++b)
          wrong += Row(kv, l, SlotAt(to, i))[b] != Pattern(kv, l, i, b);
  }
  EXPECT_EQ(0u, wrong);
  // Nothing outside the destination slots was written.
  uint64_t stray = 0;
  for (uint32_t kv = 0; kv < planes_; ++kv)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint64_t s = 0; s < slots_; ++s) {
        const bool target = (s >= to[0].first_slot && s < to[0].first_slot + to[0].num_slots) ||
                            (s >= to[1].first_slot && s < to[1].first_slot + to[1].num_slots);
        if (target) continue;
        for (uint64_t b = 0; b < stride_; ++b) stray += Row(kv, l, s)[b] != 0;
      }
  EXPECT_EQ(0u, stray);
}

TEST_P(RoundTripTest, FlatPagesWrittenElsewhereLoadTheSameBytes) {
  const uint64_t tokens = 6 * ps_;
  MakeDevice(tokens + ps_);
  const std::vector<PageRange> pages = ScatteredPages();
  for (uint32_t kv = 0; kv < planes_; ++kv)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint64_t i = 0; i < tokens; ++i)
        for (uint64_t b = 0; b < stride_; ++b)
          Row(kv, l, ps_ + i)[b] = Pattern(kv, l, i, b);
  auto backup = client_->Backup(name_, import_, pages, {{ps_, tokens}});
  ASSERT_OK(backup);
  ASSERT_OK(client_->Wait(*backup));

  auto flat = client_->ReadPages(name_, pages);
  ASSERT_OK(flat);
  ASSERT_EQ(6 * pool_.page_bytes(), flat->size());
  auto copies = client_->Alloc(name_, tokens);
  ASSERT_OK(copies);
  ASSERT_OK(client_->WritePages(name_, *copies, *flat));
  auto again = client_->ReadPages(name_, *copies);
  ASSERT_OK(again);
  EXPECT_EQ(*flat, *again);

  for (auto& d : device_) std::memset(d->data(), 0, d->size());
  auto load = client_->Load(name_, import_, *copies, {{ps_, tokens}});
  ASSERT_OK(load);
  ASSERT_OK(client_->Wait(*load));
  uint64_t wrong = 0;
  for (uint32_t kv = 0; kv < planes_; ++kv)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint64_t i = 0; i < tokens; ++i)
        for (uint64_t b = 0; b < stride_; ++b)
          wrong += Row(kv, l, ps_ + i)[b] != Pattern(kv, l, i, b);
  EXPECT_EQ(0u, wrong);
}

TEST_P(RoundTripTest, PageBufferMetaPointsAtThePageBytes) {
  auto pages = client_->Alloc(name_, 2 * ps_);
  ASSERT_OK(pages);
  std::string data(2 * pool_.page_bytes(), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(Pattern(0, 0, 0, i));
  ASSERT_OK(client_->WritePages(name_, *pages, data));
  auto meta = client_->GetPageBufferMeta(name_, *pages);
  ASSERT_OK(meta);
  EXPECT_EQ(meta->segment_name(), pool_.segment_name());
  auto segment = testing::MapPoolSegment(*client_, name_);
  ASSERT_OK(segment);
  // layer_first lists, per page, (K, V) per layer; its flat page holds all K
  // layers, then all V layers. Every other layout lists K then V, as the
  // flat page does.
  const bool per_layer = pool_.spec().layout() == v1::LAYOUT_LAYER_FIRST;
  const size_t per_page = meta->pieces_size() / 2;
  std::string gathered;
  for (int page = 0; page < 2; ++page) {
    for (uint32_t kv = 0; kv < planes_; ++kv) {
      for (size_t j = 0; j < per_page; ++j) {
        const size_t idx = page * per_page + j;
        const uint32_t piece_kv = per_layer ? j % planes_ : j / (per_page / planes_);
        if (piece_kv != kv) continue;
        const auto& piece = meta->pieces(static_cast<int>(idx));
        ASSERT_LE(piece.offset() + piece.size(), segment->size());
        gathered.append(reinterpret_cast<const char*>(segment->data()) + piece.offset(),
                        piece.size());
      }
    }
  }
  EXPECT_EQ(data.size(), gathered.size());
  EXPECT_TRUE(data == gathered);
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  auto [mla, layout, ps, mechanism] = info.param;
  return absl::StrCat(mla ? "Mla" : "Mha", "_", v1::Layout_Name(layout).substr(7),
                      "_ps", ps, "_", v1::CopyMechanism_Name(mechanism).substr(10));
}

INSTANTIATE_TEST_SUITE_P(
    Mha, RoundTripTest,
    ::testing::Combine(::testing::Values(false),
                       ::testing::Values(v1::LAYOUT_LAYER_FIRST, v1::LAYOUT_PAGE_FIRST,
                                         v1::LAYOUT_PAGE_FIRST_DIRECT,
                                         v1::LAYOUT_PAGE_HEAD),
                       ::testing::Values(1u, 16u, 64u),
                       ::testing::Values(v1::MECHANISM_KERNEL, v1::MECHANISM_DIRECT)),
    ParamName);
INSTANTIATE_TEST_SUITE_P(
    Mla, RoundTripTest,
    ::testing::Combine(::testing::Values(true),
                       ::testing::Values(v1::LAYOUT_LAYER_FIRST, v1::LAYOUT_PAGE_FIRST,
                                         v1::LAYOUT_PAGE_FIRST_DIRECT),
                       ::testing::Values(1u, 16u, 64u),
                       ::testing::Values(v1::MECHANISM_KERNEL, v1::MECHANISM_DIRECT)),
    ParamName);

}  // namespace
}  // namespace hostkv
