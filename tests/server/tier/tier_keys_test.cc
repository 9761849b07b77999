// Tier keys (server/tier/tier_keys.h): no two (geometry, owner scope,
// namespace) triples share a tier namespace, and every one fits the
// stores' limits (the file tier's 120-byte names).
#include "server/tier/tier_keys.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "server/tier/file_tier.h"

namespace hostkv {
namespace {

constexpr uint64_t kFingerprint = 0x1122334455667788ull;

std::string NamespaceOf(absl::string_view scope, absl::string_view ns) {
  return ToTierKey(kFingerprint, scope, ns, "key").name_space;
}

TEST(TierKeysTest, TheOwnerScopeSeparatesTheSameNamespace) {
  EXPECT_NE(NamespaceOf("u1000", "model"), NamespaceOf("u1001", "model"));
  EXPECT_NE(NamespaceOf("u1000", "model"), NamespaceOf("unverified", "model"));
  EXPECT_NE(NamespaceOf("u1000", "model"), NamespaceOf("any", "model"));
  EXPECT_EQ(NamespaceOf("u1000", "model"), NamespaceOf("u1000", "model"));
  // The scope ends at the first ':' (scopes have none), so moving bytes
  // between scope and namespace changes the result.
  EXPECT_NE(NamespaceOf("u1", "0:model"), NamespaceOf("u10", ":model"));
}

TEST(TierKeysTest, TheGeometryFingerprintLeads) {
  const TierKey a = ToTierKey(kFingerprint, "u1", "m", "k");
  const TierKey b = ToTierKey(kFingerprint + 1, "u1", "m", "k");
  EXPECT_NE(a.name_space, b.name_space);
  EXPECT_EQ(a.name_space.substr(8), b.name_space.substr(8));
  EXPECT_EQ(a.key, "k");
}

// The encoding this replaced kept a long namespace's first 80 bytes and
// appended two FNV-1a hashes in hex: a 112-byte namespace of exactly that
// form was a valid namespace of its own and read the long one's values.
// Now a long namespace is hashed under another leading byte than any raw
// one, so no namespace of any length shares its tier namespace.
TEST(TierKeysTest, LongNamespacesAliasNoShortOne) {
  std::set<std::string> seen;
  size_t raw = 0, hashed = 0;
  for (size_t length = 1; length <= 128; ++length) {
    for (char fill : {'a', 'b'}) {
      const std::string ns(length, fill);
      const std::string tier_ns = NamespaceOf("u61001", ns);
      EXPECT_LE(tier_ns.size(), kFileTierMaxNameBytes) << length;
      EXPECT_TRUE(seen.insert(tier_ns).second) << length;
      (tier_ns[8] == 'r' ? raw : hashed) += 1;
      // Whatever a long namespace becomes, taken as a namespace itself it
      // maps elsewhere.
      const std::string body = tier_ns.substr(8);
      EXPECT_NE(NamespaceOf("u61001", body), tier_ns) << length;
      EXPECT_NE(NamespaceOf("u61001", body.substr(1)), tier_ns) << length;
    }
  }
  EXPECT_GT(raw, 0u);
  EXPECT_GT(hashed, 0u);
  // Two long namespaces that differ only past byte 80 differ.
  const std::string base(100, 'x');
  EXPECT_NE(NamespaceOf("u1", base + std::string(28, 'y')),
            NamespaceOf("u1", base + std::string(27, 'y') + "z"));
}

}  // namespace
}  // namespace hostkv
