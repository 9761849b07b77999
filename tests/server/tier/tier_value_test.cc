#include "server/tier/tier_value.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/tier/crc32c.h"
#include "tests/testing/status_matchers.h"

namespace hostkv {
namespace {

PoolGeometry MhaGeometry() {
  PoolGeometry g;
  g.attention = Attention::kMha;
  g.layout = HostLayout::kPageFirst;
  g.num_layers = 4;
  g.num_heads = 2;
  g.head_bytes = 16;  // head_dim 8, 2-byte dtype
  g.page_size = 4;
  g.token_slots = 64;
  return g;
}

constexpr uint32_t kBf16 = 2;  // a v1::Dtype value (any fixed number here)

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class TierValueTest : public ::testing::Test {
 protected:
  const PoolGeometry geometry_ = MhaGeometry();
  const uint64_t fingerprint_ = GeometryFingerprint(geometry_, kBf16);
  const std::string page_ = RandomBytes(geometry_.page_bytes(), 1);

  absl::StatusOr<absl::string_view> Unframe(absl::string_view value) {
    return UnframeValue(value, fingerprint_, geometry_.page_bytes());
  }
  // DataLoss whose message names `what`.
  void ExpectDataLoss(absl::string_view value, const std::string& what) {
    auto r = Unframe(value);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(absl::StatusCode::kDataLoss, r.status().code()) << r.status();
    EXPECT_NE(std::string::npos, r.status().message().find(what)) << r.status();
  }
};

TEST_F(TierValueTest, RoundTrip) {
  ASSERT_EQ(1024u,
            page_.size());  // 2 planes * 4 layers * 4 tokens * 2 heads * 16
  const std::string value = FrameValue(fingerprint_, page_);
  ASSERT_EQ(kTierValueHeaderBytes + page_.size(), value.size());
  EXPECT_EQ("HKVP", value.substr(0, 4));
  auto page = Unframe(value);
  ASSERT_OK(page);
  EXPECT_EQ(page_, std::string(*page));
  // A view into the value, not a copy.
  EXPECT_EQ(value.data() + kTierValueHeaderBytes, page->data());
}

TEST_F(TierValueTest, EmptyPageRoundTrips) {
  const std::string value = FrameValue(fingerprint_, "");
  auto page = UnframeValue(value, fingerprint_, 0);
  ASSERT_OK(page);
  EXPECT_TRUE(page->empty());
}

TEST_F(TierValueTest, HeaderIsLittleEndian) {
  const std::string value = FrameValue(0x0102030405060708ull, "abc");
  const unsigned char* h = reinterpret_cast<const unsigned char*>(value.data());
  EXPECT_EQ(2, h[4]);  // version 2
  EXPECT_EQ(0, h[5]);
  EXPECT_EQ(0x08, h[8]);
  EXPECT_EQ(0x01, h[15]);
  EXPECT_EQ(3, h[16]);  // page bytes
  const uint32_t crc = Crc32c("abc", 3);
  uint32_t stored =
      h[24] | h[25] << 8 | h[26] << 16 | static_cast<uint32_t>(h[27]) << 24;
  EXPECT_EQ(crc, stored);
  const uint32_t check =
      h[28] | h[29] << 8 | h[30] << 16 | static_cast<uint32_t>(h[31]) << 24;
  EXPECT_EQ(ValueKeyCheck("", crc), check);
}

// Each header field, one byte of it changed: a miss naming that field.
TEST_F(TierValueTest, EveryCorruptedHeaderFieldIsDataLossNamingIt) {
  const std::string good = FrameValue(fingerprint_, page_);
  struct Field {
    size_t offset;
    size_t size;
    const char* name;
  };
  const Field fields[] = {{0, 4, "magic"},     {4, 4, "version"},
                          {8, 8, "geometry"},  {16, 8, "page bytes"},
                          {24, 4, "checksum"}, {28, 4, "key"}};
  for (const Field& f : fields) {
    for (size_t i = f.offset; i < f.offset + f.size; ++i) {
      std::string bad = good;
      bad[i] ^= 0x40;
      SCOPED_TRACE(std::string(f.name) + " byte " + std::to_string(i));
      ExpectDataLoss(bad, f.name);
    }
  }
}

TEST_F(TierValueTest, OneFlippedPageByteIsDataLoss) {
  const std::string good = FrameValue(fingerprint_, page_);
  for (size_t i : {size_t{0}, page_.size() / 2, page_.size() - 1}) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[kTierValueHeaderBytes + i] ^= static_cast<char>(1 << bit);
      ExpectDataLoss(bad, "checksum");
    }
  }
}

