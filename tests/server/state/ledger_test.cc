// The state ledgers (server/state/): what they prove after a clean write, a
// torn or flipped record, a truncated segment, another format.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/contract/shm_segment.h"
#include "server/state/daemon_ledger.h"
#include "server/state/pool_ledger.h"
#include "tests/testing/status_matchers.h"


namespace hostkv {
namespace {

v1::PoolSpec Spec(const std::string& name) {
  v1::PoolSpec spec;
  spec.set_name(name);
  spec.set_page_size(4);
  spec.set_capacity_tokens(64);
  return spec;
}

// A new sealed memfd holding `bytes` (bytes.size() > 0).
ScopedFd SealedCopy(const std::vector<uint8_t>& bytes) {
  ScopedFd fd(memfd_create("ledger-copy", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_GE(fd.get(), 0);
  EXPECT_EQ(write(fd.get(), bytes.data(), bytes.size()),
            static_cast<ssize_t>(bytes.size()));
  EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

std::vector<uint8_t> Contents(int fd) {
  const off_t size = lseek(fd, 0, SEEK_END);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  EXPECT_EQ(pread(fd, bytes.data(), bytes.size(), 0), size);
  return bytes;
}

ScopedFd Dup(int fd) { return ScopedFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

TEST(PoolLedgerTest, ReadsBackWhatWasRecorded) {
  ASSIGN_OR_FAIL(ledger, PoolLedger::Create(Spec("a"), {}, 16));
  ledger->RecordOwner(0, 4, 7);
  ledger->RecordOwner(4, 2, kCacheOwner);
  ledger->RecordOwner(6, 1, kUnscrubbedMark);
  ledger->RecordCached(4, "ns", "key-4", CacheLedger::kNoParent, 10);
  ledger->RecordCached(5, "ns", "key-5", 4, 11);
  ledger->RecordCached(9, "ns", "gone", CacheLedger::kNoParent, 12);
  ledger->RecordEvicted(9);
  ASSIGN_OR_FAIL(reopened, PoolLedger::Open(Dup(ledger->fd()), "a"));
  EXPECT_EQ(reopened->spec().name(), "a");
  EXPECT_EQ(reopened->num_pages(), 16u);
  const PoolLedger::Contents c = reopened->Read();
  EXPECT_EQ(c.unproven_pages, 0u);
  EXPECT_EQ(c.unproven_entries, 0u);
  std::vector<OwnerTag> want(16, kNoOwner);
  for (int p = 0; p < 4; ++p) want[p] = 7;
  want[4] = want[5] = kCacheOwner;
  want[6] = kUnscrubbedMark;
  EXPECT_EQ(c.owners, want);
  ASSERT_EQ(c.entries.size(), 2u);
  EXPECT_EQ(c.entries[0].page, 4u);
  EXPECT_EQ(c.entries[0].key, "key-4");
  EXPECT_EQ(c.entries[0].parent, UINT64_MAX);
  EXPECT_EQ(c.entries[1].page, 5u);
  EXPECT_EQ(c.entries[1].parent, 4u);
  EXPECT_EQ(c.entries[1].name_space, "ns");
  EXPECT_EQ(c.entries[1].use, 11u);
}

TEST(PoolLedgerTest, PagesBeingPublishedReadBackWithTheirPublisher) {
  ASSIGN_OR_FAIL(ledger, PoolLedger::Create(Spec("a"), {}, 8));
  ledger->RecordOwner(0, 8, 3);
  ledger->RecordPublishing(2, 3);
  ledger->RecordPublishing(5, 4);
  ledger->RecordOwner(5, 1, kCacheOwner);  // confirmed: a plain word again
  const PoolLedger::Contents c = ledger->Read();
  EXPECT_EQ(c.unproven_pages, 0u);
  EXPECT_EQ(c.owners, (std::vector<OwnerTag>{3, 3, 3, 3, 3, kCacheOwner, 3, 3}));
  EXPECT_EQ(c.publishing, (std::vector<uint64_t>{2}));
}

TEST(PoolLedgerTest, AFlippedByteIsUnprovenNeverTrusted) {
  ASSIGN_OR_FAIL(ledger, PoolLedger::Create(Spec("a"), {}, 8));
  ledger->RecordOwner(0, 8, 3);
  ledger->RecordCached(2, "ns", "key", CacheLedger::kNoParent, 1);
  std::vector<uint8_t> bytes = Contents(ledger->fd());
  // The owner word of page 1 (after the 4 KiB header), and a byte of page
  // 2's cache record key (records start on the next 4 KiB page).
  bytes[4096 + 8 * 1] ^= 0x01;
  bytes[8192 + 224 * 2 + 40 + 128] ^= 0x20;
  ASSIGN_OR_FAIL(flipped, PoolLedger::Open(SealedCopy(bytes), "a"));
  const PoolLedger::Contents c = flipped->Read();
  EXPECT_EQ(c.unproven_pages, 1u);
  EXPECT_EQ(c.owners[1], kUnscrubbedMark);
  EXPECT_EQ(c.owners[0], 3u);
  EXPECT_EQ(c.unproven_entries, 1u);
  EXPECT_TRUE(c.entries.empty());
}

// A page's digest rides in its cache record: recorded after the key, read
// back with it, gone with a new record of the page; a record without one
// (its bytes zero, as a daemon before digests wrote it) reads as "no
// digest"; a flipped digest byte makes the record unproven.
TEST(PoolLedgerTest, DigestsReadBackWithTheirRecords) {
  ASSIGN_OR_FAIL(ledger, PoolLedger::Create(Spec("a"), {}, 8));
  ledger->RecordOwner(0, 8, kCacheOwner);
  ledger->RecordCached(1, "ns", "with", CacheLedger::kNoParent, 1);
  ledger->RecordCached(2, "ns", "without", CacheLedger::kNoParent, 2);
  ledger->RecordCached(3, "ns", "again", CacheLedger::kNoParent, 3);
  ledger->RecordDigest(1, 0xDEADBEEF);
  ledger->RecordDigest(3, 0x12345678);
  ledger->RecordCached(3, "ns", "again", CacheLedger::kNoParent, 4);  // republished
  ledger->RecordDigest(5, 0x1);  // no record: nothing written
  ASSIGN_OR_FAIL(reopened, PoolLedger::Open(Dup(ledger->fd()), "a"));
  PoolLedger::Contents c = reopened->Read();
  ASSERT_EQ(c.entries.size(), 3u);
  EXPECT_EQ(c.entries[0].digest, std::optional<uint32_t>(0xDEADBEEF));
  EXPECT_EQ(c.entries[1].digest, std::nullopt);
  EXPECT_EQ(c.entries[2].digest, std::nullopt);
  EXPECT_EQ(c.unproven_entries, 0u);
  std::vector<uint8_t> bytes = Contents(ledger->fd());
  bytes[8192 + 224 * 1 + 28] ^= 0x04;  // a byte of page 1's digest
  ASSIGN_OR_FAIL(flipped, PoolLedger::Open(SealedCopy(bytes), "a"));
  c = flipped->Read();
  EXPECT_EQ(c.unproven_entries, 1u);
  ASSERT_EQ(c.entries.size(), 2u);
  EXPECT_EQ(c.entries[0].page, 2u);
}

TEST(PoolLedgerTest, ATruncatedOrForeignLedgerIsRefused) {
  ASSIGN_OR_FAIL(ledger, PoolLedger::Create(Spec("a"), {}, 64));
  const std::vector<uint8_t> bytes = Contents(ledger->fd());
  // Cut inside the records, and inside the header.
  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + 9000);
  EXPECT_ERROR(FailedPrecondition, PoolLedger::Open(SealedCopy(cut), "cut").status());
  std::vector<uint8_t> stub(bytes.begin(), bytes.begin() + 100);
  absl::Status s = PoolLedger::Open(SealedCopy(stub), "stub").status();
  EXPECT_ERROR(FailedPrecondition, s);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
  // Another format (the word after the magic), then a flipped header byte.
  std::vector<uint8_t> other = bytes;
  other[8] = 99;
  s = PoolLedger::Open(SealedCopy(other), "other").status();
  EXPECT_ERROR(FailedPrecondition, s);
  EXPECT_NE(s.message().find("format 99"), std::string::npos) << s;
  std::vector<uint8_t> header = bytes;
  header[100] ^= 0xff;
  s = PoolLedger::Open(SealedCopy(header), "header").status();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s;
  // Not a ledger at all.
  std::vector<uint8_t> zeros(bytes.size(), 0);
  EXPECT_ERROR(FailedPrecondition, PoolLedger::Open(SealedCopy(zeros), "zeros").status());
}

TEST(PoolLedgerTest, ALedgerOfZerosProvesNoPage) {
  // Every word must carry its check: a zeroed ledger region never reads as
  // "free" (the header is valid, the words are not).
  ASSIGN_OR_FAIL(ledger, PoolLedger::Create(Spec("a"), {}, 8));
  std::vector<uint8_t> bytes = Contents(ledger->fd());
  std::memset(bytes.data() + 4096, 0, 64);
  ASSIGN_OR_FAIL(zeroed, PoolLedger::Open(SealedCopy(bytes), "a"));
  EXPECT_EQ(zeroed->Read().unproven_pages, 8u);
}

SessionRecord Record(OwnerTag tag, char fill) {
  SessionRecord r;
  r.tag = tag;
  r.verified = true;
  r.uid = 1000 + tag;
  r.gid = 100;
  r.pid = 4242;
  r.opened_unix_ns = 123456789;
  r.secret_sha256 = std::string(32, fill);
  r.client_name = std::string("engine-") + fill;
  return r;
}

TEST(DaemonLedgerTest, SessionsAndNamespacesReadBack) {
  ASSIGN_OR_FAIL(ledger, DaemonLedger::Create(4, 8, 3));
  EXPECT_TRUE(ledger->RecordSession(Record(5, 'a')));
  EXPECT_TRUE(ledger->RecordSession(Record(6, 'b')));
  EXPECT_TRUE(ledger->RecordSession(Record(5, 'c')));  // rewritten in place
  ledger->EraseSession(6);
  EXPECT_TRUE(ledger->RecordNamespace({"llama", NamespaceOwner{false, 1001}}));
  EXPECT_TRUE(ledger->RecordNamespace({"shared", NamespaceOwner{true, 0}}));
  ASSIGN_OR_FAIL(reopened, DaemonLedger::Open(Dup(ledger->fd())));
  EXPECT_EQ(reopened->generation(), 3u);
  const DaemonLedger::Contents c = reopened->Read();
  EXPECT_EQ(c.unproven, 0u);
  ASSERT_EQ(c.sessions.size(), 1u);
  EXPECT_EQ(c.sessions[0].tag, 5u);
  EXPECT_EQ(c.sessions[0].uid, 1005u);
  EXPECT_EQ(c.sessions[0].secret_sha256, std::string(32, 'c'));
  EXPECT_EQ(c.sessions[0].client_name, "engine-c");
  ASSERT_EQ(c.namespaces.size(), 2u);
  EXPECT_EQ(c.namespaces[0].name, "llama");
  EXPECT_EQ(c.namespaces[0].owner.uid, 1001u);
  EXPECT_TRUE(c.namespaces[1].owner.unverified);
}

TEST(DaemonLedgerTest, SlotsRunOutWithoutHarm) {
  ASSIGN_OR_FAIL(ledger, DaemonLedger::Create(2, 1, 0));
  EXPECT_TRUE(ledger->RecordSession(Record(1, 'a')));
  EXPECT_TRUE(ledger->RecordSession(Record(2, 'b')));
  EXPECT_FALSE(ledger->RecordSession(Record(3, 'c')));
  ledger->EraseSession(1);
  EXPECT_TRUE(ledger->RecordSession(Record(3, 'c')));
  EXPECT_TRUE(ledger->RecordNamespace({"one", {}}));
  EXPECT_FALSE(ledger->RecordNamespace({"two", {}}));
  EXPECT_EQ(ledger->Read().sessions.size(), 2u);
}

TEST(DaemonLedgerTest, AGivenBackNamespaceFreesItsSlot) {
  ASSIGN_OR_FAIL(ledger, DaemonLedger::Create(1, 2, 0));
  EXPECT_TRUE(ledger->RecordNamespace({"one", NamespaceOwner{false, 1001}}));
  EXPECT_TRUE(ledger->RecordNamespace({"two", NamespaceOwner{false, 1002}}));
  EXPECT_FALSE(ledger->RecordNamespace({"three", NamespaceOwner{false, 1003}}));
  ledger->EraseNamespace("one");
  ledger->EraseNamespace("never-recorded");  // nothing happens
  EXPECT_EQ(ledger->namespaces_recorded(), 1u);
  // The slot is reused, and the next owner of a name rewrites its record.
  EXPECT_TRUE(ledger->RecordNamespace({"three", NamespaceOwner{false, 1003}}));
  ledger->EraseNamespace("two");
  EXPECT_TRUE(ledger->RecordNamespace({"two", NamespaceOwner{true, 0}}));
  const DaemonLedger::Contents contents = ledger->Read();
  ASSERT_EQ(contents.namespaces.size(), 2u);
  EXPECT_EQ(contents.unproven, 0u);
  for (const NamespaceRecord& r : contents.namespaces) {
    if (r.name == "three") {
      EXPECT_EQ(r.owner.uid, 1003u);
    } else {
      EXPECT_EQ(r.name, "two");
      EXPECT_TRUE(r.owner.unverified);
    }
  }
}

TEST(DaemonLedgerTest, ATornSlotIsLeftOut) {
  ASSIGN_OR_FAIL(ledger, DaemonLedger::Create(4, 4, 0));
  ledger->RecordSession(Record(1, 'a'));
  ledger->RecordSession(Record(2, 'b'));
  std::vector<uint8_t> bytes = Contents(ledger->fd());
  // Slot 0's uid (each slot is 272 bytes after the 4 KiB header).
  bytes[4096 + 12] ^= 0x04;
  ASSIGN_OR_FAIL(torn, DaemonLedger::Open(SealedCopy(bytes)));
  const DaemonLedger::Contents c = torn->Read();
  EXPECT_EQ(c.unproven, 1u);
  ASSERT_EQ(c.sessions.size(), 1u);
  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + 5000);
  EXPECT_ERROR(FailedPrecondition, DaemonLedger::Open(SealedCopy(cut)).status());
}

}  // namespace
}  // namespace hostkv
