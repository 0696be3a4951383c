#include "interlace/runtime/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <set>
#include <utility>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;
namespace {

constexpr uint32_t kMagic = 0x494c5744;  // "ILWD"
enum Kind : uint32_t { kHello = 1, kHeartbeat = 2, kVote = 3, kVerdict = 4, kAbort = 5, kBye = 6 };
enum VoteFlags : uint32_t { kWait = 1, kFailed = 2 };
constexpr uint32_t kMaxText = 1 << 16;
constexpr double kHeartbeatEveryS = 1.0;
constexpr double kMessageDeadlineS = 5.0;  // for the rest of a message whose first byte arrived

struct Wire {
  uint32_t magic;
  uint32_t kind;
  int32_t rank;
  uint32_t flags;
  uint64_t call;
  uint32_t size;
  uint32_t reserved;
};

std::string random_token() {
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 4; ++i) token += concat(std::hex, rd());
  return token;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The watchdog connections of this process. A forked child (a data-loader worker, say) would
// otherwise hold them open after this process dies, and peers would see the death only at the
// heartbeat timeout: the child closes its copies at once.
std::mutex fork_mutex;
std::set<int> fork_fds;

void close_in_forked_child() {
  for (int fd : fork_fds) ::close(fd);  // the child has one thread: no lock (it may have been held)
  fork_fds.clear();
}

void watch_fd(int fd, bool add) {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, close_in_forked_child); });
  std::lock_guard<std::mutex> lock(fork_mutex);
  if (add) {
    fork_fds.insert(fd);
  } else {
    fork_fds.erase(fd);
  }
}

}  // namespace

Watchdog::Watchdog(Bootstrap& bootstrap, volatile int32_t* abort_word, std::function<std::string()> describe_abort,
                   double heartbeat_timeout_s, double vote_timeout_s)
    : bootstrap_(bootstrap), rank_(bootstrap.rank()), world_(bootstrap.world_size()), abort_word_(abort_word),
      describe_abort_(std::move(describe_abort)), heartbeat_timeout_s_(heartbeat_timeout_s),
      vote_timeout_s_(vote_timeout_s) {
  IL_CHECK(heartbeat_timeout_s > kHeartbeatEveryS, "heartbeat_timeout_s must exceed ", kHeartbeatEveryS, " s");
  const BootstrapOptions& o = bootstrap.options();
  const Deadline deadline = deadline_after(o.timeout_s);
  links_.resize(rank_ == 0 ? world_ : 1);
  if (world_ > 1) {
    Socket listener;
    std::string mine;
    if (rank_ == 0) {
      listener = listen_tcp(o.master_addr, 0);
      mine = concat(bound_port(listener), ":", random_token());
    }
    const std::string root = bootstrap.all_gather(mine)[0];  // travels over the authenticated bootstrap
    const int port = std::stoi(root.substr(0, root.find(':')));
    const std::string token = root.substr(root.find(':') + 1);
    if (rank_ == 0) {
      int joined = 1;
      while (joined < world_) {
        Socket s = accept_until(listener, deadline);
        IL_CHECK(s.valid(), "rank 0: the group's watchdog connections did not all arrive within ", o.timeout_s, " s");
        Wire w{};
        std::string got(token.size(), '\0');
        const Deadline hello_deadline = std::min(deadline, deadline_after(kMessageDeadlineS));
        if (recv_all(s, &w, sizeof(w), hello_deadline) != IoStatus::kOk || w.magic != kMagic || w.kind != kHello ||
            w.size != token.size() || recv_all(s, got.data(), got.size(), hello_deadline) != IoStatus::kOk ||
            got != token || w.rank <= 0 || w.rank >= world_ || links_[w.rank].valid()) {
          continue;  // not one of ours
        }
        links_[w.rank] = std::move(s);
        ++joined;
      }
    } else {
      links_[0] = connect_tcp(o.master_addr, port, deadline);
      IL_CHECK(links_[0].valid(), "rank ", rank_, ": cannot reach rank 0's watchdog at ", o.master_addr, ":", port);
      Wire w{kMagic, kHello, rank_, 0, 0, static_cast<uint32_t>(token.size()), 0};
      IL_CHECK(send_all(links_[0], &w, sizeof(w), deadline) == IoStatus::kOk &&
                   send_all(links_[0], token.data(), token.size(), deadline) == IoStatus::kOk,
               "rank ", rank_, ": rank 0's watchdog closed the connection");
    }
    bootstrap.barrier();
  }
  for (auto& link : links_) {
    if (link.valid()) watch_fd(link.fd(), true);
  }
  last_heard_.assign(links_.size(), Clock::now());
  said_bye_.assign(links_.size(), false);
  int fds[2];
  IL_CHECK(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0, "pipe2 failed: ", strerror(errno));
  wake_read_ = fds[0];
  wake_write_ = fds[1];
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Goodbye and stop in one step, so that the thread sends the one before it honours the other.
    if (clean_) outbox_.push_back(Outgoing{-1, Message{kBye, rank_, 0, 0, {}}});
    stopping_ = true;
  }
  const char byte = 1;
  (void)!::write(wake_write_, &byte, 1);
  thread_.join();
  for (int i = 0; i < static_cast<int>(links_.size()); ++i) close_link(i);
  ::close(wake_read_);
  ::close(wake_write_);
}