TEST_F(TierValueTest, AnotherGeometrysValueIsDataLoss) {
  PoolGeometry other = geometry_;
  other.layout = HostLayout::kLayerFirst;  // same bytes, another order
  const std::string value =
      FrameValue(GeometryFingerprint(other, kBf16), page_);
  ExpectDataLoss(value, "geometry");
  // The same geometry read by a pool of another dtype: a miss too.
  const std::string fp16 = FrameValue(GeometryFingerprint(geometry_, 1), page_);
  ExpectDataLoss(fp16, "geometry");
}

TEST_F(TierValueTest, ExpectedPageBytesMustMatch) {
  const std::string value = FrameValue(fingerprint_, page_);
  auto r = UnframeValue(value, fingerprint_, page_.size() + 1);
  EXPECT_ERROR(DataLoss, r);
  EXPECT_NE(std::string::npos, r.status().message().find("page bytes"));
}

TEST_F(TierValueTest, TruncatedOrPaddedValueIsDataLoss) {
  const std::string good = FrameValue(fingerprint_, page_);
  ExpectDataLoss("", "truncated header");
  ExpectDataLoss(good.substr(0, kTierValueHeaderBytes - 1), "truncated header");
  ExpectDataLoss(good.substr(0, kTierValueHeaderBytes), "size");
  ExpectDataLoss(good.substr(0, good.size() - 1), "size");
  ExpectDataLoss(good + "x", "size");
}

TEST_F(TierValueTest, ForeignValuesAreToldFromDamagedOnes) {
  const std::string value = FrameValue(fingerprint_, page_);
  EXPECT_FALSE(IsForeignValue(value, fingerprint_));
  // Another writer's: another geometry, version or magic (kept by readers).
  EXPECT_TRUE(IsForeignValue(FrameValue(fingerprint_ + 1, page_), fingerprint_));
  std::string v3 = value;
  v3[4] = 3;
  EXPECT_TRUE(IsForeignValue(v3, fingerprint_));
  std::string magic = value;
  magic[0] = 'X';
  EXPECT_TRUE(IsForeignValue(magic, fingerprint_));
  // Damaged: cut short, or a flipped page byte (a reader may delete them).
  EXPECT_FALSE(IsForeignValue(value.substr(0, 10), fingerprint_));
  EXPECT_FALSE(IsForeignValue(value.substr(0, value.size() - 1), fingerprint_));
  std::string flipped = value;
  flipped[kTierValueHeaderBytes + 5] ^= 0x40;
  EXPECT_FALSE(Unframe(flipped).ok());
  EXPECT_FALSE(IsForeignValue(flipped, fingerprint_));
}

TEST(GeometryFingerprintTest, EveryFieldThatDecidesTheBytesChangesIt) {
  PoolGeometry base = MhaGeometry();
  const uint64_t f = GeometryFingerprint(base, kBf16);
  EXPECT_EQ(f, GeometryFingerprint(base, kBf16));
  PoolGeometry bigger = base;
  bigger.token_slots *= 2;  // the pool's size does not matter
  EXPECT_EQ(f, GeometryFingerprint(bigger, kBf16));

  std::vector<PoolGeometry> others(6, base);
  others[0].attention = Attention::kMla;
  others[1].layout = HostLayout::kPageFirstDirect;
  others[2].num_layers += 1;
  others[3].num_heads += 1;
  others[4].head_bytes += 2;
  others[5].page_size *= 2;
  for (const PoolGeometry& g : others) {
    EXPECT_NE(f, GeometryFingerprint(g, kBf16));
  }
  EXPECT_NE(f, GeometryFingerprint(base, kBf16 + 1));

  PoolGeometry mla = base;
  mla.attention = Attention::kMla;
  mla.num_heads = 1;
  mla.head_bytes = 576 * 2;
  EXPECT_NE(GeometryFingerprint(mla, kBf16, 64),
            GeometryFingerprint(mla, kBf16, 32));
  // MHA ignores the rope split.
  EXPECT_EQ(f, GeometryFingerprint(base, kBf16, 64));
}

