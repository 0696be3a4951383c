#include "interlace/runtime/bootstrap.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <deque>
#include <optional>

#include "interlace/base/error.h"
#include "interlace/runtime/hmac.h"

namespace interlace {
using detail::concat;
namespace {

constexpr uint32_t kMagic = 0x494c4253;  // "ILBS"
// 2: challenge-response with HMAC-SHA256; 1 sent a hash of the secret, which could be replayed.
constexpr uint32_t kVersion = 2;
// How long a new connection has to prove itself before rank 0 drops it.
constexpr double kHandshakeTimeoutS = 5.0;
// Connections rank 0 authenticates at once, besides one for each rank; a new one beyond them pushes
// out the oldest. Real ranks answer within a round trip, so only the silent grow old.
constexpr size_t kMaxStrangers = 256;
// Connections accepted per wake-up, so that a flood of them cannot starve those already waiting.
constexpr int kMaxAcceptsPerWake = 64;
// The longest message a peer reads from a rank 0 that has not proven itself yet (a refusal can
// list many missing ranks).
constexpr uint64_t kMaxRefusal = uint64_t{1} << 20;
// Between ranks that have proven themselves: all_gather blobs.
constexpr uint64_t kMaxPayload = uint64_t{1} << 32;

enum class Kind : uint32_t { kHello = 1, kWelcome = 2, kReject = 3, kData = 4, kAbort = 5, kChallenge = 6 };

struct Header {
  uint32_t magic;
  uint32_t kind;
  uint64_t size;
};

using Nonce = std::array<uint8_t, 32>;

// Rank 0 -> peer, first thing on every connection.
struct Challenge {
  uint32_t version;
  uint32_t pad;
  Nonce nonce;  // fresh for every connection
};

// Peer -> rank 0, the answer to a challenge.
struct Hello {
  uint32_t version;
  int32_t rank;
  int32_t world_size;
  uint32_t pad;
  Nonce nonce;  // the peer's own, which rank 0's welcome must answer
  Digest mac;   // hello_mac()
};

// Rank 0 -> peer, once every rank has joined.
struct Welcome {
  Digest proof;  // welcome_proof()
};

static_assert(sizeof(Challenge) == 40 && sizeof(Hello) == 80 && sizeof(Welcome) == 32,
              "bootstrap wire structs must have no padding");

std::string bytes_of(const void* data, size_t size) { return std::string(static_cast<const char*>(data), size); }

// The labels differ (and so do the lengths), so a hello's MAC can never pass for a welcome's proof.
Digest hello_mac(const std::string& secret, const Nonce& challenge, const Hello& hello) {
  return hmac_sha256(secret, "interlace bootstrap hello" + bytes_of(challenge.data(), challenge.size()) +
                                 bytes_of(&hello, offsetof(Hello, mac)));
}

Digest welcome_proof(const std::string& secret, const Nonce& challenge, const Hello& hello) {
  return hmac_sha256(secret, "interlace bootstrap welcome" + bytes_of(challenge.data(), challenge.size()) +
                                 bytes_of(&hello, offsetof(Hello, mac)));
}

std::string frame(Kind kind, const std::string& payload) {
  Header h{kMagic, static_cast<uint32_t>(kind), payload.size()};
  return bytes_of(&h, sizeof(h)) + payload;
}

struct Message {
  IoStatus status = IoStatus::kOk;
  bool foreign = false;  // not an interlace message, or larger than the reader allows
  Kind kind = Kind::kData;
  std::string payload;
};

IoStatus send_message(const Socket& s, Kind kind, const std::string& payload, Deadline deadline) {
  Header h{kMagic, static_cast<uint32_t>(kind), payload.size()};
  IoStatus st = send_all(s, &h, sizeof(h), deadline);
  if (st != IoStatus::kOk) return st;
  return send_all(s, payload.data(), payload.size(), deadline);
}

Message recv_message(const Socket& s, Deadline deadline, uint64_t max_size = kMaxPayload) {
  Message m;
  Header h{};
  m.status = recv_all(s, &h, sizeof(h), deadline);
  if (m.status != IoStatus::kOk) return m;
  if (h.magic != kMagic || h.size > max_size) {
    m.status = IoStatus::kClosed;  // callers that do not ask why treat it as a lost peer
    m.foreign = true;
    return m;
  }
  m.kind = static_cast<Kind>(h.kind);
  m.payload.resize(h.size);
  m.status = recv_all(s, m.payload.data(), h.size, deadline);
  return m;
}

std::string describe(IoStatus st, double timeout_s) {
  if (st == IoStatus::kTimeout) return concat("did not answer within ", timeout_s, " s");
  return "closed the connection (did the process exit?)";
}

// A connection that answered its own challenge with the right MAC: its process knows the secret
// and is not replaying an old hello. What it claims (rank, world size) is for the caller to check.
struct Admitted {
  Socket socket;
  Hello hello;
  Nonce challenge;
};

// Rank 0's door: accepts connections, challenges each, and hands over those that prove
// themselves. All are served together from one poll, each with its own short deadline, and each
// may send only a hello of the exact size; anything else is dropped without further ado.
class Gate {
 public:
  Gate(const Socket& listener, const std::string& secret, int world_size)
      : listener_(listener), secret_(secret), max_pending_(kMaxStrangers + static_cast<size_t>(world_size)) {}