void Watchdog::close_link(int i) {
  if (!links_[i].valid()) return;
  watch_fd(links_[i].fd(), false);
  links_[i].close();
}

void Watchdog::post(int to, Message m, bool wake) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outbox_.push_back(Outgoing{to, std::move(m)});
  }
  if (!wake) return;
  const char byte = 1;
  (void)!::write(wake_write_, &byte, 1);
}

Verdict Watchdog::vote(uint64_t call, const std::string& text, bool failed, bool wait) {
  if (world_ == 1) return failed ? Verdict{Verdict::kCancelled, text} : Verdict{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (wait) waiting_[call] = true;
    if (failed) {  // this rank raises for it: a cancel of it is no news to report later
      cancel_reasons_.erase(call);
      failed_here_.insert(call);
      while (failed_here_.size() > 64) failed_here_.erase(failed_here_.begin());
    }
  }
  // A vote nobody waits for (a known signature: every eager call after the first) goes with the
  // thread's next round: the wake's write and thread switch were a few of the microseconds an eager
  // call costs over a graph replay, and its only readers are rank 0's comparison (the kernels compare
  // signatures themselves) and its count of who never voted, whose timeout is seconds. The outbox
  // keeps order, so a later vote that wakes the thread sends it first. Under a vote timeout of
  // less than a second (tests) every vote wakes it, so that a queued vote is never taken for a
  // missing one.
  post(0, Message{kVote, rank_, (wait ? kWait : 0u) | (failed ? kFailed : 0u), call, text.substr(0, kMaxText)},
       /*wake=*/wait || failed || vote_timeout_s_ < 1.0);
  if (!wait) return {};
  std::unique_lock<std::mutex> lock(mutex_);
  // Rank 0 aborts past vote_timeout_s, naming who never voted; this is the backstop should rank 0's
  // word never come.
  const auto limit = std::chrono::duration<double>(vote_timeout_s_ + 2 * heartbeat_timeout_s_);
  if (!changed_.wait_for(lock, limit, [&] { return verdicts_.count(call) || *abort_word_ != 0; })) {
    waiting_.erase(call);
    lock.unlock();
    abort(concat("rank ", rank_, ": call #", call, " got no verdict from rank 0 within ", limit.count(), " s"));
    return {Verdict::kAborted, abort_reason()};
  }
  waiting_.erase(call);
  auto it = verdicts_.find(call);
  if (it == verdicts_.end()) return {Verdict::kAborted, abort_reason_};
  Verdict v = std::move(it->second);
  verdicts_.erase(it);
  if (v.kind == Verdict::kCancelled) {
    // This rank raises for the call itself. Rank 0 can answer it twice (its broadcast when a failed
    // vote came, and count_vote's reply to a late waiter): a copy arriving after this wait must not
    // become a cancel reason that check() or a later launch() reports again.
    cancel_reasons_.erase(call);
    failed_here_.insert(call);
    while (failed_here_.size() > 64) failed_here_.erase(failed_here_.begin());
  }
  return v;
}

void Watchdog::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = why;
    *abort_word_ = 1;
  }
  changed_.notify_all();
  const char byte = 1;
  (void)!::write(wake_write_, &byte, 1);
}

std::string Watchdog::abort_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

std::string Watchdog::take_cancel_reason(uint64_t call) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cancel_reasons_.find(call);
  if (it == cancel_reasons_.end()) return "";
  std::string why = std::move(it->second);
  cancel_reasons_.erase(it);
  return why;
}

std::string Watchdog::take_earliest_cancel_reason(uint64_t last_call, uint64_t* call) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cancel_reasons_.begin();
  if (it == cancel_reasons_.end() || it->first > last_call) return "";
  *call = it->first;
  std::string why = std::move(it->second);
  cancel_reasons_.erase(it);
  return why;
}

