// What client.cc and client_cache.cc share inside the client library: the
// session's state (Client::Impl) and how requests carry page runs. Private
// to client/.
#ifndef HOSTKV_CLIENT_CLIENT_IMPL_H_
#define HOSTKV_CLIENT_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hostkv/client.h"
#include "client/command_ring_client.h"
#include "client/held_references.h"
#include "client/operation_records.h"
#include "hostkv/v1/hostkv.grpc.pb.h"
#include "proto/contract/grpc_status.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/shm_segment.h"

namespace hostkv {

struct Client::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::HostKV::Stub> stub;
  std::string auth_token;
  std::string session_id;  // the 16-byte secret
  uint32_t session_number = 0;
  bool open = false;
  // The signal segments of this session's daemons and the operations
  // submitted in them.
  OperationRecords records;
  // References on cached pages, taken again by a resume.
  HeldReferences held;
  // Attached: the session lives while it is open. Records on it are
  // request/reply pairs, serialized by socket_mu.
  absl::Mutex socket_mu;
  ScopedFd session_socket;
  // Watches the session socket for the daemon hanging up (OnDaemonLost);
  // woken through `watch_wake` to stop.
  std::thread watcher;
  ScopedFd watch_wake[2];
  std::vector<std::function<void()>> on_lost;  // set before `watcher` starts
  // Stops the watcher without running on_lost (a Close of our own).
  void StopWatcher();
  // TCP: renews the lease until `stop_renewing` is notified.
  std::thread renewer;
  absl::Mutex renew_mu;
  bool stop_renewing ABSL_GUARDED_BY(renew_mu) = false;

  // Opens the session over "<socket_path>.session" (bound to this
  // process's credentials), maps its signal records.
  absl::Status OpenOverSessionSocket(const std::string& socket_path,
                                     const std::string& client_name);

  // The session's command ring (a unix: target and a daemon that serves
  // one); replaced on Resume. Null: every call goes over gRPC.
  bool want_ring = true;  // HOSTKV_COMMAND_RING=0 turns it off
  absl::Mutex ring_mu;
  std::shared_ptr<RingClient> ring ABSL_GUARDED_BY(ring_mu);
  std::shared_ptr<RingClient> Ring() ABSL_LOCKS_EXCLUDED(ring_mu) {
    absl::MutexLock lock(&ring_mu);
    return ring;
  }
  // Asks for the ring on session socket `socket` if the daemon announced
  // it in `features`; null if not served or refused.
  std::shared_ptr<RingClient> OpenRing(int socket, uint32_t features);
  // Whether the session socket hung up (the daemon is gone).
  bool SessionSocketHungUp() ABSL_LOCKS_EXCLUDED(socket_mu);

  // Calls one unary method with a deadline and converts the status; on a
  // unix: target, waits for an absent daemon and resumes the session
  // (Recover) before trying again. With `ring_method` (a hot call), it
  // goes through the command ring when there is one. `on_answer` sees a
  // successful response before a resume can change which daemon is current.
  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> Call(
      Method method, const Request& request,
      std::optional<RingMethod> ring_method = {},
      const std::function<absl::Status(const Response&)>& on_answer = nullptr) {
    RecoveryState recovery;
    while (true) {
      const uint64_t seen = generation.load();
      absl::StatusOr<Response> answer =
          TryCall<Request, Response>(method, request, ring_method, on_answer);
      if (answer.ok()) return answer;
      if (absl::Status retry = Recover(answer.status(), seen, recovery);
          !retry.ok()) {
        return retry;
      }
    }
  }

