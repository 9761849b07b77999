#include "server/operations/metrics_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

namespace hostkv {

namespace {

constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr absl::Duration kConnectionTime = absl::Seconds(5);
constexpr int kWorkers = 2;

// A listening TCP socket (nonblocking) on `address`, and the port bound.
absl::StatusOr<ScopedFd> Listen(const std::string& address, int* port) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string service =
      colon == std::string::npos ? address : address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc =
      getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(),
                  service.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--metrics_listen ", address, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  ScopedFd fd;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = ScopedFd(socket(a->ai_family,
                         a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         a->ai_protocol));
    const int on = 1;
    if (fd.get() >= 0 &&
        setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) == 0 &&
        bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 &&
        listen(fd.get(), 64) == 0) {
      break;
    }
    error = std::strerror(errno);
    fd = ScopedFd();
  }
  freeaddrinfo(found);
  if (fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--metrics_listen ", address, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length);
  *port = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

std::string Response(int code, absl::string_view reason,
                     absl::string_view headers, absl::string_view body,
                     bool with_body = true) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\n", headers,
                      "Content-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n",
                      with_body ? body : absl::string_view());
}

std::string PlainResponse(int code, absl::string_view reason,
                          absl::string_view extra_headers = "") {
  return Response(code, reason,
                  absl::StrCat("Content-Type: text/plain; charset=utf-8\r\n",
                               extra_headers),
                  absl::StrCat(reason, "\n"));
}

// What Answer needs of a request: the request line's parts and the
// Authorization header.
struct HttpRequest {
  std::string method;
  std::string path;  // without the query
  std::string authorization;
};

// `head`: the request up to its blank line. False if it is not HTTP/1.x.
bool ParseRequest(absl::string_view head, HttpRequest* request) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  std::vector<absl::string_view> first =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(lines[0]), ' ');
  if (first.size() != 3 || !absl::StartsWith(first[2], "HTTP/1.")) return false;
  request->method = std::string(first[0]);
  request->path = std::string(first[1].substr(0, first[1].find('?')));
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::EqualsIgnoreCase(
            absl::StripAsciiWhitespace(lines[i].substr(0, colon)),
            "authorization") &&
        request->authorization.empty()) {
      request->authorization =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
  }
  return true;
}

std::string Peer(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0) {
    getnameinfo(reinterpret_cast<sockaddr*>(&peer), length, host, sizeof(host),
                port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

std::string NamespaceLabel(absl::string_view name_space) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(name_space.data(), name_space.size(), digest, &length,
                 EVP_sha256(), nullptr) != 1 ||
      length != 32) {
    std::abort();  // only a broken libcrypto; no name may leak instead
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), 6));
}

void HashNamespaceLabels(std::vector<prometheus::MetricFamily>& families) {
  for (prometheus::MetricFamily& family : families) {
    for (prometheus::ClientMetric& metric : family.metric) {
      for (prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "namespace") {
          label.value = NamespaceLabel(label.value);
        }
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    MetricsEndpointOptions options,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  int port = 0;
  absl::StatusOr<ScopedFd> listener = Listen(options.listen, &port);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(
      std::move(options), std::move(collectables), *std::move(listener), port));
}

MetricsEndpoint::MetricsEndpoint(
    MetricsEndpointOptions options,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
    ScopedFd listener, int port)
    : options_(std::move(options)),
      collectables_(std::move(collectables)),
      listener_(std::move(listener)),
      port_(port) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) std::abort();  // out of descriptors at start
  stop_read_ = ScopedFd(fds[0]);
  stop_write_ = ScopedFd(fds[1]);
  for (int i = 0; i < kWorkers; ++i) workers_.emplace_back([this] { Serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_write_ = ScopedFd();  // every poll on stop_read_ sees the hang-up
  for (std::thread& worker : workers_) worker.join();
}

bool MetricsEndpoint::WaitFor(int fd, short events, absl::Time deadline) const {
  for (;;) {
    int timeout_ms = -1;  // deadline InfiniteFuture: no timeout
    if (deadline != absl::InfiniteFuture()) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0) return false;
      timeout_ms = static_cast<int>(std::min<int64_t>(ms, 60000));
    }
    pollfd fds[2] = {{fd, events, 0}, {stop_read_.get(), POLLIN, 0}};
    const int n = poll(fds, 2, timeout_ms);
    if (n < 0 && errno != EINTR) return false;
    if (fds[1].revents != 0) return false;
    if (n > 0 && fds[0].revents != 0) return true;
  }
}