void Watchdog::set_abort(const std::string& why, bool spread) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = why;
    *abort_word_ = 1;
    if (abort_spread_) spread = false;
    abort_spread_ = true;  // told or telling: either way every rank will know
  }
  changed_.notify_all();
  if (spread) {
    for (int to = 0; to < static_cast<int>(links_.size()); ++to) {
      if (links_[to].valid()) send(to, Message{kAbort, rank_, 0, 0, why});
    }
  }
}

bool Watchdog::send(int to, const Message& m) {
  Socket& s = links_[to];
  if (!s.valid()) return false;
  const size_t size = std::min<size_t>(m.text.size(), kMaxText);
  Wire w{kMagic, m.kind, m.rank, m.flags, m.call, static_cast<uint32_t>(size), 0};
  const Deadline deadline = deadline_after(kMessageDeadlineS);
  if (send_all(s, &w, sizeof(w), deadline) == IoStatus::kOk &&
      send_all(s, m.text.data(), size, deadline) == IoStatus::kOk) {
    return true;
  }
  // A half-sent message would garble the stream: close the link; the peer takes this rank's
  // silence as death, and this rank's reader notices the peer's end the same way.
  close_link(to);
  if (!said_bye_[to]) set_abort(concat("rank ", rank_, " could not reach rank ", rank_ == 0 ? to : 0,
                                        " (a message to it could not be sent)"), true);
  return false;
}

void Watchdog::count_vote(const Message& m) {
  const int r = m.rank;
  Ballot& b = ballots_[m.call];
  if (b.voted.empty()) {
    b.voted.assign(world_, 0);
    b.signatures.assign(world_, {});
    b.waiting.assign(world_, false);
  }
  if (r < 0 || r >= world_ || b.voted[r]) return;
  b.voted[r] = 1;
  b.waiting[r] = (m.flags & kWait) != 0;
  ++b.count;
  auto answer = [&](int to, Verdict::Kind kind, const std::string& text) {
    Message v{kVerdict, r, static_cast<uint32_t>(kind), m.call, text};
    if (to == rank_) {
      deliver_verdict(v);
    } else {
      send(to, v);
    }
  };
  if (m.flags & kFailed) {
    if (b.cancelled.empty()) {
      b.cancelled = concat("rank ", r, "'s call #", m.call, " failed its argument checks: ", m.text);
      for (int to = 0; to < world_; ++to) answer(to, Verdict::kCancelled, b.cancelled);
    }
  } else if (!b.cancelled.empty()) {
    if (m.flags & kWait) answer(r, Verdict::kCancelled, b.cancelled);  // it voted after the cancel went out
  } else {
    b.signatures[r] = m.text;
  }
  if (b.count < world_) return;
  if (b.cancelled.empty()) {
    bool same = true;
    for (int q = 1; q < world_; ++q) same = same && b.signatures[q] == b.signatures[0];
    std::string text;
    if (!same) {
      text = concat("ranks made different op calls at call #", m.call, " (the same ops, in the same order, with the "
                    "same arguments are needed on every rank):");
      for (int q = 0; q < world_; ++q) text += concat(" rank ", q, ": ", b.signatures[q], ";");
    }
    bool anyone_waits = false;
    for (int q = 0; q < world_; ++q) anyone_waits = anyone_waits || b.waiting[q];
    if (same) {
      for (int to = 0; to < world_; ++to) {
        if (b.waiting[to]) answer(to, Verdict::kAgreed, "");
      }
    } else if (anyone_waits) {
      // Those who wait raise and cancel the call on the device; the kernels the others queued see
      // the cancel and skip it: nothing runs, and the group stays usable.
      for (int to = 0; to < world_; ++to) {
        Message v{kVerdict, -1, static_cast<uint32_t>(Verdict::kCancelled), m.call, text};
        if (to == rank_) {
          deliver_verdict(v);
        } else {
          send(to, v);
        }
      }
    } else {
      set_abort(text, true);  // every rank's kernel is already queued: their handshakes stop them too
    }
  }
  ballots_.erase(m.call);
}

