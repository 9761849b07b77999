#include "hostkv/client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client_impl.h"
#include "client/daemon_target.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "hostkv/v1/hostkv.grpc.pb.h"
#include "proto/contract/grpc_status.h"
#include "proto/contract/op_signal.h"
#include "proto/contract/session_socket.h"
#include "proto/contract/shm_segment.h"
#include "proto/contract/status_macros.h"

namespace hostkv {

// One request/reply exchange on the session socket; `reply_fd` receives a
// descriptor the daemon passed back, if any.
absl::StatusOr<SessionReply> SessionExchange(int socket, const SessionMessage& message,
                                      int pass_fd, ScopedFd* reply_fd) {
  // A refused connection has its reply waiting already, so read even if
  // the send failed.
  const bool sent = SendRecord(socket, &message, sizeof(message), pass_fd);
  const int send_errno = errno;
  if (!sent && send_errno == EPERM && pass_fd >= 0) {
    // The kernel refused the descriptor for the daemon (SO_PASSRIGHTS off):
    // this uid's refused descriptors still wait to be closed. The record
    // was not sent; no reply comes.
    return absl::ResourceExhaustedError(
        "the daemon takes no descriptors from this uid for now (descriptors "
        "it refused from this uid still wait to be closed); try again later");
  }
  SessionReply reply{};
  ReceivedRecord got = ReceiveRecord(socket, &reply, sizeof(reply), false);
  if (got.bytes != static_cast<ssize_t>(sizeof(reply))) {
    return absl::UnavailableError(absl::StrCat(
        "the daemon closed the session socket",
        sent ? "" : absl::StrCat(" (send: ", std::strerror(send_errno), ")")));
  }
  reply.message[sizeof(reply.message) - 1] = '\0';
  if (reply.code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply.code), reply.message);
  }
  if (reply_fd != nullptr) *reply_fd = std::move(got.fd);
  return reply;
}

// Connects to the session socket "<path>.session".
absl::StatusOr<ScopedFd> ConnectSessionSocket(const std::string& socket_path) {
  const std::string path = socket_path + kSessionSocketSuffix;
  ScopedFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("session socket path too long: " + path);
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to the session socket ", path, ": ", std::strerror(errno)));
  }
  return fd;
}

void FillRuns(const std::vector<PageRange>& pages,
              google::protobuf::RepeatedPtrField<v1::PageRun>* out) {
  out->Reserve(static_cast<int>(pages.size()));
  for (const PageRange& p : pages) {
    v1::PageRun* run = out->Add();
    run->set_first_page(p.first_page);
    run->set_num_pages(p.num_pages);
  }
}

std::vector<PageRange> ToPageRanges(
    const google::protobuf::RepeatedPtrField<v1::PageRun>& runs) {
  std::vector<PageRange> pages;
  pages.reserve(runs.size());
  for (const v1::PageRun& run : runs) {
    pages.push_back({run.first_page(), run.num_pages()});
  }
  return pages;
}

absl::StatusOr<bool> CheckHealth(const std::string& given_target,
                                 const std::string& service,
                                 const ConnectOptions& options) {
  ASSIGN_OR_RETURN(const std::string target, ResolveDaemonTarget(given_target));
  if (absl::StartsWith(target, "unix:")) RETURN_IF_ERROR(CheckDaemonSocket(target.substr(5)));
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  if (!options.auth_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options.auth_token);
  }
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

