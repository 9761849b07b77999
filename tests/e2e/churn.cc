#include "tests/e2e/churn.h"

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hostkv/client.h"
#include "hostkv/shm_device_buffer.h"

namespace hostkv::testing {
namespace {

constexpr uint32_t kLayers = 2;
constexpr uint32_t kPageSize = 16;
constexpr uint64_t kStride = 2 * 32 * 2;  // 2 heads x 32 dims x bf16
constexpr uint64_t kDeviceSlots = 512;

struct Held {
  std::vector<PageRange> pages;
  uint64_t tokens = 0;
  uint8_t tag = 0;  // the byte pattern the pages hold
};

class Churner {
 public:
  Churner(Client& client, std::string pool, uint64_t seed)
      : client_(client), pool_(std::move(pool)), rng_(seed) {}

  absl::Status Setup() {
    auto device = ShmDeviceBuffer::Create(2 * kLayers * kDeviceSlots * kStride);
    if (!device.ok()) return device.status();
    device_ = std::make_unique<ShmDeviceBuffer>(std::move(*device));
    std::vector<v1::DeviceBuffer> k, v;
    for (uint32_t l = 0; l < kLayers; ++l) {
      k.push_back(device_->Describe((2 * l) * kDeviceSlots * kStride, kDeviceSlots * kStride));
      v.push_back(device_->Describe((2 * l + 1) * kDeviceSlots * kStride, kDeviceSlots * kStride));
    }
    auto import = client_.RegisterDeviceBuffers(pool_, kDeviceSlots, k, v);
    if (!import.ok()) return import.status();
    import_ = *import;
    return absl::OkStatus();
  }

  void Step(ChurnResult& r) {
    ++r.operations;
    const int what = static_cast<int>(rng_() % 4);
    if (held_.empty() || (what == 0 && held_.size() < 6)) return AllocAndBackup(r);
    const size_t i = rng_() % held_.size();
    if (what == 1) return LoadAndCheck(held_[i], r);
    if (what == 2) return ReadAndCheck(held_[i], r);
    Expect(client_.Free(pool_, held_[i].pages).status(), r);
    held_.erase(held_.begin() + i);
  }

  void FreeAll(ChurnResult& r) {
    for (const Held& h : held_) Expect(client_.Free(pool_, h.pages).status(), r);
    held_.clear();
  }

 private:
  uint8_t* Row(uint32_t kv, uint32_t layer, uint64_t slot) {
    return device_->data() + ((2 * layer + kv) * kDeviceSlots + slot) * kStride;
  }
  static uint8_t Byte(uint8_t tag, uint32_t kv, uint32_t l, uint64_t i, uint64_t b) {
    return static_cast<uint8_t>(tag * 31 + kv * 7 + l * 13 + i * 3 + b);
  }
  void Expect(const absl::Status& s, ChurnResult& r) {
    if (s.ok()) return;
    if (++r.unexpected_errors == 1) r.first_error = s.ToString();
  }

  void AllocAndBackup(ChurnResult& r) {
    Held h;
    h.tokens = kPageSize * (1 + rng_() % 16);
    h.tag = static_cast<uint8_t>(rng_());
    auto pages = client_.Alloc(pool_, h.tokens);
    if (!pages.ok()) {
      if (pages.status().code() != absl::StatusCode::kResourceExhausted) {
        Expect(pages.status(), r);
      }
      return;
    }
    h.pages = *pages;
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint64_t i = 0; i < h.tokens; ++i)
          for (uint64_t b = 0; b < kStride; ++b) Row(kv, l, i)[b] = Byte(h.tag, kv, l, i, b);
    auto op = client_.Backup(pool_, import_, h.pages, {{0, h.tokens}});
    Expect(op.status(), r);
    if (op.ok()) Expect(client_.Wait(*op), r);
    held_.push_back(h);
  }

  void LoadAndCheck(const Held& h, ChurnResult& r) {
    const uint64_t at = kDeviceSlots - h.tokens;
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t l = 0; l < kLayers; ++l) std::memset(Row(kv, l, at), 0, h.tokens * kStride);
    auto op = client_.Load(pool_, import_, h.pages, {{at, h.tokens}});
    Expect(op.status(), r);
    if (!op.ok()) return;
    for (uint32_t l = 0; l < kLayers; ++l) {
      Expect(client_.WaitLayer(*op, l), r);
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint64_t i = 0; i < h.tokens; ++i)
          for (uint64_t b = 0; b < kStride; ++b, ++r.bytes_checked)
            r.mismatches += Row(kv, l, at + i)[b] != Byte(h.tag, kv, l, i, b);
    }
  }

  // Reads the pages (flat format) and writes them back unchanged.
  void ReadAndCheck(const Held& h, ChurnResult& r) {
    auto data = client_.ReadPages(pool_, h.pages);
    Expect(data.status(), r);
    if (!data.ok()) return;
    r.bytes_checked += data->size();
    Expect(client_.WritePages(pool_, h.pages, *data), r);
  }

  Client& client_;
  const std::string pool_;
  std::mt19937_64 rng_;
  std::unique_ptr<ShmDeviceBuffer> device_;
  uint64_t import_ = 0;
  std::vector<Held> held_;
};

}  // namespace

std::string ChurnPoolSpecText() {
  return R"pb(name: "churn"
              geometry { mha { num_layers: 2 num_kv_heads: 2 head_dim: 32 } dtype: DTYPE_BF16 }
              page_size: 16 layout: LAYOUT_PAGE_HEAD capacity_tokens: 4096)pb";
}

ChurnResult RunChurn(const std::string& target, const std::string& pool,
                     uint64_t seed, absl::Duration duration) {
  ChurnResult r;
  auto client = Client::Connect(target, absl::StrCat("churn-", seed));
  if (!client.ok()) {
    r.unexpected_errors = 1;
    r.first_error = client.status().ToString();
    return r;
  }
  Churner churner(**client, pool, seed);
  if (absl::Status s = churner.Setup(); !s.ok()) {
    r.unexpected_errors = 1;
    r.first_error = s.ToString();
    return r;
  }
  const absl::Time end = absl::Now() + duration;
  while (absl::Now() < end) churner.Step(r);
  churner.FreeAll(r);
  return r;
}

}  // namespace hostkv::testing
