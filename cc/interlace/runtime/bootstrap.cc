#include "interlace/runtime/bootstrap.h"

#include <cstring>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;
namespace {

constexpr uint32_t kMagic = 0x494c4253;  // "ILBS"
constexpr uint32_t kVersion = 1;

enum class Kind : uint32_t { kHello = 1, kWelcome = 2, kReject = 3, kData = 4, kAbort = 5 };

struct Header {
  uint32_t magic;
  uint32_t kind;
  uint64_t size;
};

struct Hello {
  uint32_t version;
  int32_t rank;
  int32_t world_size;
  uint32_t pad;
  uint64_t secret_hash;
};

struct Message {
  IoStatus status = IoStatus::kOk;
  Kind kind = Kind::kData;
  std::string payload;
};

constexpr uint64_t kMaxPayload = uint64_t{1} << 32;

IoStatus send_message(const Socket& s, Kind kind, const std::string& payload, Deadline deadline) {
  Header h{kMagic, static_cast<uint32_t>(kind), payload.size()};
  IoStatus st = send_all(s, &h, sizeof(h), deadline);
  if (st != IoStatus::kOk) return st;
  return send_all(s, payload.data(), payload.size(), deadline);
}

Message recv_message(const Socket& s, Deadline deadline) {
  Message m;
  Header h{};
  m.status = recv_all(s, &h, sizeof(h), deadline);
  if (m.status != IoStatus::kOk) return m;
  if (h.magic != kMagic || h.size > kMaxPayload) {
    m.status = IoStatus::kClosed;  // not an interlace peer
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

}  // namespace

uint64_t secret_hash(const std::string& secret) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : secret) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Bootstrap::Bootstrap(const BootstrapOptions& options) : options_(options) {
  IL_CHECK(options_.world_size >= 1, "world_size must be >= 1, got ", options_.world_size);
  IL_CHECK(options_.rank >= 0 && options_.rank < options_.world_size, "rank ", options_.rank,
           " is out of range for world_size ", options_.world_size);
  IL_CHECK(options_.timeout_s > 0, "timeout_s must be positive");
  if (options_.world_size == 1) return;
  IL_CHECK(!options_.master_addr.empty() && options_.master_port > 0 && options_.master_port < 65536,
           "rank ", options_.rank, ": the master address is not set (master_addr='", options_.master_addr,
           "', master_port=", options_.master_port, "); pass them or set MASTER_ADDR and MASTER_PORT");
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
  const uint64_t expected_hash = secret_hash(options_.secret);
  peers_.resize(options_.world_size);
  int joined = 1;
  int wrong_secrets = 0;
  while (joined < options_.world_size) {
    Socket s = accept_until(listener, deadline);
    if (!s.valid()) {
      std::string missing;
      for (int r = 1; r < options_.world_size; ++r) {
        if (!peers_[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      std::string note = wrong_secrets ? concat("; ", wrong_secrets, " connection(s) were rejected for a wrong secret") : "";
      abort_all(concat("rendezvous timed out after ", options_.timeout_s, " s on rank 0: rank(s) ", missing,
                       " never joined", note));
    }
    // A connection that does not say hello promptly is not one of ours: drop it and go on.
    Deadline hello_deadline = std::min(deadline, deadline_after(5.0));
    Message m = recv_message(s, hello_deadline);
    if (m.status != IoStatus::kOk || m.kind != Kind::kHello || m.payload.size() != sizeof(Hello)) continue;
    Hello hello;
    memcpy(&hello, m.payload.data(), sizeof(hello));
    if (hello.secret_hash != expected_hash) {
      ++wrong_secrets;
      send_message(s, Kind::kReject, "wrong secret: rank 0 of this job expects another secret (INTERLACE_SECRET)",
                   hello_deadline);
      continue;
    }
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
      send_message(s, Kind::kReject, problem, hello_deadline);
      abort_all(problem);
    }
    peers_[hello.rank] = std::move(s);
    ++joined;
  }
  for (int r = 1; r < options_.world_size; ++r) {
    if (send_message(peers_[r], Kind::kWelcome, "", deadline) != IoStatus::kOk) {
      abort_all(concat("rank ", r, " left during rendezvous"));
    }
  }
}

void Bootstrap::rendezvous_as_peer() {
  const Deadline deadline = deadline_after(options_.timeout_s);
  to_root_ = connect_tcp(options_.master_addr, options_.master_port, deadline);
  IL_CHECK(to_root_.valid(), "rank ", options_.rank, " cannot reach the master at ", options_.master_addr, ":",
           options_.master_port, " within ", options_.timeout_s, " s (is rank 0 running, and are MASTER_ADDR and "
           "MASTER_PORT right?)");
  Hello hello{kVersion, options_.rank, options_.world_size, 0, secret_hash(options_.secret)};
  std::string payload(reinterpret_cast<const char*>(&hello), sizeof(hello));
  IoStatus st = send_message(to_root_, Kind::kHello, payload, deadline);
  IL_CHECK(st == IoStatus::kOk, "rank ", options_.rank, ": the master ", describe(st, options_.timeout_s),
           " during rendezvous");
  Message reply = recv_message(to_root_, deadline);
  IL_CHECK(reply.status == IoStatus::kOk, "rank ", options_.rank, ": the master ",
           describe(reply.status, options_.timeout_s), " during rendezvous");
  IL_CHECK(reply.kind == Kind::kWelcome, "rank ", options_.rank, " was refused by rank 0: ", reply.payload);
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
  Message m = st == IoStatus::kOk ? recv_message(to_root_, deadline) : Message{st};
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