uint64_t CountTokens(const std::vector<PageRange>& pages, uint32_t page_size) {
  uint64_t tokens = 0;
  for (const PageRange& p : pages) tokens += p.num_pages * page_size;
  return tokens;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() { Close().IgnoreError(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& given_target, const std::string& client_name,
    const ConnectOptions& options) {
  ASSIGN_OR_RETURN(const std::string resolved, ResolveDaemonTarget(given_target));
  const std::string& target = resolved;
  const bool unix_socket = absl::StartsWith(target, "unix:");
  if (unix_socket) RETURN_IF_ERROR(CheckDaemonSocket(target.substr(5)));
  if (client_name.size() >= sizeof(SessionMessage::client_name)) {
    return absl::InvalidArgumentError("client_name is longer than 200 bytes");
  }
  auto impl = std::make_unique<Impl>();
  impl->auth_token = options.auth_token;
  impl->reconnect_timeout = options.reconnect_timeout;
  if (unix_socket) {
    impl->socket_path = target.substr(5);
    impl->client_name = client_name;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // A restarted daemon is found within ~0.1 s, not gRPC's default backoff
  // of up to 2 minutes (a refused connect to a local socket costs little).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  // Also the least time a connection attempt gets for its handshake: a busy
  // daemon must not be given up on after 100 ms.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  impl->channel = grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args);
  if (!impl->channel->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::seconds(5))) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach hostkvd at ", target,
                     " (is it running? is the socket path right?)"));
  }
  impl->stub = v1::HostKV::NewStub(impl->channel);
  if (const char* ring = std::getenv("HOSTKV_COMMAND_RING");
      ring != nullptr && std::string_view(ring) == "0") {
    impl->want_ring = false;
  }
  if (unix_socket) {
    RETURN_IF_ERROR(impl->OpenOverSessionSocket(target.substr(5), client_name));
    return std::unique_ptr<Client>(new Client(std::move(impl)));
  }
  v1::OpenSessionRequest request;
  request.set_client_name(client_name);
  request.set_pid(static_cast<uint32_t>(getpid()));
  ASSIGN_OR_RETURN(v1::OpenSessionResponse response,
                   (impl->Call<v1::OpenSessionRequest, v1::OpenSessionResponse>(
                       &v1::HostKV::Stub::OpenSession, request)));
  impl->session_id = response.session_id();
  impl->session_number = response.session_number();
  impl->open = true;
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  Impl& self = *client->impl_;
  const absl::Duration period =
      absl::Seconds(std::max<uint32_t>(1, response.lease_seconds())) / 3;
  self.renewer = std::thread([&self, period] {
    v1::RenewSessionRequest renew;
    renew.set_session_id(self.session_id);
    absl::MutexLock lock(&self.renew_mu);
    while (!self.renew_mu.AwaitWithTimeout(
        absl::Condition(&self.stop_renewing), period)) {
      self.renew_mu.Unlock();
      self.Call<v1::RenewSessionRequest, v1::RenewSessionResponse>(
              &v1::HostKV::Stub::RenewSession, renew)
          .IgnoreError();
      self.renew_mu.Lock();
    }
  });
  absl::StatusOr<ShmSegment> signals = ShmSegment::Open(
      response.signal_segment(), ShmSegment::Access::kReadOnly);
  if (!signals.ok()) return signals.status();  // ~Client closes the session
  if (signals->size() < uint64_t{response.signal_slots()} * sizeof(OpSignal)) {
    return absl::InternalError("the signal segment is smaller than announced");
  }
  client->impl_->records.UseSegment(SignalRecords{
      response.signal_segment_id(), std::move(*signals), response.signal_slots()});
  return client;
}

absl::Status Client::Impl::OpenOverSessionSocket(const std::string& socket_path,
                                                 const std::string& client_name) {
  ASSIGN_OR_RETURN(ScopedFd fd, ConnectSessionSocket(socket_path));
  SessionMessage message =
      NewSessionMessage(SessionMessageKind::kOpen, client_name);
  ScopedFd signal_fd;
  ASSIGN_OR_RETURN(SessionReply reply,
                   SessionExchange(fd.get(), message, -1, &signal_fd));
  if (signal_fd.get() < 0) {
    return absl::InternalError("the daemon sent no signal segment");
  }
  ASSIGN_OR_RETURN(ShmSegment signals,
                   ShmSegment::MapFd(signal_fd.get(), "signal segment",
                                     ShmSegment::Access::kReadOnly));
  if (signals.size() < uint64_t{reply.signal_slots} * sizeof(OpSignal)) {
    return absl::InternalError("the signal segment is smaller than announced");
  }
  session_id.assign(reinterpret_cast<const char*>(reply.session_id),
                    kSessionIdBytes);
  session_number = reply.session_number;
  records.UseSegment(
      SignalRecords{reply.value, std::move(signals), reply.signal_slots});
  open = true;
  std::shared_ptr<RingClient> opened = OpenRing(fd.get(), reply.features);
  {
    absl::MutexLock lock(&ring_mu);
    ring = std::move(opened);
  }
  absl::MutexLock lock(&socket_mu);
  session_socket = std::move(fd);
  return absl::OkStatus();
}

