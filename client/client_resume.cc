// The client across a daemon restart: waiting for an absent hostkvd, and
// resuming the session with one that adopted its predecessor's state (README
// "While hostkvd is away", deploy/README.md "Restarts and upgrades").
#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "proto/contract/op_signal.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

absl::Status Client::Impl::Recover(const absl::Status& failure, uint64_t seen,
                                   RecoveryState& state) {
  if (socket_path.empty() || !open || reconnect_timeout <= absl::ZeroDuration()) {
    return failure;
  }
  if (absl::IsNotFound(failure) &&
      absl::StrContains(failure.message(), "awaits its resume")) {
    absl::Status resumed = Resume(seen);
    // Gone again in the middle of the resume: wait for the next daemon.
    if (!absl::IsUnavailable(resumed) && !absl::IsCancelled(resumed)) {
      return resumed;
    }
    return Recover(resumed, generation.load(), state);
  }
  // A daemon shutting down (SIGTERM, --takeover) cancels the calls that
  // reach it after its last handler ran: they did nothing, and this client
  // never cancels its own calls.
  if (!absl::IsUnavailable(failure) && !absl::IsCancelled(failure)) {
    return failure;
  }
  const absl::Time now = absl::Now();
  if (state.deadline == absl::InfiniteFuture()) {
    state.deadline = now + reconnect_timeout;
  }
  if (now >= state.deadline) {
    return absl::UnavailableError(absl::StrCat(
        "hostkvd at unix:", socket_path, " did not answer within "
        "reconnect_timeout=", absl::FormatDuration(reconnect_timeout),
        " (is it running? last error: ", failure.message(), ")"));
  }
  // A pause first (a daemon draining refuses at once), then the next try
  // goes out as soon as the channel connects to a daemon listening again.
  absl::SleepFor(std::min(state.delay, state.deadline - now));
  state.delay = std::min(state.delay * 2, absl::Milliseconds(100));
  const absl::Time until =
      std::min(state.deadline, absl::Now() + absl::Seconds(1));
  channel->WaitForConnected(absl::ToChronoTime(until));
  return absl::OkStatus();
}

absl::Status Client::Impl::Resume(uint64_t seen) {
  absl::MutexLock lock(&resume_mu);
  if (generation.load() != seen) return absl::OkStatus();  // another call did
  absl::WriterMutexLock gate(&gate_mu);
  return ResumeGated(seen);
}

absl::Status Client::Impl::ResumeGated(uint64_t seen) {
  ASSIGN_OR_RETURN(ScopedFd fd, ConnectSessionSocket(socket_path));
  SessionMessage message =
      NewSessionMessage(SessionMessageKind::kResume, client_name);
  std::memcpy(message.session_id, session_id.data(), kSessionIdBytes);
  ScopedFd signal_fd;
  absl::StatusOr<SessionReply> reply =
      SessionExchange(fd.get(), message, -1, &signal_fd);
  if (!reply.ok()) {
    if (absl::IsNotFound(reply.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "hostkvd at unix:", socket_path, " came back without this session: ",
          reply.status().message()));
    }
    return reply.status();
  }
  if (signal_fd.get() < 0) {
    return absl::InternalError("the daemon sent no signal segment");
  }
  SignalRecords fresh;
  fresh.id = reply->value;
  fresh.slots = reply->signal_slots;
  ASSIGN_OR_RETURN(fresh.segment,
                   ShmSegment::MapFd(signal_fd.get(), "signal segment",
                                     ShmSegment::Access::kReadOnly));
  if (fresh.segment.size() < uint64_t{fresh.slots} * sizeof(OpSignal)) {
    return absl::InternalError("the signal segment is smaller than announced");
  }
  std::shared_ptr<RingClient> fresh_ring = OpenRing(fd.get(), reply->features);
  {
    absl::MutexLock ring_lock(&ring_mu);
    ring = std::move(fresh_ring);
  }
  {
    absl::MutexLock socket_lock(&socket_mu);
    session_socket = std::move(fd);
    for (const auto& [handle, passed] : passed_fds) {
      SessionMessage pass = NewSessionMessage(SessionMessageKind::kPassFd);
      pass.import_id = handle;
      RETURN_IF_ERROR(
          SessionExchange(session_socket.get(), pass, passed.get(), nullptr)
              .status());
    }
  }
  records.UseSegment(std::move(fresh));
  for (auto& [id, request] : imports) {
    request.set_import_id(id);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    if (!auth_token.empty()) {
      context.AddMetadata("authorization", "Bearer " + auth_token);
    }
    v1::RegisterDeviceBuffersResponse response;
    grpc::Status status =
        stub->RegisterDeviceBuffers(&context, request, &response);
    if (!status.ok()) {
      absl::Status s = FromGrpcStatus(status);
      return absl::Status(s.code(), absl::StrCat("registering import ", id,
                                                 " again after the restart: ",
                                                 s.message()));
    }
  }
  RETURN_IF_ERROR(TakeReferencesAgain().status());
  RETURN_IF_ERROR(SubmitUnfinished().status());
  generation.store(seen + 1);
  return absl::OkStatus();
}