void MetricsEndpoint::Serve() const {
  for (;;) {
    if (!WaitFor(listener_.get(), POLLIN, absl::InfiniteFuture())) {
      // Stopped (or poll failed): a worker that cannot poll stops too.
      return;
    }
    const ScopedFd connection(accept4(listener_.get(), nullptr, nullptr,
                                      SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (connection.get() >= 0) {
      Answer(connection.get());
    } else if (errno == EMFILE || errno == ENFILE) {
      absl::SleepFor(absl::Milliseconds(100));  // descriptors run out: no spin
    }
  }
}

bool MetricsEndpoint::Send(int connection, absl::string_view bytes,
                           absl::Time deadline) const {
  while (!bytes.empty()) {
    const ssize_t n =
        send(connection, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      if (!WaitFor(connection, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  shutdown(connection, SHUT_WR);
  return true;
}

bool MetricsEndpoint::ReadHead(int connection, absl::Time deadline,
                               std::string* head) const {
  char buf[2048];
  for (;;) {
    size_t end = head->find("\r\n\r\n");
    if (end == std::string::npos) end = head->find("\n\n");
    if (end != std::string::npos && end <= kMaxRequestBytes) {
      head->resize(end);
      return true;
    }
    if (end != std::string::npos || head->size() > kMaxRequestBytes) {
      Send(connection, PlainResponse(431, "Request Header Fields Too Large"),
           deadline);
      return false;
    }
    const ssize_t n = recv(connection, buf, sizeof(buf), 0);
    if (n > 0) {
      head->append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR) ||
               !WaitFor(connection, POLLIN, deadline)) {
      return false;  // closed, failed or too slow: nothing to answer
    }
  }
}

void MetricsEndpoint::LogRefusal(int connection, bool had_token) const {
  const char* why = had_token ? "with a wrong token" : "without the token";
  uint64_t held_back = 0;
  if (refusals_.Allow(&held_back)) {
    spdlog::warn("metrics: refused a request from {} {} ({} more held back)",
                 Peer(connection), why, held_back);
  } else {
    spdlog::debug("metrics: refused a request from {} {}", Peer(connection),
                  why);
  }
}

void MetricsEndpoint::Answer(int connection) const {
  const absl::Time deadline = absl::Now() + kConnectionTime;
  std::string head;
  if (!ReadHead(connection, deadline, &head)) return;
  HttpRequest request;
  std::string response;
  if (!ParseRequest(head, &request)) {
    response = PlainResponse(400, "Bad Request");
  } else if (options_.authorize != nullptr &&
             !options_.authorize(request.authorization)) {
    LogRefusal(connection, !request.authorization.empty());
    response =
        PlainResponse(401, "Unauthorized",
                      "WWW-Authenticate: Bearer realm=\"hostkvd metrics\"\r\n");
  } else if (request.method != "GET" && request.method != "HEAD") {
    response = PlainResponse(405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
  } else if (request.path != "/metrics") {
    response = PlainResponse(404, "Not Found");
  } else {
    response = Response(
        200, "OK", "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n",
        Render(), /*with_body=*/request.method == "GET");
  }
  Send(connection, response, deadline);
}

std::string MetricsEndpoint::Render() const {
  std::vector<prometheus::MetricFamily> families;
  for (const std::shared_ptr<prometheus::Collectable>& collectable :
       collectables_) {
    std::vector<prometheus::MetricFamily> more = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  if (!options_.namespace_names) HashNamespaceLabels(families);
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace hostkv
