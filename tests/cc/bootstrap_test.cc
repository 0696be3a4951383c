// The bootstrap with several real processes on loopback: success, and each failure it must name.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/runtime/bootstrap.h"

namespace interlace {
namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

struct Outcome {
  int exit_code;
  std::string message;  // the interlace::Error text, if one was raised
};

// Runs each function in its own process; returns what each did.
std::vector<Outcome> run_processes(const std::vector<std::function<void()>>& bodies) {
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (const auto& body : bodies) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      int code = 0;
      std::string message;
      try {
        body();
      } catch (const Error& e) {
        message = e.what();
        code = 1;
      }
      if (!message.empty()) (void)!::write(fds[1], message.data(), message.size());
      ::_exit(code);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<Outcome> outcomes;
  for (size_t i = 0; i < pids.size(); ++i) {
    std::string message;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipes[i], buf, sizeof(buf))) > 0) message.append(buf, n);
    ::close(pipes[i]);
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    outcomes.push_back({WIFEXITED(status) ? WEXITSTATUS(status) : -1, message});
  }
  return outcomes;
}

BootstrapOptions options(int rank, int world, int port, double timeout_s = 5.0, std::string secret = "job-42") {
  BootstrapOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.secret = std::move(secret);
  o.timeout_s = timeout_s;
  return o;
}

#define EXPECT_CONTAINS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

TEST(Bootstrap, AllGatherAndBarrierAcrossFourProcesses) {
  const int port = free_port();
  std::vector<std::function<void()>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back([=] {
      Bootstrap b(options(r, 4, port));
      for (int round = 0; round < 3; ++round) {
        std::string mine(static_cast<size_t>(r * 1000 + round), static_cast<char>('a' + r));  // sizes differ
        auto all = b.all_gather(mine);
        for (int q = 0; q < 4; ++q) {
          IL_CHECK(all[q] == std::string(static_cast<size_t>(q * 1000 + round), static_cast<char>('a' + q)),
                   "wrong blob from rank ", q);
        }
        b.barrier();
      }
    });
  }
  for (const auto& o : run_processes(ranks)) EXPECT_EQ(o.exit_code, 0) << o.message;
}

TEST(Bootstrap, WrongSecretIsRejected) {
  const int port = free_port();
  auto out = run_processes({
      [=] { Bootstrap b(options(0, 2, port, 2.0, "right")); },
      [=] { Bootstrap b(options(1, 2, port, 2.0, "wrong")); },
  });
  EXPECT_CONTAINS(out[1].message, "wrong secret");
  EXPECT_CONTAINS(out[0].message, "rank(s) 1 never joined");
  EXPECT_CONTAINS(out[0].message, "wrong secret");
}

TEST(Bootstrap, DuplicateRankIsNamed) {
  const int port = free_port();
  auto out = run_processes({
      [=] { Bootstrap b(options(0, 3, port)); },
      [=] { Bootstrap b(options(1, 3, port)); },
      [=] { Bootstrap b(options(1, 3, port)); },
  });
  EXPECT_CONTAINS(out[0].message, "duplicate rank: two processes joined as rank 1");
  EXPECT_EQ(out[1].exit_code + out[2].exit_code, 2);
}

TEST(Bootstrap, WorldSizeMismatchIsNamed) {
  const int port = free_port();
  auto out = run_processes({
      [=] { Bootstrap b(options(0, 2, port)); },
      [=] { Bootstrap b(options(1, 3, port)); },
  });
  EXPECT_CONTAINS(out[0].message, "world size mismatch: rank 1 was started with world_size 3, rank 0 with 2");
  EXPECT_CONTAINS(out[1].message, "world size mismatch");
}

TEST(Bootstrap, UnreachableMasterTimesOut) {
  const int port = free_port();
  auto out = run_processes({[=] { Bootstrap b(options(1, 2, port, 1.0)); }});
  EXPECT_CONTAINS(out[0].message, "cannot reach the master at 127.0.0.1:" + std::to_string(port));
}

TEST(Bootstrap, MissingRankTimesOutAndOthersAreTold) {
  const int port = free_port();
  auto out = run_processes({
      [=] { Bootstrap b(options(0, 3, port, 1.5)); },
      [=] { Bootstrap b(options(1, 3, port, 5.0)); },
  });
  EXPECT_CONTAINS(out[0].message, "rank(s) 2 never joined");
  EXPECT_CONTAINS(out[1].message, "refused by rank 0: rendezvous timed out");
}

TEST(Bootstrap, PeerThatDiesDuringAllGatherIsNamed) {
  const int port = free_port();
  auto out = run_processes({
      [=] {
        Bootstrap b(options(0, 3, port));
        b.all_gather("x");
      },
      [=] {
        Bootstrap b(options(1, 3, port));
        ::_exit(0);  // dies without a word
      },
      [=] {
        Bootstrap b(options(2, 3, port));
        b.all_gather("x");
      },
  });
  EXPECT_CONTAINS(out[0].message, "rank 1 closed the connection");
  EXPECT_CONTAINS(out[2].message, "aborted by rank 0");
  EXPECT_CONTAINS(out[2].message, "rank 1");
}

TEST(Bootstrap, BadOptionsRaiseBeforeAnyNetworking) {
  EXPECT_THROW(Bootstrap(options(2, 2, 1234)), Error);
  EXPECT_THROW(Bootstrap(options(0, 0, 1234)), Error);
  BootstrapOptions no_master = options(1, 2, 0);
  EXPECT_THROW({ Bootstrap b(no_master); }, Error);
  Bootstrap alone(options(0, 1, 0));  // a world of one needs no master
  EXPECT_EQ(alone.all_gather("solo"), std::vector<std::string>{"solo"});
}

}  // namespace
}  // namespace interlace
