// The watchdog with real processes on loopback: dead, silent and slow ranks, abort from the host
// or from a "kernel" (the abort word written directly), and the votes on op calls.
#include "interlace/runtime/watchdog.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/socket.h"

namespace interlace {
namespace {

// A port nothing listens on now (the kernel's pick of a free one).
int free_port() { return bound_port(listen_tcp("127.0.0.1", 0)); }

// What a rank's body gets: its bootstrap, a watchdog and the abort word the watchdog watches.
struct Rank {
  int rank;
  Bootstrap& bootstrap;
  std::unique_ptr<Watchdog>& watchdog;
  volatile int32_t& abort_word;
};

// Waits up to `seconds` for the abort word; returns how long it took, or -1.
double wait_for_abort(const Rank& r, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    if (r.abort_word) return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Runs body(rank) in `world` processes; a child exits 0 when its body returns true. A failure's
// text goes to stderr. Returns the exit codes (a killed child gives -signal).
std::vector<int> run(int world, double heartbeat_timeout_s, const std::function<bool(Rank&)>& body,
                     double vote_timeout_s = 30) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      bool ok = false;
      try {
        BootstrapOptions o;
        o.rank = rank;
        o.world_size = world;
        o.master_addr = "127.0.0.1";
        o.master_port = port;
        o.timeout_s = 20;
        Bootstrap bootstrap(o);
        volatile int32_t abort_word = 0;
        auto watchdog = std::make_unique<Watchdog>(
            bootstrap, &abort_word, [] { return std::string("a kernel of this rank stopped"); }, heartbeat_timeout_s,
            vote_timeout_s);
        Rank r{rank, bootstrap, watchdog, abort_word};
        ok = body(r);
        if (watchdog) {  // leave as Group does: meet the others, then say goodbye
          try {
            bootstrap.barrier();
            watchdog->leaving_cleanly();
          } catch (const Error&) {
          }
        }
      } catch (const Error& e) {
        fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      ::_exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
  }
  return codes;
}

TEST(Watchdog, DeadRankAbortsEveryOtherRankWithinSeconds) {
  auto codes = run(3, 30, [](Rank& r) {
    r.bootstrap.barrier();
    if (r.rank == 2) ::_exit(7);  // like a crash: no goodbye
    const double took = wait_for_abort(r, 5);
    const std::string why = r.watchdog->abort_reason();
    if (took < 0 || took > 3 || why.find("rank 2 died") == std::string::npos) {
      fprintf(stderr, "rank %d: abort after %.2f s: '%s'\n", r.rank, took, why.c_str());
      return false;
    }
    // A waiting vote returns at once on an aborted group.
    return r.watchdog->vote(1, "op", false, true).kind == Verdict::kAborted;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 7}));
}

TEST(Watchdog, SlowRankIsNotDead) {
  // Heartbeats come from the watchdog's thread: a rank whose caller sleeps past the heartbeat
  // timeout is alive.
  auto codes = run(2, 2.5, [](Rank& r) {
    if (r.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(5));
    const Verdict v = r.watchdog->vote(1, "all_gather(8)", false, true);
    if (v.kind != Verdict::kAgreed || r.abort_word) {
      fprintf(stderr, "rank %d: verdict %d, abort '%s'\n", r.rank, v.kind, r.watchdog->abort_reason().c_str());
      return false;
    }
    return true;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Watchdog, SilentRankIsTakenForDeadAfterTheHeartbeatTimeout) {
  auto codes = run(2, 2.0, [](Rank& r) {
    const std::vector<std::string> pids = r.bootstrap.all_gather(std::to_string(::getpid()));
    if (r.rank == 1) {
      ::kill(::getpid(), SIGSTOP);  // frozen, like a hung host: the connection stays open, nothing is sent
      return true;
    }
    const double took = wait_for_abort(r, 8);
    const std::string why = r.watchdog->abort_reason();
    ::kill(std::stoi(pids[1]), SIGKILL);
    if (took < 1.5 || took > 5 || why.find("sent nothing") == std::string::npos) {
      fprintf(stderr, "abort after %.2f s: '%s'\n", took, why.c_str());
      return false;
    }
    return true;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, -SIGKILL}));
}

TEST(Watchdog, AbortFromTheHostOrAKernelReachesEveryRank) {
  for (bool from_kernel : {false, true}) {
    auto codes = run(3, 30, [from_kernel](Rank& r) {
      r.bootstrap.barrier();
      if (r.rank == 1) {
        if (from_kernel) {
          r.abort_word = 1;  // what a kernel's failed wait does
        } else {
          r.watchdog->abort("user abort on rank 1");
        }
      }
      const double took = wait_for_abort(r, 5);
      std::string why = r.watchdog->abort_reason();
      for (int i = 0; i < 200 && why.empty(); ++i) {  // where a kernel set the word, the reason follows it
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        why = r.watchdog->abort_reason();
      }
      const std::string want = from_kernel ? "a kernel of this rank stopped" : "user abort on rank 1";
      r.bootstrap.barrier();  // stay until every rank has seen it
      return took >= 0 && took < 2 && why == want;
    });
    EXPECT_EQ(codes, (std::vector<int>{0, 0, 0})) << (from_kernel ? "from a kernel" : "from the host");
  }
}

TEST(Watchdog, VotesAgreeCancelAndMismatch) {
  auto codes = run(3, 30, [](Rank& r) {
    bool ok = true;
    // 1: the same signature everywhere; rank 2 does not wait (its signature was known).
    Verdict v = r.watchdog->vote(1, "all_gather(64)", false, r.rank != 2);
    ok = ok && v.kind == Verdict::kAgreed;
    // 2: rank 1's checks fail; rank 0 waits and hears why; rank 2 (not waiting) can read it later.
    v = r.watchdog->vote(2, r.rank == 1 ? "bad dtype" : "all_gather(64)", r.rank == 1, r.rank == 0);
    if (r.rank == 0) ok = ok && v.kind == Verdict::kCancelled && v.text.find("bad dtype") != std::string::npos;
    if (r.rank == 2) {
      std::string why;
      for (int i = 0; i < 300 && why.empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        why = r.watchdog->take_cancel_reason(2);
      }
      ok = ok && why.find("rank 1's call #2") != std::string::npos;
    }
    // 3: different new signatures, all waiting: everyone is told, nobody aborts.
    v = r.watchdog->vote(3, "all_gather(" + std::to_string(r.rank) + ")", false, true);
    ok = ok && v.kind == Verdict::kCancelled && v.text.find("different op calls") != std::string::npos;
    ok = ok && !r.abort_word;
    // 4: different known signatures, nobody waiting: the group aborts.
    r.watchdog->vote(4, "op" + std::to_string(r.rank), false, false);
    ok = ok && wait_for_abort(r, 5) >= 0 && r.watchdog->abort_reason().find("different op calls") != std::string::npos;
    r.bootstrap.barrier();
    if (!ok) fprintf(stderr, "rank %d failed\n", r.rank);
    return ok;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

TEST(Watchdog, CleanShutdownIsNotADeathButLeavingEarlyIs) {
  for (bool clean : {true, false}) {
    auto codes = run(3, 30, [clean](Rank& r) {
      r.bootstrap.barrier();
      if (r.rank == 2) {
        if (clean) r.watchdog->leaving_cleanly();  // what Group does after its final barrier
        r.watchdog.reset();
        r.bootstrap.barrier();
        return true;
      }
      const double took = wait_for_abort(r, 2);
      r.bootstrap.barrier();
      const std::string why = r.watchdog->abort_reason();
      return clean ? took < 0 : (took >= 0 && why.find("rank 2 died") != std::string::npos);
    });
    EXPECT_EQ(codes, (std::vector<int>{0, 0, 0})) << (clean ? "clean" : "early");
  }
}

TEST(Watchdog, ACallSomeRankNeverMakesAbortsNamingIt) {
  auto codes = run(3, 30, [](Rank& r) {
    if (r.rank == 2) {  // never votes on call 1, but stays alive
      const bool aborted = wait_for_abort(r, 10) >= 0;
      r.bootstrap.barrier();
      return aborted;
    }
    const auto start = std::chrono::steady_clock::now();
    const Verdict v = r.watchdog->vote(1, "all_gather(8)", false, true);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string why = r.watchdog->abort_reason();
    r.bootstrap.barrier();
    if (v.kind != Verdict::kAborted || took > 6 || why.find("never made by rank(s) 2") == std::string::npos) {
      fprintf(stderr, "rank %d: verdict %d after %.2f s: '%s'\n", r.rank, v.kind, took, why.c_str());
      return false;
    }
    return true;
  }, /*vote_timeout_s=*/2);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
}

TEST(Watchdog, CancelReasonsAreKeptPerCallAndNotTakenBeforeTheirCall) {
  auto codes = run(2, 30, [](Rank& r) {
    // Rank 1's calls 1, 2 and 3 fail; rank 0's kernels would skip them, and check() reports them in
    // order, but only those of calls rank 0 has made (here, up to 2).
    r.watchdog->vote(1, r.rank == 1 ? "first reason" : "op", r.rank == 1, false);
    r.watchdog->vote(2, r.rank == 1 ? "second reason" : "op", r.rank == 1, false);
    if (r.rank == 1) r.watchdog->vote(3, "third reason", true, false);
    r.bootstrap.barrier();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    uint64_t call = 0;
    if (r.rank == 1) return r.watchdog->take_earliest_cancel_reason(3, &call).empty();  // it raised for them itself
    const std::string second = r.watchdog->take_cancel_reason(2);
    const std::string first = r.watchdog->take_earliest_cancel_reason(2, &call);
    const bool ok = second.find("second reason") != std::string::npos &&
                    first.find("first reason") != std::string::npos && call == 1 &&
                    r.watchdog->take_earliest_cancel_reason(2, &call).empty();
    const std::string third = r.watchdog->take_earliest_cancel_reason(3, &call);
    return ok && third.find("third reason") != std::string::npos && call == 3;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(Watchdog, ACancelTheWaiterRaisedForIsNotReportedAgain) {
  auto codes = run(2, 30, [](Rank& r) {
    // Rank 0's checks fail, rank 1 waits on a new signature, at nearly the same moment: rank 0 may
    // answer rank 1 twice (its broadcast, then the reply to a late waiter). Rank 1 raises for the
    // call from the verdict; nothing may be left for a later check().
    bool ok = true;
    for (uint64_t call = 1; call <= 200; ++call) {
      r.bootstrap.barrier();
      const int skew_us = static_cast<int>(call % 21) * 10 - 100;  // -100..100 us, rank 1 before or after
      if ((r.rank == 0) == (skew_us > 0)) std::this_thread::sleep_for(std::chrono::microseconds(std::abs(skew_us)));
      const Verdict v = r.watchdog->vote(call, r.rank == 0 ? "bad rows" : "op", r.rank == 0, r.rank == 1);
      if (r.rank == 1) {
        ok = ok && v.kind == Verdict::kCancelled;
        r.watchdog->take_cancel_reason(call);  // as OpCall::agree does for a cancelled call
      }
    }
    r.bootstrap.barrier();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    uint64_t call = 0;
    const std::string stale = r.watchdog->take_earliest_cancel_reason(200, &call);
    if (!stale.empty()) fprintf(stderr, "rank %d: call #%llu reported again: %s\n", r.rank,
                                static_cast<unsigned long long>(call), stale.c_str());
    return ok && stale.empty();
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace interlace