  // The next connection to prove itself, or nothing once `deadline` has passed or the process
  // has run out of file descriptors (see out_of_descriptors).
  std::optional<Admitted> next(Deadline deadline) {
    while (proven_.empty()) {
      Clock::time_point now = Clock::now();
      for (Pending& p : pending_) {
        if (p.deadline <= now) drop(p);
      }
      forget_closed();
      if (now >= deadline || out_of_descriptors_) return std::nullopt;
      Deadline wake = deadline;
      std::vector<const Socket*> watched{&listener_};
      for (const Pending& p : pending_) {
        wake = std::min(wake, p.deadline);
        watched.push_back(&p.socket);
      }
      std::vector<size_t> ready = wait_readable(watched, wake);
      for (size_t i : ready) {
        if (i > 0) advance(pending_[i - 1]);
      }
      forget_closed();
      if (!ready.empty() && ready[0] == 0) accept_new();
    }
    Admitted a = std::move(proven_.front());
    proven_.pop_front();
    return a;
  }

  int wrong_secrets() const { return wrong_secrets_; }
  int dropped() const { return dropped_; }
  bool out_of_descriptors() const { return out_of_descriptors_; }

 private:
  struct Pending {
    Socket socket;
    Deadline deadline;
    Nonce challenge;
    std::array<char, sizeof(Header) + sizeof(Hello)> hello;  // the only thing it may send
    size_t received = 0;
  };

  void drop(Pending& p) {
    p.socket.close();
    ++dropped_;
  }