TEST(Crc32cTest, KnownVectors) {
  struct Vector {
    std::string data;
    uint32_t crc;
  };
  const std::vector<Vector> vectors = {
      {"", 0x00000000u},
      {"a", 0xC1D04330u},
      {"123456789", 0xE3069283u},
      {std::string(32, '\0'), 0x8A9136AAu},    // RFC 3720 B.4
      {std::string(32, '\xff'), 0x62A8AB43u},  // RFC 3720 B.4
  };
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  std::vector<Vector> all = vectors;
  all.push_back({ascending, 0x46DD794Eu});
  all.push_back({descending, 0x113FDB5Cu});
  for (const Vector& v : all) {
    SCOPED_TRACE(v.data.size());
    EXPECT_EQ(v.crc, Crc32cSoftware(v.data.data(), v.data.size()));
    EXPECT_EQ(v.crc, Crc32c(v.data.data(), v.data.size()));
    if (Crc32cHardwareAvailable()) {
      EXPECT_EQ(v.crc, Crc32cHardware(v.data.data(), v.data.size()));
    }
  }
}

TEST(Crc32cTest, SoftwareEqualsHardwareOnManyLengthsAndAlignments) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  const std::string buffer = RandomBytes(4096 + 16, 7);
  int checked = 0;
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t len = 0; len <= 300; ++len) {
      const char* p = buffer.data() + offset;
      ASSERT_EQ(Crc32cSoftware(p, len), Crc32cHardware(p, len))
          << "offset " << offset << " length " << len;
      ++checked;
    }
    const char* p = buffer.data() + offset;
    ASSERT_EQ(Crc32cSoftware(p, 4096), Crc32cHardware(p, 4096));
  }
  EXPECT_EQ(16 * 301, checked);
}

// From 3 x 4,096 bytes on, the hardware path runs three interleaved
// chains joined by a shift table: the same checksum as the tables'.
TEST(Crc32cTest, LongInputsRunAsThreeChainsWithTheSameChecksum) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  const std::string buffer = RandomBytes(5 * 12288 + 64, 13);
  for (size_t offset : {size_t{0}, size_t{3}, size_t{8}}) {
    for (size_t len : {size_t{12287}, size_t{12288}, size_t{12289}, size_t{24576 + 100},
                       size_t{5 * 12288}}) {
      const char* p = buffer.data() + offset;
      ASSERT_EQ(Crc32cSoftware(p, len), Crc32cHardware(p, len))
          << "offset " << offset << " length " << len;
      ASSERT_EQ(Crc32cSoftware(p, len), Crc32cExtend(Crc32c(p, 5000), p + 5000, len - 5000));
    }
  }
  const std::string zeros(3 * 12288, '\0');
  EXPECT_EQ(Crc32cSoftware(zeros.data(), zeros.size()),
            Crc32cHardware(zeros.data(), zeros.size()));
}

// A whole frame under another key (a store that mixed keys up, a value
// copied over another's): its checksum matches its bytes, its key check
// does not.
TEST_F(TierValueTest, AValueBoundToAnotherKeyIsDataLossNamingTheKey) {
  const std::string value = FrameValue(fingerprint_, page_, "tier-key-a");
  EXPECT_OK(UnframeValue(value, fingerprint_, page_.size(), "tier-key-a"));
  auto r = UnframeValue(value, fingerprint_, page_.size(), "tier-key-b");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(absl::StatusCode::kDataLoss, r.status().code());
  EXPECT_NE(std::string::npos, r.status().message().find("key")) << r.status();
  EXPECT_FALSE(IsForeignValue(value, fingerprint_));
  // Its checksum is the page's digest (server/cache/page_digest.h).
  EXPECT_EQ(Crc32c(page_.data(), page_.size()), FrameChecksum(value));
}

// Version 1 values (before the key check) are still read, without it.
TEST_F(TierValueTest, Version1ValuesAreReadWithoutAKeyCheck) {
  std::string v1 = FrameValue(fingerprint_, page_, "tier-key-a");
  v1[4] = 1;
  for (int i = 28; i < 32; ++i) v1[i] = 0;
  EXPECT_OK(UnframeValue(v1, fingerprint_, page_.size(), "tier-key-b"));
  EXPECT_FALSE(IsForeignValue(v1, fingerprint_));
  v1[29] = 1;
  auto r = UnframeValue(v1, fingerprint_, page_.size(), "tier-key-b");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string::npos, r.status().message().find("reserved")) << r.status();
}

}  // namespace
}  // namespace hostkv
