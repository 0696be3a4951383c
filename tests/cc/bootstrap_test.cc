// The bootstrap with several real processes on loopback: success, each failure it must name, and
// strangers it must shrug off.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/hmac.h"
#include "interlace/runtime/launch_env.h"
#include "interlace/runtime/socket.h"

namespace interlace {
namespace {

// A port nothing listens on now (the kernel's pick of a free one).
int free_port() { return bound_port(listen_tcp("127.0.0.1", 0)); }

struct Outcome {
  int exit_code;
  std::string message;  // the interlace::Error text, if one was raised
};

struct Children {
  std::vector<pid_t> pids;
  std::vector<int> pipes;
};

// Starts each function in its own process.
Children spawn(const std::vector<std::function<void()>>& bodies) {
  Children children;
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
    children.pids.push_back(pid);
    children.pipes.push_back(fds[0]);
  }
  return children;
}

// Waits for every child; returns what each did.
std::vector<Outcome> collect(const Children& children) {
  std::vector<Outcome> outcomes;
  for (size_t i = 0; i < children.pids.size(); ++i) {
    std::string message;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(children.pipes[i], buf, sizeof(buf))) > 0) message.append(buf, n);
    ::close(children.pipes[i]);
    int status = 0;
    ::waitpid(children.pids[i], &status, 0);
    outcomes.push_back({WIFEXITED(status) ? WEXITSTATUS(status) : -1, message});
  }
  return outcomes;
}

std::vector<Outcome> run_processes(const std::vector<std::function<void()>>& bodies) { return collect(spawn(bodies)); }

// A one-shot signal from the test to processes it has started (created before they fork).
class Gun {
 public:
  Gun() { EXPECT_EQ(::pipe(fds_), 0); }
  ~Gun() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  void fire() {
    char go[64] = {};
    EXPECT_EQ(::write(fds_[1], go, sizeof(go)), static_cast<ssize_t>(sizeof(go)));
  }
  void wait() const {
    char go = 0;
    (void)!::read(fds_[0], &go, 1);
  }

 private:
  int fds_[2];
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(strlen(field) + 1));
  }
  return -1;
}

// The wire format, as a stranger would learn it from a capture.
constexpr uint32_t kWireMagic = 0x494c4253;
constexpr uint32_t kWireHello = 1, kWireReject = 3, kWireChallenge = 6;
struct WireHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t size;
};
struct WireHello {
  uint32_t version;
  int32_t rank;
  int32_t world_size;
  uint32_t pad;
  uint8_t nonce[32];
  uint8_t mac[32];
};
constexpr size_t kWireChallengeBytes = sizeof(WireHeader) + 40;

Socket connect_loopback(int port) {
  Socket s = connect_tcp("127.0.0.1", port, deadline_after(5.0));
  EXPECT_TRUE(s.valid()) << "cannot connect to port " << port;
  return s;
}

// Reads whatever comes until the peer closes or `seconds` pass.
std::string read_until_closed(const Socket& s, double seconds) {
  std::string got;
  Deadline deadline = deadline_after(seconds);
  char buf[4096];
  while (Clock::now() < deadline) {
    size_t n = 0;
    if (!wait_readable({&s}, deadline).empty() && recv_now(s, buf, sizeof(buf), &n) != IoStatus::kOk) break;
    got.append(buf, n);
  }
  return got;
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


TEST(Bootstrap, EmptySecretIsAllowedOnLoopback) {
  const int port = free_port();
  auto out = run_processes({
      [=] { Bootstrap b(options(0, 2, port, 5.0, "")); b.barrier(); },
      [=] { Bootstrap b(options(1, 2, port, 5.0, "")); b.barrier(); },
  });
  for (const auto& o : out) EXPECT_EQ(o.exit_code, 0) << o.message;
}

Getenv env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const BootstrapOptions& o) {
  try {
    Bootstrap b(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Bootstrap, SecretIsRequiredOffLoopback) {
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("127.3.2.1"));
  EXPECT_TRUE(is_loopback_address("localhost"));
  EXPECT_FALSE(is_loopback_address("192.0.2.1"));
  for (int rank : {0, 1}) {
    BootstrapOptions o = options(rank, 2, 29500, 5.0, "");
    o.master_addr = "192.0.2.1";  // TEST-NET-1: never this host, so the check must come before any networking
    std::string message = error_of(o);
    EXPECT_CONTAINS(message, "rank " + std::to_string(rank) + ": master_addr 192.0.2.1 is not a loopback address");
    EXPECT_CONTAINS(message, "set INTERLACE_SECRET");
  }
  // A launcher's job id keeps jobs apart on one host, but anyone who can list jobs knows it.
  BootstrapOptions slurm = resolve_bootstrap_options(
      {}, env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "77"}, {"MASTER_ADDR", "192.0.2.1"},
               {"MASTER_PORT", "100"}}));
  EXPECT_EQ(slurm.secret, "77");
  EXPECT_TRUE(slurm.secret_is_job_id);
  EXPECT_CONTAINS(error_of(slurm), "the launcher's job id, the only one found, is no secret");
  BootstrapOptions chosen = resolve_bootstrap_options(
      {}, env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "77"}, {"INTERLACE_SECRET", "f00d"}}));
  EXPECT_EQ(chosen.secret, "f00d");
  EXPECT_FALSE(chosen.secret_is_job_id);
}

