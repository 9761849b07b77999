// What client.cc and client_cache.cc share inside the client library: the
// session's state (Client::Impl) and how requests carry page runs. Private
// to client/.
#ifndef HOSTKV_CLIENT_CLIENT_IMPL_H_
#define HOSTKV_CLIENT_CLIENT_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "hostkv/client.h"
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
  ShmSegment signals;  // read-only
  uint32_t signal_slots = 0;
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

  // Calls one unary method with a deadline and converts the status.
  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> Call(Method method, const Request& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    if (!auth_token.empty()) {
      context.AddMetadata("authorization", "Bearer " + auth_token);
    }
    Response response;
    grpc::Status status = (stub.get()->*method)(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }
};

// Appends `pages` to a request's repeated PageRun field.
void FillRuns(const std::vector<PageRange>& pages,
              google::protobuf::RepeatedPtrField<v1::PageRun>* out);

// The runs of a response as the client library returns them.
std::vector<PageRange> ToPageRanges(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& runs);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_CLIENT_IMPL_H_
