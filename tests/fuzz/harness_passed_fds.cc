// Harness: descriptors passed over the session socket (AcceptPassedFd):
// sealed memfds, and the descriptors the daemon must refuse (unsealed, not
// sealable, empty, read-only, not a memfd).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/harness.h"

namespace hostkv::fuzz {
namespace {

enum FdKind : int {
  kSealed,       // the one the daemon accepts
  kUnsealed,     // MFD_ALLOW_SEALING, no seal added
  kNotSealable,  // memfd without MFD_ALLOW_SEALING
  kEmpty,        // sealed at size 0
  kReadOnly,     // a read-only descriptor of a sealed memfd
  kPipe,         // not a memfd at all
  kFdKinds
};

// A memfd of `size` bytes, sealed against shrinking if `seal`.
ScopedFd MakeMemfd(uint64_t size, bool sealable, bool seal) {
  ScopedFd fd(memfd_create("hostkv-fuzz",
                           MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0)));
  if (fd.get() < 0) {
    Die(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    Die(absl::StrCat("ftruncate memfd: ", std::strerror(errno)));
  }
  if (seal && fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    Die(absl::StrCat("F_ADD_SEALS: ", std::strerror(errno)));
  }
  return fd;
}

}  // namespace

// Passes a sealed memfd of `size` bytes for session live_[live_index] from
// its own peer, which must be accepted; returns where it lies.
Harness::DeviceTarget Harness::PassSealedMemfd(size_t live_index,
                                               uint64_t size) {
  SessionModel& m = live_[live_index];
  ScopedFd fd = MakeMemfd(size, /*sealable=*/true, /*seal=*/true);
  auto mapped =
      ShmSegment::MapFd(fd.get(), "fuzz memfd", ShmSegment::Access::kReadWrite);
  FUZZ_CHECK(mapped.ok(), mapped.status().ToString());
  auto s = handler_.AcceptPassedFd(
      m.id, PeerCredentials{static_cast<uint32_t>(getpid()), m.uid, m.gid, {}},
      std::move(fd));
  FUZZ_CHECK(s.ok(), "a sealed memfd was refused: ", s.status().ToString());
  m.passed.push_back(
      PassedFdModel{*s, std::make_shared<ShmSegment>(std::move(*mapped))});
  DeviceTarget t;
  t.passed_fd = *s;
  t.mapping = m.passed.back().mapping;
  t.data = t.mapping->data();
  t.size = t.mapping->size();
  return t;
}

// Passes one descriptor for a session. The harness keeps no descriptor:
// the daemon owns what it is given (and closes it if it refuses it); the
// harness keeps only a mapping of an accepted memfd, to fill and check the
// rows of the imports made from it.
void Harness::DoPassFd() {
  const SessionId id = PickSessionId();
  SessionModel* m = FindLive(id);
  PeerCredentials sender = PickPeer();
  if (m != nullptr && m->attached && !OneIn(8)) {  // mostly its own peer
    sender.uid = m->uid;
    sender.gid = m->gid;
  }
  const int kind =
      fdp_->ConsumeIntegralInRange<int>(0, 2 * kFdKinds - 1) % kFdKinds;
  static constexpr uint64_t kSizes[] = {kDeviceBytes, kSmallDeviceBytes, 4097,
                                        kDeviceBytes / 2};
  const uint64_t size = kSizes[fdp_->ConsumeIntegralInRange<int>(0, 3)];
  ScopedFd fd;
  std::shared_ptr<ShmSegment> mapping;
  switch (kind) {
    case kSealed:
    case kReadOnly: {
      fd = MakeMemfd(size, /*sealable=*/true, /*seal=*/false);
      auto mapped = ShmSegment::MapFd(fd.get(), "fuzz memfd",
                                      ShmSegment::Access::kReadWrite);
      FUZZ_CHECK(mapped.ok(), mapped.status().ToString());
      mapping = std::make_shared<ShmSegment>(std::move(*mapped));
      FUZZ_CHECK(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) == 0);
      if (kind == kReadOnly) {
        fd = ScopedFd(open(absl::StrCat("/proc/self/fd/", fd.get()).c_str(),
                           O_RDONLY | O_CLOEXEC));
        FUZZ_CHECK(fd.get() >= 0,
                   "reopen memfd read-only: ", std::strerror(errno));
      }
      break;
    }
    case kUnsealed:
      fd = MakeMemfd(size, /*sealable=*/true, /*seal=*/false);
      break;
    case kNotSealable:
      fd = MakeMemfd(size, /*sealable=*/false, /*seal=*/false);
      break;
    case kEmpty:
      fd = MakeMemfd(0, /*sealable=*/true, /*seal=*/true);
      break;
    default: {
      int ends[2];
      FUZZ_CHECK(pipe2(ends, O_CLOEXEC) == 0);
      close(ends[1]);
      fd = ScopedFd(ends[0]);
      break;
    }
  }
  auto s = handler_.AcceptPassedFd(id, sender, std::move(fd));
  Note(s.ok());
  if (!CheckSessionAnswer(id, s.status(), "AcceptPassedFd")) return;
  if (!m->attached || sender.uid != m->uid) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "AcceptPassedFd from uid ",
               sender.uid, " for a session ",
               m->attached ? absl::StrCat("of uid ", m->uid)
                           : std::string("not attached"),
               ": ", s.status().ToString());
    return;
  }
  if (kind != kSealed) {
    FUZZ_CHECK(absl::IsInvalidArgument(s.status()),
               "AcceptPassedFd of a descriptor of kind ", kind, ": ",
               s.status().ToString());
    return;
  }
  // The uid's limit first (one uid holding every slot must not be why
  // another is refused), then the session's.
  const bool uid_full = PassedOfUid(m->uid) >= kMaxPassedFdsPerUid;
  if (uid_full) {
    CheckExhausted(s.status(), true, "--max_passed_fds_per_uid",
                   "AcceptPassedFd");
    return;
  }
  const bool full = m->passed.size() >= kMaxImportsPerSession;
  CheckExhausted(s.status(), full, "--max_imports_per_session",
                 "AcceptPassedFd");
  if (full) return;
  FUZZ_CHECK(s.ok(), "a sealed memfd was refused: ", s.status().ToString());
  FUZZ_CHECK(*s != 0 && m->FindPassed(*s) == nullptr, "passed fd handle ", *s,
             " is 0 or handed out twice");
  m->passed.push_back(PassedFdModel{*s, std::move(mapping)});
}

