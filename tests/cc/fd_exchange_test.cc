// The exchange of memory handles that SymmetricHeap makes (runtime/fd_exchange.h), between real
// processes with ordinary files for handles: each rank gets exactly the heaps heap_peers says, from
// the right rank, for a node of its own and for emulated nodes of one host sharing everything
// (loopback), and a peer that never comes is an error, not a hang.
#include "interlace/runtime/fd_exchange.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/runtime/cross_node_choice.h"
#include "interlace/runtime/socket.h"

namespace interlace {
namespace {

int free_port() { return bound_port(listen_tcp("127.0.0.1", 0)); }

// Runs each body in its own process; returns each one's error text ("" if it returned).
std::vector<std::string> run_processes(const std::vector<std::function<void()>>& bodies) {
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (const auto& body : bodies) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::string why;
      try {
        body();
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (!why.empty()) (void)!::write(fds[1], why.data(), why.size());
      ::_exit(why.empty() ? 0 : 1);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<std::string> errors;
  for (size_t i = 0; i < pids.size(); ++i) {
    std::string why;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipes[i], buf, sizeof buf)) > 0) why.append(buf, n);
    ::close(pipes[i]);
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    if (why.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) why = "exited abnormally";
    errors.push_back(why);
  }
  return errors;
}

BootstrapOptions options(int rank, int world, int port) {
  BootstrapOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.secret = "fd-exchange-test";
  o.timeout_s = 10;
  return o;
}

// A file standing in for rank r's exported heap: it holds "heap of rank r".
int heap_file(int rank) {
  const int fd = ::memfd_create("heap", 0);
  IL_CHECK(fd >= 0, "memfd_create failed");
  const std::string text = "heap of rank " + std::to_string(rank);
  IL_CHECK(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()), "write failed");
  return fd;
}

std::string contents(int fd) {
  char buf[64] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, n) : std::string();
}

// Every rank exchanges with heap_peers(rank, nodes, hosts, loopback) and checks what it got.
void exchange_as_the_group_would(const std::vector<std::string>& nodes, const std::vector<std::string>& hosts,
                                 bool loopback) {
  const int world = static_cast<int>(nodes.size());
  const int port = free_port();
  std::vector<std::function<void()>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back([=] {
      Bootstrap b(options(r, world, port));
      const std::vector<int> peers = heap_peers(r, nodes, hosts, loopback);
      const int mine = heap_file(r);
      const std::vector<int> got = exchange_fds(b, r, peers, mine, 10);
      IL_CHECK(got.size() == peers.size(), "rank ", r, " got ", got.size(), " fds for ", peers.size(), " peers");
      for (size_t p = 0; p < peers.size(); ++p) {
        if (peers[p] == r) {
          IL_CHECK(got[p] == -1, "rank ", r, " got an fd from itself");
          continue;
        }
        const std::string want = "heap of rank " + std::to_string(peers[p]);
        IL_CHECK(contents(got[p]) == want, "rank ", r, " got '", contents(got[p]), "' for ", want);
        ::close(got[p]);
      }
      ::close(mine);
    });
  }
  const auto errors = run_processes(ranks);
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(FdExchange, RanksOfANodeGetEachOthersHeaps) {
  exchange_as_the_group_would({"a", "a", "a"}, {"h", "h", "h"}, false);
}

TEST(FdExchange, EmulatedNodesWithoutLoopbackExchangeOnlyWithinTheirNode) {
  exchange_as_the_group_would({"n0", "n1", "n0", "n1"}, {"h", "h", "h", "h"}, false);
}

TEST(FdExchange, EmulatedNodesWithLoopbackGetEveryHeapOfTheHost) {
  exchange_as_the_group_would({"n0", "n0", "n1", "n1"}, {"h", "h", "h", "h"}, true);
}

TEST(FdExchange, OneRankPerNodeStillTakesPartInTheCollectives) {
  exchange_as_the_group_would({"n0", "n1"}, {"h", "h"}, false);
}

TEST(FdExchange, APeerThatNeverComesIsAnErrorWithinTheTimeout) {
  const int port = free_port();
  // Rank 1 lists rank 0 as a peer, rank 0 does not list rank 1: rank 1 is never served.
  const auto errors = run_processes({
      [=] {
        Bootstrap b(options(0, 2, port));
        const int mine = heap_file(0);
        exchange_fds(b, 0, {0}, mine, 10);
      },
      [=] {
        Bootstrap b(options(1, 2, port));
        const int mine = heap_file(1);
        exchange_fds(b, 1, {0, 1}, mine, 1);
      },
  });
  EXPECT_NE(errors[1].find("timed out waiting for a memory handle"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0], "");  // its peer's exit breaks the bootstrap: an error, not a hang
}

}  // namespace
}  // namespace interlace