void Watchdog::expire_ballots() {
  for (auto it = ballots_.begin(); it != ballots_.end();) {
    const Ballot& b = it->second;
    if (seconds_since(b.opened) <= vote_timeout_s_) {
      ++it;
      continue;
    }
    std::string missing;
    for (int q = 0; q < world_; ++q) {
      if (!b.voted[q]) missing += concat(missing.empty() ? "" : ", ", q);
    }
    set_abort(concat("call #", it->first, " was never made by rank(s) ", missing, " within ", vote_timeout_s_,
                     " s of the others (ranks must make the same op calls)"), true);
    it = ballots_.erase(it);
  }
}

void Watchdog::deliver_verdict(const Message& m) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto kind = static_cast<Verdict::Kind>(m.flags);
    if (waiting_.count(m.call)) {
      verdicts_[m.call] = Verdict{kind, m.text};
    } else if (kind == Verdict::kCancelled && !failed_here_.count(m.call)) {
      cancel_reasons_[m.call] = m.text;  // for check(): this rank's kernel skipped the call
      // Reasons nobody takes (this rank raised for that call itself) must not pile up.
      while (cancel_reasons_.size() > 64) cancel_reasons_.erase(cancel_reasons_.begin());
    }
  }
  changed_.notify_all();
}

void Watchdog::handle(int from, const Message& m) {
  switch (m.kind) {
    case kVote:
      if (rank_ == 0) count_vote(m);
      break;
    case kVerdict:
      deliver_verdict(m);
      break;
    case kAbort:
      set_abort(m.text, rank_ == 0);  // rank 0 passes it on
      break;
    case kBye:
      said_bye_[from] = true;
      close_link(from);
      break;
    default:
      break;
  }
}

void Watchdog::run() {
  auto last_beat = Clock::now();
  while (true) {
    std::vector<pollfd> fds{{wake_read_, POLLIN, 0}};
    std::vector<int> owners{-1};
    for (int i = 0; i < static_cast<int>(links_.size()); ++i) {
      if (links_[i].valid()) {
        fds.push_back({links_[i].fd(), POLLIN, 0});
        owners.push_back(i);
      }
    }
    ::poll(fds.data(), fds.size(), 100);
    if (fds[0].revents) {
      char sink[256];
      while (::read(wake_read_, sink, sizeof(sink)) > 0) {
      }
    }
    std::deque<Outgoing> out;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      out.swap(outbox_);
      stopping = stopping_;
    }
    for (auto& o : out) {
      if (o.to == rank_) {
        handle(rank_, o.message);
      } else if (o.to >= 0) {
        send(connection_of(o.to), o.message);
      } else {
        for (int i = 0; i < static_cast<int>(links_.size()); ++i) send(i, o.message);
      }
    }
    if (stopping) break;
    for (size_t k = 1; k < fds.size(); ++k) {
      const int from = owners[k];
      if (!fds[k].revents || !links_[from].valid()) continue;
      Wire w{};
      Message m;
      bool ok = recv_all(links_[from], &w, sizeof(w), deadline_after(kMessageDeadlineS)) == IoStatus::kOk &&
                w.magic == kMagic && w.size <= kMaxText;
      if (ok) {
        m = Message{w.kind, w.rank, w.flags, w.call, std::string(w.size, '\0')};
        ok = recv_all(links_[from], m.text.data(), m.text.size(), deadline_after(kMessageDeadlineS)) == IoStatus::kOk;
      }
      if (!ok) {
        close_link(from);
        if (!said_bye_[from]) {
          const int who = rank_ == 0 ? from : 0;
          set_abort(concat("rank ", who, " died: its process exited or was killed (rank ", rank_,
                           " saw its connection close)"), true);
        }
        continue;
      }
      last_heard_[from] = Clock::now();
      handle(from, m);
    }
    if (seconds_since(last_beat) >= kHeartbeatEveryS) {
      last_beat = Clock::now();
      for (int i = 0; i < static_cast<int>(links_.size()); ++i) send(i, Message{kHeartbeat, rank_, 0, 0, {}});
    }
    for (int i = 0; i < static_cast<int>(links_.size()); ++i) {
      if (links_[i].valid() && seconds_since(last_heard_[i]) > heartbeat_timeout_s_) {
        close_link(i);
        set_abort(concat("rank ", rank_ == 0 ? i : 0, " sent nothing for ", heartbeat_timeout_s_,
                         " s: its host is down or unreachable"), true);
      }
    }
    if (rank_ == 0) expire_ballots();
    bool spread_now = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      spread_now = *abort_word_ != 0 && !abort_spread_;
    }
    if (spread_now) {
      std::string why = abort_reason();
      if (why.empty()) why = describe_abort_();
      set_abort(why, true);
    }
  }
}

}  // namespace interlace
