// Keeps every rank of a group informed of the others, on connections of its own (a star around
// rank 0) served by one thread per process, so it works while the caller sleeps, holds the GIL or
// waits on the GPU:
//   - death: a rank whose connection closes, or that sends nothing (not even its heartbeat) for
//     heartbeat_timeout_s, aborts the group;
//   - abort: the sticky abort word in the host control block, set here, by group.abort() or by a
//     kernel whose wait failed, is spread to every rank, whose kernels then stop;
//   - agreement: every op call votes its signature (or that its argument checks failed); rank 0
//     compares the votes of each call and answers those who wait (a call whose signature is new)
//     with agreed, cancelled (some rank's checks failed) or mismatch (which aborts). A call that
//     some rank never makes aborts the group after vote_timeout_s, naming the ranks.
// A slow rank is never declared dead: its heartbeats come from this thread, not from its work. A
// rank says goodbye only after the group's final barrier (leaving_cleanly); one that leaves without
// it is taken for dead like one that crashed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/socket.h"

namespace interlace {

struct Verdict {
  enum Kind { kAgreed, kCancelled, kMismatch, kAborted } kind = kAgreed;
  std::string text;  // why, for all but kAgreed
};

class Watchdog {
 public:
  // Collective. abort_word: the group's sticky abort flag (host memory the GPU reads);
  // describe_abort: what to tell the other ranks when this rank's abort word was set by a kernel.
  Watchdog(Bootstrap& bootstrap, volatile int32_t* abort_word, std::function<std::string()> describe_abort,
           double heartbeat_timeout_s, double vote_timeout_s);
  ~Watchdog();  // stops the thread; says goodbye if leaving_cleanly() was called, else just closes
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Every rank has met the others for the last time (the group's final barrier succeeded): closing
  // the connection is no longer a death.
  void leaving_cleanly() { clean_ = true; }

  // Votes on op call number `call` (every rank numbers its calls alike). failed: this rank's
  // argument checks failed and `text` says why; else `text` is the call's signature. With wait, blocks
  // until rank 0's verdict or an abort; without, returns kAgreed at once (rank 0 still compares).
  // A wait is bounded: past vote_timeout_s rank 0 aborts the group, naming the ranks that never voted.
  Verdict vote(uint64_t call, const std::string& text, bool failed, bool wait);

  // Aborts the group on every rank, saying why (the first reason wins).
  void abort(const std::string& why);
  std::string abort_reason() const;
  // Why some rank cancelled call `call` (its checks failed), once; "" if that call was not cancelled.
  std::string take_cancel_reason(uint64_t call);
  // The reason for the earliest cancelled call up to `last_call` not yet taken, once, and that call's
  // number; "" if none. (A peer that is ahead may have cancelled a call this rank has not made yet:
  // that one is reported when this rank gets there.)
  std::string take_earliest_cancel_reason(uint64_t last_call, uint64_t* call);

 private:
  struct Message {
    uint32_t kind;
    int32_t rank;  // who it is about: the sender, the voter, the one whose call failed
    uint32_t flags;
    uint64_t call;
    std::string text;
  };
  struct Outgoing {
    int to;  // destination rank; -1: every connected rank
    Message message;
  };
  struct Ballot {
    std::vector<int> voted;  // 0/1 per rank
    std::vector<std::string> signatures;
    std::vector<bool> waiting;
    int count = 0;
    std::string cancelled;  // why, once some rank's call failed: the remaining votes only close the ballot
    Clock::time_point opened = Clock::now();
  };

  void run();
  // Queues m for the thread; wake: at once (else with its next round, within 100 ms).
  void post(int to, Message m, bool wake = true);
  void handle(int from, const Message& m);  // on the thread
  void count_vote(const Message& m);        // rank 0, on the thread
  void expire_ballots();                    // rank 0, on the thread
  void close_link(int i);
  void deliver_verdict(const Message& m);   // on the thread
  void set_abort(const std::string& why, bool spread);
  bool send(int to, const Message& m);
  int connection_of(int rank) const { return bootstrap_.rank() == 0 ? rank : 0; }

  Bootstrap& bootstrap_;
  const int rank_;
  const int world_;
  volatile int32_t* abort_word_;
  std::function<std::string()> describe_abort_;
  const double heartbeat_timeout_s_;
  const double vote_timeout_s_;
  std::atomic<bool> clean_{false};

  std::vector<Socket> links_;  // rank 0: one per rank; others: links_[0] to rank 0
  std::vector<Clock::time_point> last_heard_;
  std::vector<bool> said_bye_;
  int wake_read_ = -1, wake_write_ = -1;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Outgoing> outbox_;
  std::map<uint64_t, Verdict> verdicts_;  // for calls someone here waits on
  std::map<uint64_t, bool> waiting_;
  std::map<uint64_t, Ballot> ballots_;    // rank 0
  std::string abort_reason_;
  bool abort_spread_ = false;
  std::map<uint64_t, std::string> cancel_reasons_;  // by call, for calls this rank's kernel skipped
  std::set<uint64_t> failed_here_;                  // recent calls this rank raised for (checks failed, or cancelled)
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace interlace