absl::StatusOr<size_t> Client::Impl::SubmitUnfinished() {
  const uint64_t current = records.current();
  std::vector<SubmittedOp> pending;
  for (SubmittedOp& op : records.TakeOutstanding()) {
    if (op.op.signal_segment != current && !records.Ended(op.op)) {
      pending.push_back(std::move(op));
    }
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    const SubmittedOp& op = pending[i];
    absl::StatusOr<v1::TransferResponse> response =
        TryCallGated<v1::TransferRequest, v1::TransferResponse>(
            op.load ? &v1::HostKV::Stub::Load : &v1::HostKV::Stub::Backup,
            *op.request, op.load ? RingMethod::kLoad : RingMethod::kBackup);
    if (absl::IsUnavailable(response.status()) ||
        absl::IsCancelled(response.status())) {
      // Gone again: the next resume decides for these.
      for (size_t j = i; j < pending.size(); ++j) records.Track(pending[j]);
      return response.status();
    }
    absl::StatusOr<Operation> replacement =
        response.ok() ? Issued(op.load, op.request, *response)
                      : absl::StatusOr<Operation>(response.status());
    if (!replacement.ok()) {
      replacement = absl::Status(
          replacement.status().code(),
          absl::StrCat("operation ", op.op.op_id,
                       ", submitted again after hostkvd restarted: ",
                       replacement.status().message()));
    }
    records.Replace(op.op, std::move(replacement));
  }
  return pending.size();
}

absl::StatusOr<uint64_t> Client::Impl::TakeReferencesAgain() {
  uint64_t taken = 0;
  std::vector<HeldReference> all = held.TakeAll();
  for (size_t i = 0; i < all.size(); ++i) {
    const HeldReference& ref = all[i];
    v1::LookupRequest request;
    request.set_session_id(session_id);
    request.set_pool(ref.pool);
    request.set_namespace_(ref.cache_namespace);
    request.add_keys(ref.key);
    request.set_acquire(true);
    for (uint64_t n = 0; n < ref.count; ++n) {
      absl::StatusOr<v1::LookupResponse> found =
          TryCallGated<v1::LookupRequest, v1::LookupResponse>(
              &v1::HostKV::Stub::Lookup, request, RingMethod::kLookup);
      if (absl::IsUnavailable(found.status()) || absl::IsCancelled(found.status())) {
        for (size_t j = i; j < all.size(); ++j) {
          held.Add(all[j].pool, all[j].cache_namespace, {all[j].key}, {all[j].page});
        }
        return found.status();
      }
      if (!found.ok()) break;
      const std::vector<uint64_t> pages = PageList(ToPageRanges(found->pages()));
      if (pages.size() == 1 && pages[0] == ref.page) {
        held.Add(ref.pool, ref.cache_namespace, {ref.key}, {ref.page});
        ++taken;
        continue;
      }
      if (!pages.empty()) {
        // Cached again on another page: not the one the caller holds.
        v1::ReleaseRequest release;
        release.set_session_id(session_id);
        release.set_pool(ref.pool);
        v1::PageRun* run = release.add_pages();
        run->set_first_page(pages[0]);
        run->set_num_pages(1);
        TryCallGated<v1::ReleaseRequest, v1::ReleaseResponse>(
            &v1::HostKV::Stub::Release, release, RingMethod::kRelease)
            .IgnoreError();
      }
      break;
    }
  }
  return taken;
}

absl::StatusOr<Operation> Client::Impl::Issued(
    bool load, std::shared_ptr<const v1::TransferRequest> request,
    const v1::TransferResponse& response) {
  std::shared_ptr<const SignalRecords> segment =
      records.Segment(response.signal_segment_id());
  if (segment == nullptr) {
    return absl::InternalError(
        "the daemon answered with a signal segment this client was not given");
  }
  if (response.signal_index() >= segment->slots) {
    return absl::InternalError("the daemon returned a signal index out of range");
  }
  Operation op;
  op.op_id = response.op_id();
  op.signal_index = response.signal_index();
  op.layer_begin = response.layer_begin();
  op.num_layers = response.num_layers();
  op.num_tokens = response.num_tokens();
  op.bytes = response.bytes();
  op.signal_value = response.signal_value();
  op.signal_segment = segment->id;
  records.Track(SubmittedOp{op, load, std::move(request)});
  return op;
}

void Client::Impl::KeepImport(uint64_t id,
                              v1::RegisterDeviceBuffersRequest request) {
  absl::MutexLock lock(&resume_mu);
  imports[id] = std::move(request);
}

void Client::Impl::ForgetImport(uint64_t id) {
  absl::MutexLock lock(&resume_mu);
  imports.erase(id);
}

void Client::Impl::KeepPassedFd(uint64_t handle, int fd) {
  ScopedFd copy(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (copy.get() < 0) return;  // then it cannot be passed again
  absl::MutexLock lock(&resume_mu);
  passed_fds[handle] = std::move(copy);
}

}  // namespace hostkv
