#include "server/operations/metrics_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
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
// A request head has this long from the connection's accept; the answer
// then has kAnswerTime to be taken.
constexpr absl::Duration kHeadTime = absl::Seconds(2);
constexpr absl::Duration kAnswerTime = absl::Seconds(5);
// Connections accepted per round of the loop, so that the connections
// already open are read between bursts of new ones.
constexpr int kAcceptsPerRound = 16;

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

// The peer's address, without its port.
std::string PeerAddress(const sockaddr_storage& peer, socklen_t length) {
  char host[NI_MAXHOST] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&peer), length, host,
              sizeof(host), nullptr, 0, NI_NUMERICHOST);
  return host;
}

}  // namespace

std::string HashedLabel(absl::string_view key, absl::string_view name) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(name.data()), name.size(),
           digest, &length) == nullptr ||
      length != 32) {
    std::abort();  // only a broken libcrypto; no name may leak instead
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), 6));
}

void HashNameLabels(absl::string_view key,
                    std::vector<prometheus::MetricFamily>& families) {
  for (prometheus::MetricFamily& family : families) {
    for (prometheus::ClientMetric& metric : family.metric) {
      for (prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "namespace" || label.name == "pool") {
          label.value = HashedLabel(key, label.value);
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
  connections_.reserve(kMaxConnections);
  thread_ = std::thread([this] { Loop(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_write_ = ScopedFd();  // the loop's poll on stop_read_ sees the hang-up
  thread_.join();
}

void MetricsEndpoint::Loop() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({stop_read_.get(), POLLIN, 0});
    // Out of descriptors, the listener stays readable: it is left out of
    // the poll for a while instead of spinning on it.
    const bool accepting = absl::Now() >= accept_paused_until_;
    fds.push_back(
        {listener_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    absl::Time next = absl::Now() + absl::Seconds(1);
    if (!accepting) next = std::min(next, accept_paused_until_);
    for (const Connection& c : connections_) {
      fds.push_back({c.fd.get(),
                     static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      next = std::min(next, c.deadline);
    }
    const int64_t wait_ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(next - absl::Now()) + 1);
    const int n = poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (n < 0 && errno != EINTR) {
      spdlog::error("metrics: poll failed ({}); /metrics stops",
                    std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;  // stopped
    // fds[i + 2] is connections_[i]: the connections accepted below come
    // after them and wait for the next round.
    const size_t polled = connections_.size();
    for (size_t i = 0; i < polled; ++i) {
      Connection& c = connections_[i];
      if (fds[i + 2].revents == 0) continue;
      if (c.out.empty()) {
        ReadFrom(c);
      } else {
        WriteTo(c);
      }
    }
    const absl::Time now = absl::Now();
    for (Connection& c : connections_) {
      if (now >= c.deadline) c.done = true;  // too slow: closed unanswered
    }
    std::erase_if(connections_, [](const Connection& c) { return c.done; });
    if (fds[1].revents != 0) AcceptSome();
  }
}

void MetricsEndpoint::AcceptSome() {
  for (int i = 0; i < kAcceptsPerRound; ++i) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    ScopedFd fd(accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer),
                        &length, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        accept_paused_until_ = absl::Now() + absl::Milliseconds(100);
      }
      return;  // none waiting, or out of descriptors
    }
    Connection c;
    c.peer = PeerAddress(peer, length);
    const size_t from_peer =
        std::count_if(connections_.begin(), connections_.end(),
                      [&](const Connection& o) { return o.peer == c.peer; });
    if (from_peer >= options_.connections_per_peer) {
      spdlog::debug("metrics: closed a connection from {}: it has {} open",
                    c.peer, from_peer);
      continue;  // closed: the peer's own connections are its bound
    }
    if (connections_.size() >= kMaxConnections) {
      // Full: the oldest connection still without its request goes (an
      // idle one; a scrape sends its request at once).
      auto oldest = connections_.end();
      for (auto it = connections_.begin(); it != connections_.end(); ++it) {
        if (it->out.empty() &&
            (oldest == connections_.end() || it->accepted < oldest->accepted)) {
          oldest = it;
        }
      }
      if (oldest == connections_.end()) continue;  // all answering: closed
      connections_.erase(oldest);
    }
    c.fd = std::move(fd);
    c.accepted = absl::Now();
    c.deadline = c.accepted + kHeadTime;
    connections_.push_back(std::move(c));
  }
}

void MetricsEndpoint::ReadFrom(Connection& c) {
  char buf[2048];
  for (;;) {
    const ssize_t n = recv(c.fd.get(), buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      c.done = true;  // closed or failed: nothing to answer
      return;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: the rest comes later
    c.head.append(buf, static_cast<size_t>(n));
    size_t end = c.head.find("\r\n\r\n");
    if (end == std::string::npos) end = c.head.find("\n\n");
    if (end != std::string::npos && end <= kMaxRequestBytes) {
      c.out = AnswerTo(c, absl::string_view(c.head).substr(0, end));
    } else if (end != std::string::npos || c.head.size() > kMaxRequestBytes) {
      c.out = PlainResponse(431, "Request Header Fields Too Large");
    } else {
      continue;
    }
    c.head.clear();
    c.deadline = absl::Now() + kAnswerTime;
    WriteTo(c);
    return;
  }
}

void MetricsEndpoint::WriteTo(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd.get(), c.out.data() + c.sent,
                           c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;  // the rest when it can take it
    } else {
      c.done = true;  // the peer went away
      return;
    }
  }
  shutdown(c.fd.get(), SHUT_WR);
  c.done = true;
}

void MetricsEndpoint::LogRefusal(const Connection& c, bool had_token) const {
  const char* why = had_token ? "with a wrong token" : "without the token";
  uint64_t held_back = 0;
  if (refusals_.Allow(&held_back)) {
    spdlog::warn("metrics: refused a request from {} {} ({} more held back)",
                 c.peer, why, held_back);
  } else {
    spdlog::debug("metrics: refused a request from {} {}", c.peer, why);
  }
}

std::string MetricsEndpoint::AnswerTo(const Connection& c,
                                      absl::string_view head) const {
  HttpRequest request;
  if (!ParseRequest(head, &request)) return PlainResponse(400, "Bad Request");
  if (options_.authorize != nullptr &&
      !options_.authorize(request.authorization)) {
    LogRefusal(c, !request.authorization.empty());
    return PlainResponse(
        401, "Unauthorized",
        "WWW-Authenticate: Bearer realm=\"hostkvd metrics\"\r\n");
  }
  if (request.method != "GET" && request.method != "HEAD") {
    return PlainResponse(405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
  }
  if (request.path != "/metrics") return PlainResponse(404, "Not Found");
  return Response(200, "OK",
                  "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n",
                  Render(), /*with_body=*/request.method == "GET");
}

std::string MetricsEndpoint::Render() const {
  std::vector<prometheus::MetricFamily> families;
  for (const std::shared_ptr<prometheus::Collectable>& collectable :
       collectables_) {
    std::vector<prometheus::MetricFamily> more = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  if (!options_.namespace_names) HashNameLabels(options_.label_key, families);
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace hostkv
