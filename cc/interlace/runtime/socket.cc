#include "interlace/runtime/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <thread>

#include "interlace/base/error.h"

namespace interlace {
namespace {

int remaining_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits until fd is ready for `events` or the deadline passes.
bool wait_ready(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) IL_FAIL("poll failed: ", strerror(errno));
  }
}

sockaddr_un abstract_address(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  IL_CHECK(name.size() + 1 < sizeof(addr.sun_path), "unix socket name too long: ", name);
  addr.sun_path[0] = '\0';  // abstract namespace: no file, gone when the process exits
  memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

sockaddr_in resolve_ipv4(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  IL_CHECK(rc == 0, "cannot resolve address '", host, "': ", gai_strerror(rc));
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  return addr;
}

}  // namespace

Socket listen_tcp(const std::string& address, int port) {
  // Non-blocking: a connection reset between poll and accept must not leave accept() waiting.
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  IL_CHECK(s.valid(), "socket() failed: ", strerror(errno));
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  if (address.empty()) {
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
  } else {
    addr = resolve_ipv4(address, port);
  }
  IL_CHECK(::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0,
           "cannot listen on ", address.empty() ? "*" : address, ":", port, ": ", strerror(errno),
           " (is another job using port ", port, "?)");
  IL_CHECK(::listen(s.fd(), 1024) == 0, "listen() failed: ", strerror(errno));
  return s;
}

int bound_port(const Socket& listener) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  IL_CHECK(::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname failed: ",
           strerror(errno));
  return ntohs(addr.sin_port);
}

std::string bound_address(const Socket& listener) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  IL_CHECK(::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname failed: ",
           strerror(errno));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return text;
}

bool is_loopback_address(const std::string& host) {
  sockaddr_in addr = resolve_ipv4(host, 0);
  return (ntohl(addr.sin_addr.s_addr) >> 24) == 127;
}

Socket connect_tcp(const std::string& host, int port, Deadline deadline) {
  sockaddr_in addr = resolve_ipv4(host, port);
  while (Clock::now() < deadline) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    IL_CHECK(s.valid(), "socket() failed: ", strerror(errno));
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ||
        (errno == EINPROGRESS && wait_ready(s.fd(), POLLOUT, deadline))) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) {
        ::fcntl(s.fd(), F_SETFL, ::fcntl(s.fd(), F_GETFL) & ~O_NONBLOCK);
        int one = 1;
        ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return s;
      }
    }
    // Refused or unreachable: rank 0 may not be listening yet.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Socket();
}

Socket accept_now(const Socket& listener, bool* exhausted) {
  *exhausted = false;
  while (true) {
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // fails harmlessly on Unix sockets
      return Socket(fd);
    }
    switch (errno) {
      case EINTR:
        continue;
      case EAGAIN:
      // accept(2): errors of the connection itself, pending when it is accepted; that one is gone.
      case ECONNABORTED:
      case EPROTO:
      case ENOPROTOOPT:
      case ENETDOWN:
      case ENONET:
      case EHOSTDOWN:
      case EHOSTUNREACH:
      case ENETUNREACH:
      case EOPNOTSUPP:
        return Socket();
      case EMFILE:
      case ENFILE:
      case ENOBUFS:
      case ENOMEM:
        *exhausted = true;
        return Socket();
      default:
        IL_FAIL("accept() failed: ", strerror(errno));
    }
  }
}

Socket accept_until(const Socket& listener, Deadline deadline) {
  while (wait_ready(listener.fd(), POLLIN, deadline)) {
    bool exhausted = false;
    Socket s = accept_now(listener, &exhausted);
    if (s.valid()) return s;
    IL_CHECK(!exhausted, "accept() failed: ", strerror(errno));
  }
  return Socket();
}