TEST(Bootstrap, ListensOnTheMasterAddressOnly) {
  EXPECT_EQ(bound_address(listen_tcp("127.0.0.1", 0)), "127.0.0.1");
  EXPECT_EQ(bound_address(listen_tcp("", 0)), "0.0.0.0");

  const int port = free_port();
  Gun go;
  Children children = spawn({
      [=] { Bootstrap b(options(0, 2, port, 10.0)); },
      [&] {
        go.wait();
        Bootstrap b(options(1, 2, port, 10.0));
      },
  });
  Socket probe = connect_loopback(port);  // rank 0 listens on 127.0.0.1...
  // ...and there only: the rest of 127/8 reaches a listener on every interface, but not this one.
  EXPECT_FALSE(connect_tcp("127.0.0.2", port, deadline_after(0.3)).valid());
  go.fire();
  for (const auto& o : collect(children)) EXPECT_EQ(o.exit_code, 0) << o.message;
}

TEST(Bootstrap, StrangersNeitherStallNorCrashNorBloatTheRendezvous) {
  const int port = free_port();
  Gun go;
  Children ranks = spawn({
      [=] {
        const long rss_before_kib = status_kib("VmRSS:");
        Bootstrap b(options(0, 3, port, 30.0));
        b.barrier();
        const long growth_kib = status_kib("VmHWM:") - rss_before_kib;
        IL_CHECK(growth_kib < 16 * 1024, "rank 0 grew by ", growth_kib, " KiB during the rendezvous");
      },
      [&] {
        go.wait();
        Bootstrap b(options(1, 3, port, 30.0));
        b.barrier();
      },
      [&] {
        go.wait();
        Bootstrap b(options(2, 3, port, 30.0));
        b.barrier();
      },
  });
  std::vector<Socket> strangers;
  for (int i = 0; i < 4; ++i) strangers.push_back(connect_loopback(port));  // they never say a word
  {
    // A hello header announcing 4 GiB, with more than a hello's worth of junk after it.
    Socket s = connect_loopback(port);
    WireHeader h{kWireMagic, kWireHello, uint64_t{4} << 30};
    send_all(s, &h, sizeof(h), deadline_after(1.0));
    std::string junk(64 << 10, 'x');
    send_all(s, junk.data(), junk.size(), deadline_after(1.0));
    strangers.push_back(std::move(s));
  }
  // From here on, rank 0 should be as quick as if the strangers were not there.
  const Clock::time_point start = Clock::now();
  Socket wrong_world;
  {
    // A well-formed hello from a stranger claiming another world size: were it believed, it would stop the job.
    wrong_world = connect_loopback(port);
    char challenge[kWireChallengeBytes];
    EXPECT_EQ(recv_all(wrong_world, challenge, sizeof(challenge), deadline_after(5.0)), IoStatus::kOk);
    WireHello hello{2, 1, 7, 0, {}, {}};
    fill_random(hello.nonce, sizeof(hello.nonce));
    fill_random(hello.mac, sizeof(hello.mac));
    WireHeader h{kWireMagic, kWireHello, sizeof(hello)};
    send_all(wrong_world, &h, sizeof(h), deadline_after(1.0));
    send_all(wrong_world, &hello, sizeof(hello), deadline_after(1.0));
  }
  // A rank of another job on the same port, with its own secret.
  auto other_job = run_processes({[=] { Bootstrap b(options(1, 5, port, 30.0, "another-job")); }});
  EXPECT_CONTAINS(other_job[0].message, "rank 1 was refused by rank 0: wrong secret");
  EXPECT_CONTAINS(read_until_closed(wrong_world, 5.0), "wrong secret");

  go.fire();
  std::vector<Outcome> out = collect(ranks);
  const double took_s = seconds_since(start);
  for (const auto& o : out) EXPECT_EQ(o.exit_code, 0) << o.message;
  // Well within the 30 s timeout, and shorter than one stranger's 5 s to prove itself.
  EXPECT_LT(took_s, 3.0) << "the rendezvous waited for strangers";
}