  // One try of Call, inside the gate (no resume runs meanwhile).
  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> TryCall(
      Method method, const Request& request,
      std::optional<RingMethod> ring_method,
      const std::function<absl::Status(const Response&)>& on_answer) {
    absl::ReaderMutexLock gate(&gate_mu);
    absl::StatusOr<Response> answer =
        TryCallGated<Request, Response>(method, request, ring_method);
    if (answer.ok() && on_answer) {
      if (absl::Status s = on_answer(*answer); !s.ok()) return s;
    }
    return answer;
  }

  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> TryCallGated(Method method, const Request& request,
                                        std::optional<RingMethod> ring_method) {
    if (ring_method.has_value()) {
      if (std::shared_ptr<RingClient> r = Ring()) {
        std::optional<absl::StatusOr<std::string>> answer =
            r->Call(*ring_method, request.SerializeAsString(),
                    absl::Seconds(60), [this] { return SessionSocketHungUp(); });
        if (answer.has_value()) {
          if (answer->ok()) {
            Response response;
            if (!response.ParseFromString(**answer)) {
              return absl::InternalError("the command ring's answer is unparsable");
            }
            return response;
          }
          if (absl::IsUnavailable(answer->status())) {
            // The daemon that served this ring is gone: calls wait for it
            // over gRPC, and a resumed session gets a new ring.
            absl::MutexLock lock(&ring_mu);
            if (ring == r) ring.reset();
          }
          return answer->status();
        }
      }
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    if (!auth_token.empty()) {
      context.AddMetadata("authorization", "Bearer " + auth_token);
    }
    Response response;
    grpc::Status status = (stub.get()->*method)(&context, request, &response);
    if (status.ok()) return response;
    return FromGrpcStatus(status);
  }

  // ---- Restarts (client_resume.cc) ----
  std::string socket_path;  // unix: targets; empty over TCP
  std::string client_name;
  absl::Duration reconnect_timeout = absl::Seconds(30);
  std::atomic<uint64_t> generation{0};  // sessions resumed so far
  struct RecoveryState {
    absl::Time deadline = absl::InfiniteFuture();
    absl::Duration delay = absl::Milliseconds(10);
  };
  // After `failure` of a call made at `seen`: OK to make the call again
  // (waited for the daemon, or resumed the session), else the error to
  // return.
  absl::Status Recover(const absl::Status& failure, uint64_t seen,
                       RecoveryState& state);
  // Resumes the session with a daemon that adopted its predecessor's state:
  // a new session socket, new signal records, the descriptors passed and
  // the imports registered again with their ids, the loads and backups the
  // previous daemon had not finished submitted again. Holds the gate: no
  // other call of this client reaches the daemon meanwhile.
  absl::Status Resume(uint64_t seen) ABSL_LOCKS_EXCLUDED(resume_mu, gate_mu);
  absl::Status ResumeGated(uint64_t seen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(resume_mu);
  // Submits again each tracked operation its daemon had not finished;
  // returns how many. REQUIRES: the gate held.
  absl::StatusOr<size_t> SubmitUnfinished();
  // Takes again each reference held before the restart, where its key is
  // still cached on its page; returns how many. REQUIRES: the gate held.
  absl::StatusOr<uint64_t> TakeReferencesAgain();
  // The Operation of a submission's answer, tracked until finished.
  absl::StatusOr<Operation> Issued(bool load,
                                   std::shared_ptr<const v1::TransferRequest> request,
                                   const v1::TransferResponse& response);
  // Calls of a client share it (an attempt and what it records of the
  // answer); a resume holds it alone.
  absl::Mutex gate_mu;
  void KeepImport(uint64_t id, v1::RegisterDeviceBuffersRequest request)
      ABSL_LOCKS_EXCLUDED(resume_mu);
  void ForgetImport(uint64_t id) ABSL_LOCKS_EXCLUDED(resume_mu);
  void KeepPassedFd(uint64_t handle, int fd) ABSL_LOCKS_EXCLUDED(resume_mu);
  absl::Mutex resume_mu;
  std::map<uint64_t, v1::RegisterDeviceBuffersRequest> imports
      ABSL_GUARDED_BY(resume_mu);
  std::map<uint64_t, ScopedFd> passed_fds ABSL_GUARDED_BY(resume_mu);
};

// One request/reply exchange on the session socket; `reply_fd` receives a
// descriptor the daemon passed back, if any.
absl::StatusOr<SessionReply> SessionExchange(int socket,
                                             const SessionMessage& message,
                                             int pass_fd, ScopedFd* reply_fd);
// Connects to the session socket "<socket_path>.session".
absl::StatusOr<ScopedFd> ConnectSessionSocket(const std::string& socket_path);

// Appends `pages` to a request's repeated PageRun field.
void FillRuns(const std::vector<PageRange>& pages,
              google::protobuf::RepeatedPtrField<v1::PageRun>* out);

// The runs of a response as the client library returns them.
std::vector<PageRange> ToPageRanges(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& runs);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_CLIENT_IMPL_H_