std::vector<size_t> wait_readable(const std::vector<const Socket*>& sockets, Deadline deadline) {
  std::vector<pollfd> polled;
  polled.reserve(sockets.size());
  for (const Socket* s : sockets) polled.push_back(pollfd{s->fd(), POLLIN, 0});
  std::vector<size_t> ready;
  while (true) {
    int rc = ::poll(polled.data(), polled.size(), remaining_ms(deadline));
    if (rc == 0) return ready;
    if (rc > 0) break;
    if (errno != EINTR) IL_FAIL("poll failed: ", strerror(errno));
  }
  // POLLHUP and POLLERR count: the next read says what happened.
  for (size_t i = 0; i < polled.size(); ++i) {
    if (polled[i].revents != 0) ready.push_back(i);
  }
  return ready;
}

IoStatus send_all(const Socket& s, const void* data, size_t size, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    if (!wait_ready(s.fd(), POLLOUT, deadline)) return IoStatus::kTimeout;
    // MSG_DONTWAIT: a blocking send waits for room for all of `size`, past the deadline.
    ssize_t n = ::send(s.fd(), p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return IoStatus::kClosed;  // EPIPE / ECONNRESET: the peer is gone
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return IoStatus::kOk;
}

bool send_now(const Socket& s, const void* data, size_t size) {
  while (true) {
    ssize_t n = ::send(s.fd(), data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(size);
  }
}

IoStatus recv_all(const Socket& s, void* data, size_t size, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    if (!wait_ready(s.fd(), POLLIN, deadline)) return IoStatus::kTimeout;
    ssize_t n = ::recv(s.fd(), p, size, MSG_DONTWAIT);
    if (n == 0) return IoStatus::kClosed;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return IoStatus::kClosed;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return IoStatus::kOk;
}

IoStatus recv_now(const Socket& s, void* data, size_t size, size_t* received) {
  *received = 0;
  while (true) {
    ssize_t n = ::recv(s.fd(), data, size, MSG_DONTWAIT);
    if (n > 0) {
      *received = static_cast<size_t>(n);
      return IoStatus::kOk;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return IoStatus::kOk;
    return IoStatus::kClosed;
  }
}

void close_after_drain(Socket& s, Deadline deadline) {
  if (!s.valid()) return;
  ::shutdown(s.fd(), SHUT_WR);
  char sink[4096];
  while (wait_ready(s.fd(), POLLIN, deadline)) {
    ssize_t n = ::recv(s.fd(), sink, sizeof(sink), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
  }
  s.close();
}

Socket listen_unix(const std::string& name) {
  Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  IL_CHECK(s.valid(), "socket(AF_UNIX) failed: ", strerror(errno));
  socklen_t len = 0;
  sockaddr_un addr = abstract_address(name, &len);
  IL_CHECK(::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0,
           "cannot bind unix socket @", name, ": ", strerror(errno));
  IL_CHECK(::listen(s.fd(), 256) == 0, "listen(AF_UNIX) failed: ", strerror(errno));
  return s;
}

Socket connect_unix(const std::string& name, Deadline deadline) {
  socklen_t len = 0;
  sockaddr_un addr = abstract_address(name, &len);
  while (Clock::now() < deadline) {
    Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    IL_CHECK(s.valid(), "socket(AF_UNIX) failed: ", strerror(errno));
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  IL_FAIL("cannot connect to unix socket @", name, " of a local peer: ", strerror(errno));
}

void send_fd(const Socket& s, int fd_to_send) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cmsg), &fd_to_send, sizeof(int));
  IL_CHECK(::sendmsg(s.fd(), &msg, MSG_NOSIGNAL) == 1, "sendmsg(SCM_RIGHTS) failed: ", strerror(errno));
}

int recv_fd(const Socket& s, Deadline deadline) {
  IL_CHECK(wait_ready(s.fd(), POLLIN, deadline), "timed out waiting for a memory handle from a local peer");
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  IL_CHECK(::recvmsg(s.fd(), &msg, MSG_CMSG_CLOEXEC) == 1, "recvmsg(SCM_RIGHTS) failed: ", strerror(errno));
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  IL_CHECK(cmsg && cmsg->cmsg_type == SCM_RIGHTS, "a local peer sent no file descriptor");
  int fd = -1;
  memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
  return fd;
}

bool peer_has_same_uid(const Socket& s) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(s.fd(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) return false;
  return cred.uid == ::geteuid();
}

}  // namespace interlace