// Copies bytes both ways between a client and rank 0, keeping what the client sent, until `done`
// or either side closes or `seconds` pass.
void relay(const Socket& client, const Socket& root, std::string* from_client, const std::function<bool()>& done,
           double seconds) {
  const Deadline deadline = deadline_after(seconds);
  char buf[4096];
  while (!done() && Clock::now() < deadline) {
    for (size_t i : wait_readable({&client, &root}, deadline)) {
      const Socket& from = i == 0 ? client : root;
      const Socket& to = i == 0 ? root : client;
      size_t n = 0;
      if (recv_now(from, buf, sizeof(buf), &n) != IoStatus::kOk) return;
      if (i == 0) from_client->append(buf, n);
      if (send_all(to, buf, n, deadline) != IoStatus::kOk) return;
    }
  }
}

TEST(Bootstrap, ReplayedHelloIsRefused) {
  const int port = free_port();
  Socket tap = listen_tcp("127.0.0.1", 0);
  const int tap_port = bound_port(tap);
  Gun go1, go2;
  Children ranks = spawn({
      [=] { Bootstrap b(options(0, 3, port, 20.0)); },
      [&] {
        go1.wait();
        Bootstrap b(options(1, 3, tap_port, 20.0));  // through the tap, which records its hello
      },
      [&] {
        go2.wait();
        Bootstrap b(options(2, 3, port, 20.0));
      },
  });
  go1.fire();
  Socket client = accept_until(tap, deadline_after(5.0));
  ASSERT_TRUE(client.valid());
  Socket upstream = connect_loopback(port);
  std::string captured;
  const size_t hello_bytes = sizeof(WireHeader) + sizeof(WireHello);
  relay(client, upstream, &captured, [&] { return captured.size() >= hello_bytes; }, 5.0);
  ASSERT_EQ(captured.size(), hello_bytes);

  // The same bytes on a new connection answer the wrong challenge. Were they accepted, rank 1 would
  // be there twice and the job would stop.
  Socket replay = connect_loopback(port);
  char challenge[kWireChallengeBytes];
  ASSERT_EQ(recv_all(replay, challenge, sizeof(challenge), deadline_after(5.0)), IoStatus::kOk);
  ASSERT_EQ(send_all(replay, captured.data(), captured.size(), deadline_after(1.0)), IoStatus::kOk);
  EXPECT_CONTAINS(read_until_closed(replay, 5.0), "wrong secret");

  go2.fire();
  relay(client, upstream, &captured, [] { return false; }, 10.0);  // the welcome, until rank 1 is done
  for (const auto& o : collect(ranks)) EXPECT_EQ(o.exit_code, 0) << o.message;
}

TEST(Bootstrap, PeerRefusesARankZeroThatCannotProveTheSecret) {
  Socket fake = listen_tcp("127.0.0.1", 0);
  Children peer = spawn({[port = bound_port(fake)] { Bootstrap b(options(1, 2, port, 5.0)); }});
  Socket s = accept_until(fake, deadline_after(5.0));
  ASSERT_TRUE(s.valid());
  WireHeader h{kWireMagic, kWireChallenge, 40};
  std::array<uint8_t, 40> challenge{2};  // version 2, then a nonce
  send_all(s, &h, sizeof(h), deadline_after(1.0));
  send_all(s, challenge.data(), challenge.size(), deadline_after(1.0));
  char hello[sizeof(WireHeader) + sizeof(WireHello)];
  ASSERT_EQ(recv_all(s, hello, sizeof(hello), deadline_after(5.0)), IoStatus::kOk);
  WireHeader welcome{kWireMagic, 2, 32};
  std::array<uint8_t, 32> proof{};
  send_all(s, &welcome, sizeof(welcome), deadline_after(1.0));
  send_all(s, proof.data(), proof.size(), deadline_after(1.0));
  auto out = collect(peer);
  EXPECT_CONTAINS(out[0].message, "welcomed it without proof that it knows the job's secret");
}

