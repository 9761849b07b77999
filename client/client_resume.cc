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
    return Resume(seen);
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
  absl::SleepFor(std::min(state.delay, state.deadline - now));
  state.delay = std::min(state.delay * 2, absl::Milliseconds(200));
  return absl::OkStatus();
}

absl::Status Client::Impl::Resume(uint64_t seen) {
  absl::MutexLock lock(&resume_mu);
  if (generation.load() != seen) return absl::OkStatus();  // another call did
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
  ASSIGN_OR_RETURN(ShmSegment fresh,
                   ShmSegment::MapFd(signal_fd.get(), "signal segment",
                                     ShmSegment::Access::kReadOnly));
  if (fresh.size() < uint64_t{reply->signal_slots} * sizeof(OpSignal)) {
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
  retired_signals.push_back(std::move(signals));
  signals = std::move(fresh);
  signal_slots = reply->signal_slots;
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
  generation.fetch_add(1);
  return absl::OkStatus();
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