  void forget_closed() {
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.socket.valid(); }),
                   pending_.end());
  }

  void accept_new() {
    for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
      bool exhausted = false;
      Socket s = accept_now(listener_, &exhausted);
      if (exhausted) {
        // Strangers may be holding the file descriptors: the longest-waiting of them goes.
        if (pending_.empty()) {
          out_of_descriptors_ = true;
          return;
        }
        drop(pending_.front());
        pending_.erase(pending_.begin());
        continue;
      }
      if (!s.valid()) return;
      if (pending_.size() >= max_pending_) {
        drop(pending_.front());
        pending_.erase(pending_.begin());
      }
      Pending p;
      p.socket = std::move(s);
      p.deadline = deadline_after(kHandshakeTimeoutS);
      fill_random(p.challenge.data(), p.challenge.size());
      Challenge c{kVersion, 0, p.challenge};
      std::string message = frame(Kind::kChallenge, bytes_of(&c, sizeof(c)));
      if (!send_now(p.socket, message.data(), message.size())) {
        drop(p);
        continue;
      }
      pending_.push_back(std::move(p));
    }
  }

  // Reads what `p` has sent; closes it or moves it to proven_ once it is decided.
  void advance(Pending& p) {
    size_t got = 0;
    if (recv_now(p.socket, p.hello.data() + p.received, p.hello.size() - p.received, &got) != IoStatus::kOk) {
      drop(p);
      return;
    }
    p.received += got;
    if (p.received >= sizeof(Header)) {
      Header h;
      memcpy(&h, p.hello.data(), sizeof(h));
      if (h.magic != kMagic || h.kind != static_cast<uint32_t>(Kind::kHello) || h.size != sizeof(Hello)) {
        drop(p);
        return;
      }
    }
    if (p.received < p.hello.size()) return;
    Hello hello;
    memcpy(&hello, p.hello.data() + sizeof(Header), sizeof(hello));
    Digest expected = hello_mac(secret_, p.challenge, hello);
    if (!equal_in_constant_time(expected.data(), hello.mac.data(), expected.size())) {
      // Also what a replayed hello gets: its MAC answers another connection's challenge. The
      // connection has sent exactly the hello, all read, so closing it does not reset the refusal
      // away.
      ++wrong_secrets_;
      std::string refusal =
          frame(Kind::kReject, "wrong secret: rank 0 of this job expects another secret (INTERLACE_SECRET)");
      send_now(p.socket, refusal.data(), refusal.size());
      p.socket.close();
      return;
    }
    proven_.push_back(Admitted{std::move(p.socket), hello, p.challenge});
  }

  const Socket& listener_;
  const std::string& secret_;
  const size_t max_pending_;
  std::vector<Pending> pending_;  // oldest first
  std::deque<Admitted> proven_;
  int wrong_secrets_ = 0;
  int dropped_ = 0;
  bool out_of_descriptors_ = false;
};

}  // namespace

Bootstrap::Bootstrap(const BootstrapOptions& options) : options_(options) {
  IL_CHECK(options_.world_size >= 1, "world_size must be >= 1, got ", options_.world_size);
  IL_CHECK(options_.rank >= 0 && options_.rank < options_.world_size, "rank ", options_.rank,
           " is out of range for world_size ", options_.world_size);
  IL_CHECK(options_.timeout_s > 0, "timeout_s must be positive");
  if (options_.world_size == 1) return;
  IL_CHECK(!options_.master_addr.empty() && options_.master_port > 0 && options_.master_port < 65536,
           "rank ", options_.rank, ": the master address is not set (master_addr='", options_.master_addr,
           "', master_port=", options_.master_port, "); pass them or set MASTER_ADDR and MASTER_PORT");
  if (options_.secret.empty() || options_.secret_is_job_id) {
    IL_CHECK(is_loopback_address(options_.master_addr), "rank ", options_.rank, ": master_addr ",
             options_.master_addr, " is not a loopback address, so the ranks need a shared secret (without one, "
             "anyone who can reach ", options_.master_addr, ":", options_.master_port, " could join the job)",
             options_.secret_is_job_id ? "; the launcher's job id, the only one found, is no secret" : "",
             ": set INTERLACE_SECRET to the same random string for every rank (e.g. export "
             "INTERLACE_SECRET=$(openssl rand -hex 16) before launching), or pass secret=");
  }
  if (options_.rank == 0) {
    rendezvous_as_root();
  } else {
    rendezvous_as_peer();
  }
}

Bootstrap::~Bootstrap() = default;