TEST(Bootstrap, PeerReadsOnlyShortMessagesBeforeRankZeroIsProven) {
  Socket fake = listen_tcp("127.0.0.1", 0);
  Children peer = spawn({[port = bound_port(fake)] { Bootstrap b(options(1, 2, port, 5.0)); }});
  Socket s = accept_until(fake, deadline_after(5.0));
  ASSERT_TRUE(s.valid());
  WireHeader h{kWireMagic, kWireReject, uint64_t{4} << 30};
  send_all(s, &h, sizeof(h), deadline_after(1.0));
  const Clock::time_point start = Clock::now();
  auto out = collect(peer);
  EXPECT_CONTAINS(out[0].message, "does not speak interlace's bootstrap protocol");
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(Bootstrap, StrangersAreCountedWhenTheRendezvousTimesOut) {
  const int port = free_port();
  Children root = spawn({[=] { Bootstrap b(options(0, 2, port, 1.5)); }});
  Socket s = connect_loopback(port);
  WireHeader h{0x12345678, 1, 8};  // not interlace
  send_all(s, &h, sizeof(h), deadline_after(1.0));
  auto out = collect(root);
  EXPECT_CONTAINS(out[0].message, "rank(s) 1 never joined; 1 other connection(s) were dropped");
}

TEST(Bootstrap, CollectivesFromSeveralThreadsTakeTurns) {
  const int port = free_port();
  constexpr int kThreads = 4;
  constexpr int kRounds = 20;
  constexpr size_t kBase = 200000;  // several writes per message, so unguarded sends would interleave
  std::vector<std::function<void()>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back([=] {
      Bootstrap b(options(r, 3, port, 20.0));
      std::mutex mutex;
      std::string first_error;
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          try {
            for (int i = 0; i < kRounds; ++i) {
              // Which thread of another rank a call meets is up to the scheduler; each blob must be whole.
              auto all = b.all_gather(std::string(kBase + t * 1000 + i, static_cast<char>('A' + 8 * r + t)));
              for (int q = 0; q < 3; ++q) {
                const std::string& blob = all[q];
                IL_CHECK(blob.size() >= kBase, "short blob from rank ", q);
                const int thread = blob[0] - 'A' - 8 * q;
                const size_t round = blob.size() - kBase - 1000 * static_cast<size_t>(thread);
                IL_CHECK(thread >= 0 && thread < kThreads && round < kRounds, "garbled blob from rank ", q);
                IL_CHECK(blob.find_first_not_of(blob[0]) == std::string::npos, "garbled blob from rank ", q);
              }
            }
          } catch (const Error& e) {
            std::lock_guard<std::mutex> lock(mutex);
            if (first_error.empty()) first_error = e.what();
          }
        });
      }
      for (auto& thread : threads) thread.join();
      IL_CHECK(first_error.empty(), first_error);
    });
  }
  for (const auto& o : run_processes(ranks)) EXPECT_EQ(o.exit_code, 0) << o.message;
}

TEST(Socket, PeerCredentialsTellOurUserFromOthers) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  Socket a(pair[0]), b(pair[1]);
  EXPECT_TRUE(peer_has_same_uid(a));
  EXPECT_TRUE(peer_has_same_uid(b));

  const std::string name = "interlace-test-peercred-" + std::to_string(::getpid());
  Socket listener = listen_unix(name);
  {
    Socket client = connect_unix(name, deadline_after(1.0));
    Socket served = accept_until(listener, deadline_after(1.0));
    ASSERT_TRUE(served.valid());
    EXPECT_TRUE(peer_has_same_uid(served));
    EXPECT_TRUE(peer_has_same_uid(client));
  }
  if (::geteuid() != 0) GTEST_SKIP() << "connecting as another user needs root";
  Children other = spawn({[=] {
    const bool switched = ::setuid(65534) == 0;  // nobody
    Socket c = connect_unix(name, deadline_after(5.0));
    char byte = 0;
    (void)!::read(c.fd(), &byte, 1);  // until the test closes its end
    if (!switched) ::_exit(2);
  }});
  Socket served = accept_until(listener, deadline_after(5.0));
  ASSERT_TRUE(served.valid());
  const bool same = peer_has_same_uid(served);
  served.close();
  auto out = collect(other);
  if (out[0].exit_code == 2) GTEST_SKIP() << "setuid is not allowed here";
  EXPECT_EQ(out[0].exit_code, 0) << out[0].message;
  EXPECT_FALSE(same);
}

}  // namespace
}  // namespace interlace
