// Blocking TCP and Unix-domain socket helpers in which every call has a deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace interlace {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

// Owns a file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { int fd = fd_; fd_ = -1; return fd; }
  void close();

 private:
  int fd_ = -1;
};

// Result of an I/O wait: the peer may close or the deadline may pass.
enum class IoStatus { kOk, kClosed, kTimeout };

// Listens on `address` (an IPv4 address or host name; "" means every interface) and `port` (0: any
// free port, see bound_port).
Socket listen_tcp(const std::string& address, int port);
int bound_port(const Socket& listener);
// The IPv4 address a listener is bound to, dotted ("0.0.0.0": every interface).
std::string bound_address(const Socket& listener);
// True when `host` resolves to an IPv4 loopback address (127.0.0.0/8), which only processes of this
// host can reach. Raises if it does not resolve.
bool is_loopback_address(const std::string& host);
// Retries refused connections until the deadline; returns an invalid socket on timeout.
Socket connect_tcp(const std::string& host, int port, Deadline deadline);
// Waits for a connection on a listening socket; invalid socket on timeout.
Socket accept_until(const Socket& listener, Deadline deadline);
// Accepts a connection that is already waiting, without blocking; an invalid socket if none is.
// Running out of file descriptors or memory sets *exhausted instead of raising, so that a server
// can close connections it cares less about and go on.
Socket accept_now(const Socket& listener, bool* exhausted);
// Waits until one of `sockets` has input (or was closed), or the deadline passes. Returns the
// indices of those that have, in order; empty on timeout.
std::vector<size_t> wait_readable(const std::vector<const Socket*>& sockets, Deadline deadline);

IoStatus send_all(const Socket& s, const void* data, size_t size, Deadline deadline);
// Sends a short message only if the socket takes all of it at once; never waits. For servers that
// must not be held up by a peer that does not read.
bool send_now(const Socket& s, const void* data, size_t size);
// Closes after the peer has had the chance to read what was sent: closing a socket that still holds
// unread input makes the kernel reset the connection, and the reset destroys data still in flight to
// the peer. Sends FIN, discards input until the peer closes or the deadline passes, then closes.
void close_after_drain(Socket& s, Deadline deadline);
IoStatus recv_all(const Socket& s, void* data, size_t size, Deadline deadline);
// Reads what has already arrived, at most `size` bytes, without waiting; *received says how much
// (0 when nothing has). kClosed when the peer closed or the connection failed.
IoStatus recv_now(const Socket& s, void* data, size_t size, size_t* received);

// Unix-domain sockets in the abstract namespace, for passing file descriptors between the
// processes of one host (SCM_RIGHTS).
Socket listen_unix(const std::string& name);
Socket connect_unix(const std::string& name, Deadline deadline);
void send_fd(const Socket& s, int fd_to_send);
int recv_fd(const Socket& s, Deadline deadline);
// True when the process at the other end of a connected Unix socket runs as this process's user
// (SO_PEERCRED). Abstract names are visible to every process of the host, so a server that hands
// out file descriptors asks this first.
bool peer_has_same_uid(const Socket& s);

}  // namespace interlace
