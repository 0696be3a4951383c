#include "interlace/runtime/fd_exchange.h"

#include <unistd.h>

#include <exception>
#include <random>
#include <thread>

#include "interlace/base/error.h"
#include "interlace/runtime/socket.h"

namespace interlace {

std::vector<int> exchange_fds(Bootstrap& bootstrap, int rank, const std::vector<int>& peers, int my_fd,
                              double timeout_s) {
  std::string token;
  {
    std::random_device rd;
    token = std::to_string(rd()) + std::to_string(rd()) + "-" + std::to_string(::getpid());
  }
  token = bootstrap.all_gather(token)[0];
  auto name = [&](int global_rank) { return "interlace-" + token + "-" + std::to_string(global_rank); };
  const int n = static_cast<int>(peers.size());

  Socket listener = listen_unix(name(rank));
  bootstrap.barrier();  // every rank now listens
  const Deadline deadline = deadline_after(timeout_s);
  std::exception_ptr server_error;
  std::thread server([&] {
    try {
      int strangers = 0;
      for (int served = 0; served + 1 < n;) {
        Socket client = accept_until(listener, deadline);
        IL_CHECK(client.valid(), "rank ", rank, ": a peer on this host never came for its memory handle",
                 strangers ? detail::concat(" (", strangers, " connection(s) from another user were refused)") : "");
        // Every process of the host can see and connect to an abstract socket; the handle opens
        // this GPU's memory, so it goes only to processes of our own user.
        if (!peer_has_same_uid(client)) {
          ++strangers;
          continue;
        }
        send_fd(client, my_fd);
        ++served;
      }
    } catch (...) {
      server_error = std::current_exception();
    }
  });
  std::vector<int> fds(n, -1);
  std::exception_ptr client_error;
  try {
    for (int p = 0; p < n; ++p) {
      if (peers[p] == rank) continue;
      Socket s = connect_unix(name(peers[p]), deadline);
      // A handle from another user's process would map memory that is not our peer's.
      IL_CHECK(peer_has_same_uid(s), "rank ", rank, ": the socket of rank ", peers[p],
               " belongs to another user's process; refusing its memory handle");
      fds[p] = recv_fd(s, deadline);
    }
  } catch (...) {
    client_error = std::current_exception();
  }
  server.join();
  if (client_error || server_error) {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    std::rethrow_exception(client_error ? client_error : server_error);
  }
  bootstrap.barrier();  // nobody closes its listener before all are served
  return fds;
}

}  // namespace interlace
