// libFuzzer target over the request layer (RequestHandler) with the real
// memory budget, pools, allocator, sessions, signal boards and copy engine
// behind it, as hostkvd runs them minus gRPC.
//
// Each input is decoded (FuzzedDataProvider) into at most kMaxOps requests:
// Alloc, Free, HandOverPages, Load, Backup, ReadPages, WritePages,
// GetPageBufferMeta, RegisterDeviceBuffers, UnregisterDeviceBuffers,
// CreatePool, DeletePool, OpenSession, RenewSession, CloseSession (or
// EndSession, as the session monitor does), AttachSession and
// OpenAttachedSession as a few uids (the harness's, root, one in another
// group, one in the harness's group), AcceptPassedFd (sealed memfds and
// descriptors it must refuse), an idle-session sweep (ExpireIdleSessions),
// GetPoolStats, GetPool, ListPools, and a Backup-then-Load round trip.
// Fields are biased towards what breaks code:
// 0, 1, sizes next to the pool's, UINT64_MAX, offset/size pairs that
// overflow, ids of open sessions and imports most of the time and stale or
// random ones otherwise (session ids: closed, one bit off, or not 16 bytes).
//
// Besides "no crash, no sanitizer report", the harness keeps a model of what
// each session owns and checks after every request:
//   - per pool: free_pages + sum(UsageByOwner) == num_pages, every owner is
//     an open session, and each session owns exactly the pages the model
//     says;
//   - answers agree with the model: Alloc returns pages that were free,
//     Free/HandOverPages/CloseSession report what was listed or owned, a
//     request the contract says must succeed does (only when no copy is in
//     flight), GetPoolStats matches the model;
//   - errors by their code: a malformed session id is INVALID_ARGUMENT, an
//     unknown one NOT_FOUND; pools are used (Alloc, Register,
//     attach_if_exists) only as their owner and access allow and deleted
//     only by their owner's uid or root, else PERMISSION_DENIED; each small
//     limit (sessions, per uid, unattached; pools and pool bytes per uid;
//     imports, import bytes and passed fds per session; imports per uid)
//     gives RESOURCE_EXHAUSTED naming its flag exactly when it is reached;
//   - shm buffers by name are accepted only from sessions attached by a peer
//     whose uid owns the segment (root too: root's sessions register root's
//     segments), passed_fd handles only if the session passed them, and only
//     inside the segment;
//   - WritePages then ReadPages gives the same bytes back; Backup then Load
//     gives the device rows back; GetPageBufferMeta pieces lie inside the
//     pool and add up to the pages' bytes; after the copies are done every
//     owned page is readable (no pin left behind).
// A violated check prints what and aborts, which libFuzzer saves as a crash.
//
// Every input starts from the same state (two base pools owned by the
// daemon, two sessions attached as the harness's uid owning a few pages,
// four device-buffer registrations, one of them through a passed memfd) and
// ends by closing every session and deleting the pools it created (from a
// root session), so a saved crash reproduces on its own.
// Copies run on the engine's threads; after a transfer the harness normally
// waits for the session's signal board to go idle, and now and then lets up
// to kMaxOutstanding copies run on while the next requests come in.
//
// The harness is tests/fuzz/harness.h (its members by topic in
// harness*.cc), its model and limits tests/fuzz/fuzz_model.h; this file
// holds only libFuzzer's entry points and the harness's lifetime.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "spdlog/spdlog.h"
#include "tests/fuzz/harness.h"

namespace hostkv {
namespace {

fuzz::Harness* harness = nullptr;

// Unlinks the shared-memory segments at a normal exit (a crash leaves them
// in /dev/shm; run_fuzzer.sh removes those).
void DestroyHarness() {
  delete harness;
  harness = nullptr;
}

}  // namespace
}  // namespace hostkv

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  hostkv::harness = new hostkv::fuzz::Harness();
  std::atexit(hostkv::DestroyHarness);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hostkv::harness->RunOne(data, size);
  return 0;
}