std::shared_ptr<RingClient> Client::Impl::OpenRing(int socket,
                                                   uint32_t features) {
  if (!want_ring || (features & kSessionFeatureCommandRing) == 0) return nullptr;
  ScopedFd ring_fd;
  absl::StatusOr<SessionReply> reply = SessionExchange(
      socket, NewSessionMessage(SessionMessageKind::kOpenCommandRing), -1,
      &ring_fd);
  if (!reply.ok() || ring_fd.get() < 0) return nullptr;  // calls use gRPC
  absl::StatusOr<std::unique_ptr<RingClient>> mapped =
      RingClient::Map(ring_fd.get(), reply->value);
  if (!mapped.ok()) return nullptr;
  return std::shared_ptr<RingClient>(std::move(*mapped));
}

bool Client::Impl::SessionSocketHungUp() {
  int fd;
  {
    absl::MutexLock lock(&socket_mu);
    fd = session_socket.get();
  }
  if (fd < 0) return true;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 &&
         (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

absl::StatusOr<uint64_t> Client::PassDescriptor(int fd) {
  uint64_t handle = 0;
  {
    absl::MutexLock lock(&impl_->socket_mu);
    if (impl_->session_socket.get() < 0) {
      return absl::FailedPreconditionError(
          "descriptors travel over the session socket: connect to a unix: target");
    }
    ASSIGN_OR_RETURN(SessionReply reply,
                     SessionExchange(impl_->session_socket.get(),
                                     NewSessionMessage(SessionMessageKind::kPassFd),
                                     fd, nullptr));
    handle = reply.value;
  }
  // Lock order: resume_mu before socket_mu (Resume).
  impl_->KeepPassedFd(handle, fd);
  return handle;
}

absl::StatusOr<int> Client::FetchKvWord(uint64_t import_id) {
  absl::MutexLock lock(&impl_->socket_mu);
  if (impl_->session_socket.get() < 0) {
    return absl::FailedPreconditionError(
        "the KV-written page travels over the session socket: connect to a "
        "unix: target");
  }
  SessionMessage message = NewSessionMessage(SessionMessageKind::kFetchKvWord);
  message.import_id = import_id;
  ScopedFd page;
  RETURN_IF_ERROR(
      SessionExchange(impl_->session_socket.get(), message, -1, &page).status());
  if (page.get() < 0) {
    return absl::InternalError("the daemon's reply carried no descriptor");
  }
  return page.release();
}

absl::StatusOr<Client::PoolSegment> Client::FetchPoolSegment(
    const std::string& pool) {
  SessionMessage message = NewSessionMessage(SessionMessageKind::kFetchPoolSegment);
  if (pool.empty() || pool.size() >= sizeof(message.client_name)) {
    return absl::InvalidArgumentError("a pool name of 1..64 characters");
  }
  std::memcpy(message.client_name, pool.data(), pool.size());
  absl::MutexLock lock(&impl_->socket_mu);
  if (impl_->session_socket.get() < 0) {
    return absl::FailedPreconditionError(
        "pool segments travel over the session socket: connect to a unix: "
        "target");
  }
  ScopedFd fd;
  ASSIGN_OR_RETURN(SessionReply reply,
                   SessionExchange(impl_->session_socket.get(), message, -1, &fd));
  if (fd.get() < 0) {
    return absl::InternalError("the daemon's reply carried no descriptor");
  }
  return PoolSegment{fd.release(), reply.value == 1};
}

const std::string& Client::session_id() const { return impl_->session_id; }
uint32_t Client::session_number() const { return impl_->session_number; }

int64_t Client::CommandRingCalls() const {
  std::shared_ptr<RingClient> ring = impl_->Ring();
  return ring == nullptr ? -1 : static_cast<int64_t>(ring->calls());
}

void Client::Impl::StopWatcher() {
  if (!watcher.joinable()) return;
  const char byte = 0;
  if (write(watch_wake[1].get(), &byte, 1) < 0) {
    // The pipe is ours and empty: cannot fail short of EINTR; the join below
    // then waits for the next hang-up poll timeout.
  }
  watcher.join();
}

absl::Status Client::OnDaemonLost(std::function<void()> fn) {
  if (impl_->watcher.joinable()) {
    return absl::FailedPreconditionError(
        "OnDaemonLost: already watching; register every callback in one call");
  }
  int fds[2];
  int session_fd = -1;
  {
    absl::MutexLock lock(&impl_->socket_mu);
    session_fd = impl_->session_socket.get();
  }
  if (session_fd < 0) {
    return absl::FailedPreconditionError(
        "OnDaemonLost needs the session socket: connect to a unix: target");
  }
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  impl_->watch_wake[0] = ScopedFd(fds[0]);
  impl_->watch_wake[1] = ScopedFd(fds[1]);
  impl_->on_lost.push_back(std::move(fn));
  Impl& self = *impl_;
  // Polls for hang-up only (POLLRDHUP, not POLLIN): replies on the socket
  // are left to the request that waits for them.
  self.watcher = std::thread([&self, session_fd] {
    pollfd fds[2] = {{session_fd, POLLRDHUP, 0},
                     {self.watch_wake[0].get(), POLLIN, 0}};
    while (true) {
      fds[0].revents = fds[1].revents = 0;
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;  // Close()
      if ((fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
        for (const std::function<void()>& fn : self.on_lost) fn();
        return;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status Client::Close() {
  impl_->StopWatcher();
  if (impl_->renewer.joinable()) {
    {
      absl::MutexLock lock(&impl_->renew_mu);
      impl_->stop_renewing = true;
    }
    impl_->renewer.join();
  }
  if (!impl_->open) return absl::OkStatus();
  impl_->open = false;
  v1::CloseSessionRequest request;
  request.set_session_id(impl_->session_id);
  absl::Status status =
      impl_->Call<v1::CloseSessionRequest, v1::CloseSessionResponse>(
          &v1::HostKV::Stub::CloseSession, request)
          .status();
  absl::MutexLock lock(&impl_->socket_mu);
  impl_->session_socket = ScopedFd();
  return status;
}

absl::StatusOr<v1::Pool> Client::CreatePool(const v1::PoolSpec& spec,
                                            bool attach_if_exists,
                                            bool delete_with_session) {
  v1::CreatePoolRequest request;
  request.set_delete_with_session(delete_with_session);
  request.set_session_id(impl_->session_id);
  *request.mutable_spec() = spec;
  request.set_attach_if_exists(attach_if_exists);
  return impl_->Call<v1::CreatePoolRequest, v1::Pool>(
      &v1::HostKV::Stub::CreatePool, request);
}

absl::StatusOr<v1::Pool> Client::GetPool(const std::string& name) {
  v1::GetPoolRequest request;
  request.set_pool(name);
  return impl_->Call<v1::GetPoolRequest, v1::Pool>(&v1::HostKV::Stub::GetPool,
                                                   request);
}

absl::StatusOr<std::vector<v1::Pool>> Client::ListPools() {
  ASSIGN_OR_RETURN(v1::ListPoolsResponse response,
                   (impl_->Call<v1::ListPoolsRequest, v1::ListPoolsResponse>(
                       &v1::HostKV::Stub::ListPools, v1::ListPoolsRequest())));
  return std::vector<v1::Pool>(response.pools().begin(), response.pools().end());
}

absl::Status Client::DeletePool(const std::string& name) {
  v1::DeletePoolRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(name);
  return impl_->Call<v1::DeletePoolRequest, v1::DeletePoolResponse>(
                 &v1::HostKV::Stub::DeletePool, request)
      .status();
}

absl::StatusOr<uint64_t> Client::RegisterDeviceBuffers(
    const std::string& pool, uint64_t token_slots,
    const std::vector<v1::DeviceBuffer>& k,
    const std::vector<v1::DeviceBuffer>& v,
    const v1::DeviceBuffer* gpu_signals) {
  v1::RegisterDeviceBuffersRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  request.set_token_slots(token_slots);
  for (const auto& b : k) *request.add_k_buffers() = b;
  for (const auto& b : v) *request.add_v_buffers() = b;
  if (gpu_signals != nullptr) *request.mutable_gpu_signals() = *gpu_signals;
  ASSIGN_OR_RETURN(v1::RegisterDeviceBuffersResponse response,
                   (impl_->Call<v1::RegisterDeviceBuffersRequest,
                                v1::RegisterDeviceBuffersResponse>(
                       &v1::HostKV::Stub::RegisterDeviceBuffers, request)));
  impl_->KeepImport(response.import_id(), std::move(request));
  return response.import_id();
}

absl::Status Client::UnregisterDeviceBuffers(uint64_t import_id) {
  v1::UnregisterDeviceBuffersRequest request;
  request.set_session_id(impl_->session_id);
  request.set_import_id(import_id);
  absl::Status status =
      impl_->Call<v1::UnregisterDeviceBuffersRequest,
                  v1::UnregisterDeviceBuffersResponse>(
          &v1::HostKV::Stub::UnregisterDeviceBuffers, request)
          .status();
  if (status.ok()) impl_->ForgetImport(import_id);
  return status;
}

absl::StatusOr<std::vector<PageRange>> Client::Alloc(const std::string& pool,
                                                     uint64_t num_tokens) {
  return Alloc(pool, num_tokens, AllocOptions{});
}

absl::StatusOr<std::vector<PageRange>> Client::Alloc(
    const std::string& pool, uint64_t num_tokens, const AllocOptions& options) {
  v1::AllocRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  request.set_num_tokens(num_tokens);
  request.set_fill_wait_ms(options.fill_wait_ms);
  request.set_fill_no_wait(options.fill_no_wait);
  ASSIGN_OR_RETURN(v1::AllocResponse response,
                   (impl_->Call<v1::AllocRequest, v1::AllocResponse>(
                       &v1::HostKV::Stub::Alloc, request, RingMethod::kAlloc)));
  return ToPageRanges(response.pages());
}

absl::StatusOr<uint64_t> Client::Free(const std::string& pool,
                                      const std::vector<PageRange>& pages) {
  v1::FreeRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  FillRuns(pages, request.mutable_pages());
  ASSIGN_OR_RETURN(v1::FreeResponse response,
                   (impl_->Call<v1::FreeRequest, v1::FreeResponse>(
                       &v1::HostKV::Stub::Free, request, RingMethod::kFree)));
  return response.pages_freed();
}

absl::StatusOr<uint64_t> Client::HandOverPages(
    const std::string& pool, const std::vector<PageRange>& pages,
    uint32_t to_session_number) {
  v1::HandOverPagesRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  FillRuns(pages, request.mutable_pages());
  request.set_to_session_number(to_session_number);
  ASSIGN_OR_RETURN(v1::HandOverPagesResponse response,
                   (impl_->Call<v1::HandOverPagesRequest, v1::HandOverPagesResponse>(
                       &v1::HostKV::Stub::HandOverPages, request)));
  return response.pages();
}

absl::StatusOr<Operation> Client::Transfer(
    bool load, const std::string& pool, uint64_t import_id,
    const std::vector<PageRange>& host_pages,
    const std::vector<SlotRange>& device_slots,
    const TransferOptions& options) {
  // Kept (not copied) for a resume that may submit it again.
  auto shared = std::make_shared<v1::TransferRequest>();
  v1::TransferRequest& request = *shared;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  request.set_import_id(import_id);
  // Flat pairs: much cheaper to encode and decode than one message per run.
  auto* host = request.mutable_host_page_pairs();
  host->Reserve(static_cast<int>(2 * host_pages.size()));
  for (const PageRange& p : host_pages) {
    host->AddAlreadyReserved(p.first_page);
    host->AddAlreadyReserved(p.num_pages);
  }
  auto* device = request.mutable_device_slot_pairs();
  device->Reserve(static_cast<int>(2 * device_slots.size()));
  for (const SlotRange& s : device_slots) {
    device->AddAlreadyReserved(s.first_slot);
    device->AddAlreadyReserved(s.num_slots);
  }
  request.set_layer_begin(options.layer_begin);
  request.set_layer_end(options.layer_end);
  request.set_mechanism(options.mechanism);
  request.set_wait_kv_written(options.wait_kv_written);
  request.set_progress_at_end(options.progress_at_end);
  std::optional<absl::StatusOr<Operation>> op;
  std::shared_ptr<const v1::TransferRequest> kept = std::move(shared);
  RETURN_IF_ERROR(
      (impl_->Call<v1::TransferRequest, v1::TransferResponse>(
           load ? &v1::HostKV::Stub::Load : &v1::HostKV::Stub::Backup, *kept,
           load ? RingMethod::kLoad : RingMethod::kBackup,
           [&](const v1::TransferResponse& response) {
             op = impl_->Issued(load, kept, response);
             return op->status();
           }))
          .status());
  return *std::move(op);
}

absl::StatusOr<Operation> Client::Load(const std::string& pool,
                                       uint64_t import_id,
                                       const std::vector<PageRange>& host_pages,
                                       const std::vector<SlotRange>& device_slots,
                                       const TransferOptions& options) {
  return Transfer(true, pool, import_id, host_pages, device_slots, options);
}

absl::StatusOr<Operation> Client::Backup(
    const std::string& pool, uint64_t import_id,
    const std::vector<PageRange>& host_pages,
    const std::vector<SlotRange>& device_slots, const TransferOptions& options) {
  return Transfer(false, pool, import_id, host_pages, device_slots, options);
}

absl::Status Client::WaitLayer(const Operation& given, uint32_t layer,
                               absl::Duration timeout) {
  if (layer < given.layer_begin || layer - given.layer_begin >= given.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operation ", given.op_id, " covers layers [", given.layer_begin, ", ",
        given.layer_begin + given.num_layers, "), not ", layer));
  }
  const absl::Time deadline = absl::Now() + timeout;
  Operation op = given;
  while (true) {
    // What a resume submitted again for it, if it did.
    if (std::optional<absl::StatusOr<Operation>> again =
            impl_->records.Replacement(op)) {
      if (!again->ok()) return again->status();
      op = **again;
      continue;
    }
    const uint32_t layers = layer - op.layer_begin + 1;
    std::shared_ptr<const SignalRecords> records =
        impl_->records.Segment(op.signal_segment);
    if (records == nullptr || op.signal_index >= records->slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "operation ", op.op_id, " is not one of this client's"));
    }
    const OpSignal& signal =
        reinterpret_cast<const OpSignal*>(records->segment.data())[op.signal_index];
    const bool current = op.signal_segment == impl_->records.current();
    if (!current) {
      // Of an earlier daemon, and no resume submitted it again: it had
      // finished there, or this client kept no record of it.
      if (impl_->records.Ended(op, layers)) {
        return WaitForLayers(signal, op.op_id, layers, absl::ZeroDuration());
      }
      {
        // A resume under way decides its fate first.
        absl::MutexLock resume_lock(&impl_->resume_mu);
      }
      if (impl_->records.Replacement(op).has_value()) continue;
      return absl::AbortedError(absl::StrCat(
          "hostkvd restarted while operation ", op.op_id, " was in flight: "
          "submit it again (loads and backups may be repeated)"));
    }
    // In slices: a daemon that died mid-operation never completes it; the
    // session socket's hang-up says so.
    const absl::Duration left = deadline - absl::Now();
    absl::Status s = WaitForLayers(signal, op.op_id, layers,
                                   std::min(left, absl::Milliseconds(200)));
    if (!absl::IsDeadlineExceeded(s) || absl::Now() >= deadline) return s;
    if (impl_->socket_path.empty() || !impl_->SessionSocketHungUp()) continue;
    // The daemon went away: a call waits for the next one and resumes the
    // session (which submits `op` again).
    v1::RenewSessionRequest renew;
    renew.set_session_id(impl_->session_id);
    RETURN_IF_ERROR(
        (impl_->Call<v1::RenewSessionRequest, v1::RenewSessionResponse>(
             &v1::HostKV::Stub::RenewSession, renew))
            .status());
  }
}

absl::Status Client::Wait(const Operation& op, absl::Duration timeout) {
  if (op.num_layers == 0) return absl::OkStatus();
  return WaitLayer(op, op.layer_begin + op.num_layers - 1, timeout);
}

absl::StatusOr<std::string> Client::ReadPages(
    const std::string& pool, const std::vector<PageRange>& pages) {
  v1::ReadPagesRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  FillRuns(pages, request.mutable_pages());
  ASSIGN_OR_RETURN(v1::ReadPagesResponse response,
                   (impl_->Call<v1::ReadPagesRequest, v1::ReadPagesResponse>(
                       &v1::HostKV::Stub::ReadPages, request)));
  return std::move(*response.mutable_data());
}

absl::Status Client::WritePages(const std::string& pool,
                                const std::vector<PageRange>& pages,
                                const std::string& data) {
  v1::WritePagesRequest request;
  request.set_session_id(impl_->session_id);
  request.set_pool(pool);
  FillRuns(pages, request.mutable_pages());
  request.set_data(data);
  return impl_->Call<v1::WritePagesRequest, v1::WritePagesResponse>(
                 &v1::HostKV::Stub::WritePages, request)
      .status();
}

absl::StatusOr<v1::GetPageBufferMetaResponse> Client::GetPageBufferMeta(
    const std::string& pool, const std::vector<PageRange>& pages) {
  v1::GetPageBufferMetaRequest request;
  request.set_pool(pool);
  FillRuns(pages, request.mutable_pages());
  return impl_->Call<v1::GetPageBufferMetaRequest, v1::GetPageBufferMetaResponse>(
      &v1::HostKV::Stub::GetPageBufferMeta, request);
}

absl::StatusOr<v1::GetPoolStatsResponse> Client::GetPoolStats(
    const std::string& pool) {
  v1::GetPoolStatsRequest request;
  request.set_pool(pool);
  return impl_->Call<v1::GetPoolStatsRequest, v1::GetPoolStatsResponse>(
      &v1::HostKV::Stub::GetPoolStats, request);
}

}  // namespace hostkv