// Asks for a pool's segment as a session's peer (or another uid): only the
// peer of an attached session the pool admits gets one, read-write exactly
// when it may administer the pool, and a read-only one cannot be mapped
// writable.
void Harness::DoFetchPoolSegment() {
  const SessionId id = PickSessionId();
  SessionModel* m = FindLive(id);
  PeerCredentials sender = PickPeer();
  if (m != nullptr && m->attached && !OneIn(8)) {
    sender.uid = m->uid;
    sender.gid = m->gid;
  }
  const std::string pool = PickPoolName();
  auto s = handler_.FetchPoolSegment(id, sender, pool);
  Note(s.ok());
  if (!CheckSessionAnswer(id, s.status(), "FetchPoolSegment")) return;
  if (!m->attached || sender.uid != m->uid) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "FetchPoolSegment from uid ",
               sender.uid, ": ", s.status().ToString());
    return;
  }
  auto owner = pool_owners_.find(pool);
  if (owner == pool_owners_.end()) {
    FUZZ_CHECK(IsUnknownPoolAnswer(pool, s.status()), "FetchPoolSegment of unknown pool ",
               pool, ": ", s.status().ToString());
    return;
  }
  if (!MayUsePool(owner->second, *m)) {
    FUZZ_CHECK(absl::IsPermissionDenied(s.status()), "FetchPoolSegment of pool ",
               pool, " the session may not use: ", s.status().ToString());
    return;
  }
  FUZZ_CHECK(s.ok(), "FetchPoolSegment of ", pool, ": ", s.status().ToString());
  FUZZ_CHECK(s->writable == MayAdminPool(owner->second, *m),
             "FetchPoolSegment of ", pool, ": writable=", s->writable);
  struct stat st {};
  FUZZ_CHECK(fstat(s->fd.get(), &st) == 0);
  auto live = pools_.Get(pool);
  // The segment is the pool's bytes rounded up to whole pages of its
  // backing (4 KiB, or a hugetlb page: at most 1 GiB more).
  FUZZ_CHECK(live.ok() &&
                 static_cast<uint64_t>(st.st_size) >= (*live)->info().total_bytes() &&
                 static_cast<uint64_t>(st.st_size) - (*live)->info().total_bytes() <
                     (uint64_t{1} << 30),
             "FetchPoolSegment of ", pool, ": a segment of ", st.st_size,
             " bytes");
  void* rw = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                  s->fd.get(), 0);
  FUZZ_CHECK((rw != MAP_FAILED) == s->writable,
             "a writable mapping of a ", s->writable ? "read-write" : "read-only",
             " pool segment ", rw != MAP_FAILED ? "worked" : "failed");
  if (rw != MAP_FAILED) munmap(rw, st.st_size);
}

}  // namespace hostkv::fuzz
