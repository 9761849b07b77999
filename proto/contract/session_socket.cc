#include "proto/contract/session_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hostkv {

ReceivedRecord ReceiveRecord(int socket, void* data, size_t size,
                             bool dont_wait) {
  ReceivedRecord out;
  iovec iov{data, size};
  // Room for the credentials and as many descriptors as one record can
  // carry: what does not fit is released by the kernel in this thread, and
  // that release can block (a socket lingering on unsent data).
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) +
                                CMSG_SPACE(kMaxRecordFds * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  out.bytes = recvmsg(socket, &msg,
                      MSG_CMSG_CLOEXEC | (dont_wait ? MSG_DONTWAIT : 0));
  if (out.bytes < 0) return out;
  out.truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_CREDENTIALS &&
        c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
      out.has_credentials = true;
      out.pid = cred.pid;
      out.uid = cred.uid;
      out.gid = cred.gid;
    } else if (c->cmsg_type == SCM_RIGHTS) {
      const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (out.fd.get() < 0) {
          out.fd = ScopedFd(fd);
        } else {
          out.more_fds.emplace_back(fd);
        }
      }
    }
  }
  return out;
}

SessionMessage NewSessionMessage(SessionMessageKind kind,
                                 std::string_view client_name) {
  SessionMessage m{};
  m.magic = kSessionMagic;
  m.version = kSessionProtocolVersion;
  m.kind = static_cast<uint32_t>(kind);
  m.pid = static_cast<uint32_t>(getpid());
  const size_t n = std::min(client_name.size(), sizeof(m.client_name) - 1);
  if (n > 0) std::memcpy(m.client_name, client_name.data(), n);
  return m;
}

bool SendRecord(int socket, const void* data, size_t size, int pass_fd) {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  const ssize_t sent = sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  return sent == static_cast<ssize_t>(size);
}

}  // namespace hostkv