void Bootstrap::rendezvous_as_root() {
  Socket listener = listen_tcp(options_.master_addr, options_.master_port);
  const Deadline deadline = deadline_after(options_.timeout_s);
  Gate gate(listener, options_.secret, options_.world_size);
  peers_.resize(options_.world_size);
  std::vector<Digest> proofs(options_.world_size);
  int joined = 1;
  while (joined < options_.world_size) {
    std::optional<Admitted> admitted = gate.next(deadline);
    if (!admitted) {
      if (gate.out_of_descriptors()) {
        abort_all(concat("rank 0 ran out of file descriptors during rendezvous, with ", joined,
                         " rank(s) joined; raise the limit (ulimit -n)"));
      }
      std::string missing;
      for (int r = 1; r < options_.world_size; ++r) {
        if (!peers_[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      std::string note;
      if (gate.wrong_secrets()) note += concat("; ", gate.wrong_secrets(), " connection(s) were rejected for a wrong secret");
      if (gate.dropped()) {
        note += concat("; ", gate.dropped(), " other connection(s) were dropped (silent for ", kHandshakeTimeoutS,
                       " s, or not speaking the bootstrap protocol)");
      }
      abort_all(concat("rendezvous timed out after ", options_.timeout_s, " s on rank 0: rank(s) ", missing,
                       " never joined", note));
    }
    // It knows the secret, so it is one of ours: what it claims is a fact about the job, and a
    // wrong claim stops the job.
    const Hello& hello = admitted->hello;
    std::string problem;
    if (hello.version != kVersion) {
      problem = concat("rank ", hello.rank, " speaks bootstrap version ", hello.version, ", rank 0 speaks ", kVersion);
    } else if (hello.world_size != options_.world_size) {
      problem = concat("world size mismatch: rank ", hello.rank, " was started with world_size ", hello.world_size,
                       ", rank 0 with ", options_.world_size);
    } else if (hello.rank <= 0 || hello.rank >= options_.world_size) {
      problem = concat("rank ", hello.rank, " is out of range for world_size ", options_.world_size);
    } else if (peers_[hello.rank].valid()) {
      problem = concat("duplicate rank: two processes joined as rank ", hello.rank);
    }
    if (!problem.empty()) {
      send_message(admitted->socket, Kind::kReject, problem, deadline_after(1.0));
      abort_all(problem);
    }
    proofs[hello.rank] = welcome_proof(options_.secret, admitted->challenge, hello);
    peers_[hello.rank] = std::move(admitted->socket);
    ++joined;
  }
  for (int r = 1; r < options_.world_size; ++r) {
    Welcome welcome{proofs[r]};
    if (send_message(peers_[r], Kind::kWelcome, bytes_of(&welcome, sizeof(welcome)), deadline) != IoStatus::kOk) {
      abort_all(concat("rank ", r, " left during rendezvous"));
    }
  }
}

void Bootstrap::rendezvous_as_peer() {
  const Deadline deadline = deadline_after(options_.timeout_s);
  const int rank = options_.rank;
  to_root_ = connect_tcp(options_.master_addr, options_.master_port, deadline);
  IL_CHECK(to_root_.valid(), "rank ", rank, " cannot reach the master at ", options_.master_addr, ":",
           options_.master_port, " within ", options_.timeout_s, " s (is rank 0 running, and are MASTER_ADDR and "
           "MASTER_PORT right?)");
  // Until its welcome proves it, whatever listens there may be a stranger: read only short messages.
  auto expect = [&](const Message& m, Kind kind, size_t size) {
    IL_CHECK(!m.foreign, "rank ", rank, ": the process at ", options_.master_addr, ":", options_.master_port,
             " does not speak interlace's bootstrap protocol (version ", kVersion, "); is another program, or "
             "another version of interlace, using that port?");
    IL_CHECK(m.status == IoStatus::kOk, "rank ", rank, ": the master ", describe(m.status, options_.timeout_s),
             " during rendezvous");
    IL_CHECK(m.kind != Kind::kReject && m.kind != Kind::kAbort, "rank ", rank, " was refused by rank 0: ", m.payload);
    IL_CHECK(m.kind == kind && m.payload.size() == size, "rank ", rank, ": the process at ", options_.master_addr,
             ":", options_.master_port, " does not speak interlace's bootstrap protocol (version ", kVersion, ")");
  };
  Message challenge_message = recv_message(to_root_, deadline, kMaxRefusal);
  expect(challenge_message, Kind::kChallenge, sizeof(Challenge));
  Challenge challenge;
  memcpy(&challenge, challenge_message.payload.data(), sizeof(challenge));
  IL_CHECK(challenge.version == kVersion, "rank ", rank, " speaks bootstrap version ", kVersion, ", rank 0 speaks ",
           challenge.version, " (are all ranks running the same interlace?)");

  Hello hello{kVersion, rank, options_.world_size, 0, {}, {}};
  fill_random(hello.nonce.data(), hello.nonce.size());
  hello.mac = hello_mac(options_.secret, challenge.nonce, hello);
  IoStatus st = send_message(to_root_, Kind::kHello, bytes_of(&hello, sizeof(hello)), deadline);
  IL_CHECK(st == IoStatus::kOk, "rank ", rank, ": the master ", describe(st, options_.timeout_s), " during rendezvous");

  Message reply = recv_message(to_root_, deadline, kMaxRefusal);
  expect(reply, Kind::kWelcome, sizeof(Welcome));
  Digest proof = welcome_proof(options_.secret, challenge.nonce, hello);
  IL_CHECK(equal_in_constant_time(proof.data(), reply.payload.data(), proof.size()), "rank ", rank,
           ": the process at ", options_.master_addr, ":", options_.master_port,
           " welcomed it without proof that it knows the job's secret, so it is not this job's rank 0 (is a "
           "stranger listening on that port?)");
}

void Bootstrap::abort_all(const std::string& why) {
  broken_ = true;
  Deadline deadline = deadline_after(1.0);
  for (auto& peer : peers_) {
    if (peer.valid()) send_message(peer, Kind::kAbort, why, deadline);
  }
  // Peers may have sent data rank 0 never read; closing over it would reset the connection and lose
  // the abort message on its way to them.
  Deadline drain = deadline_after(2.0);
  for (auto& peer : peers_) close_after_drain(peer, drain);
  IL_FAIL(why);
}

std::vector<std::string> Bootstrap::all_gather(const std::string& mine) {
  // Two threads' messages interleaved on one connection would garble both.
  std::lock_guard<std::mutex> lock(mutex_);
  IL_CHECK(!broken_, "rank ", options_.rank, ": the bootstrap is unusable after an earlier failure");
  std::vector<std::string> all(options_.world_size);
  all[options_.rank] = mine;
  if (options_.world_size == 1) return all;
  const Deadline deadline = deadline_after(options_.timeout_s);
  if (options_.rank == 0) {
    for (int r = 1; r < options_.world_size; ++r) {
      Message m = recv_message(peers_[r], deadline);
      if (m.status != IoStatus::kOk || m.kind != Kind::kData) {
        abort_all(concat("rank ", r, " ", describe(m.status, options_.timeout_s), " during a bootstrap all_gather"));
      }
      all[r] = std::move(m.payload);
    }
    std::string packed;
    for (const auto& blob : all) {
      uint64_t n = blob.size();
      packed.append(reinterpret_cast<const char*>(&n), sizeof(n));
      packed += blob;
    }
    for (int r = 1; r < options_.world_size; ++r) {
      if (send_message(peers_[r], Kind::kData, packed, deadline) != IoStatus::kOk) {
        abort_all(concat("rank ", r, " closed the connection during a bootstrap all_gather"));
      }
    }
    return all;
  }
  IoStatus st = send_message(to_root_, Kind::kData, mine, deadline);
  Message m;
  m.status = st;
  if (st == IoStatus::kOk) m = recv_message(to_root_, deadline);
  if (m.status != IoStatus::kOk || m.kind != Kind::kData) {
    broken_ = true;
    if (m.status == IoStatus::kOk && m.kind == Kind::kAbort) IL_FAIL("rank ", options_.rank, ": job aborted by rank 0: ", m.payload);
    IL_FAIL("rank ", options_.rank, ": lost rank 0 during a bootstrap all_gather: it ", describe(m.status, options_.timeout_s));
  }
  size_t pos = 0;
  for (int r = 0; r < options_.world_size; ++r) {
    uint64_t n = 0;
    IL_CHECK(pos + sizeof(n) <= m.payload.size(), "malformed all_gather reply from rank 0");
    memcpy(&n, m.payload.data() + pos, sizeof(n));
    pos += sizeof(n);
    IL_CHECK(pos + n <= m.payload.size(), "malformed all_gather reply from rank 0");
    all[r] = m.payload.substr(pos, n);
    pos += n;
  }
  return all;
}

void Bootstrap::barrier() { all_gather(std::string()); }

}  // namespace interlace
