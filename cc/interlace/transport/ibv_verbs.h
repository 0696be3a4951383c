// The real Verbs (verbs.h): libibverbs, and efadv for EFA, through the table of ibv_api.h.
//
// Setup, in the constructor, collective over the group (every rank constructs one, at once):
//   1. open the device (the one named, else the first), check its port is up, pick the GID
//      (RoCE), allocate a protection domain;
//   2. register the heap: by dmabuf (ibv_reg_dmabuf_mr) when given its fd, else, or when that fails,
//      by address (ibv_reg_mr: GPU memory then needs the nvidia-peermem module); and a small host
//      scratch buffer (the old values FETCH_AND_ADD returns, the receive slots' target);
//   3. a send and a receive completion queue; RC: a shared receive queue and a queue pair per
//      peer, moved to INIT; SRD: one queue pair, moved to RTS (it needs nothing from peers);
//   4. exchange connection info with every rank (ibv_connect.h) through all_gather, validate it;
//   5. RC: each queue pair to RTR (the peer's QP number, PSN, LID or GID, the path MTU) and RTS;
//      SRD: an address handle per peer;
//   6. a second exchange in which every rank says whether step 5 worked.
// A rank that fails (no libibverbs, no device, no such device, registration refused, ...) still
// takes part in both exchanges, saying why, so every rank raises an interlace::Error naming it and
// none waits. Nothing here exits or aborts the process.
//
// The data path (send_room, post, post_receives, poll) runs on the proxy's thread. It never raises:
// a post the device refuses, or one that names a rank not connected or a range outside a heap,
// comes back from poll() as a failed completion naming the peer, which the backend turns into the
// group's failure.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "interlace/transport/ibv_api.h"
#include "interlace/transport/ibv_connect.h"
#include "interlace/transport/verbs.h"

namespace interlace {

class Bootstrap;

struct IbvOptions {
  std::string device;              // "": the first RDMA device of the host
  uint8_t port = 1;
  int gid_index = -1;              // RoCE: -1 chooses (choose_gid_index); ignored on InfiniBand and EFA
  // The heap: its (GPU virtual) address, which peers' writes name, and size.
  uint64_t heap_address = 0;
  uint64_t heap_bytes = 0;
  int dmabuf_fd = -1;              // >= 0: register through this dmabuf (e.g. cuMemGetHandleForAddressRange)
  uint64_t dmabuf_offset = 0;      // where the heap starts in it
  std::string no_dmabuf;           // with no fd: why there is none, for the error if by address fails too
  // Ranks to connect to (true: on another node); empty: every other rank. Must agree across ranks.
  std::vector<bool> connect;
  int send_depth = 256;            // work requests in flight per send queue (capped by the device)
  int receive_depth = 1024;        // receive slots for writes with immediate data (capped likewise)
};

// all_gather as the bootstrap provides it: every rank's blob, indexed by rank.
using AllGather = std::function<std::vector<std::string>(const std::string&)>;

class IbvVerbs : public Verbs {
 public:
  IbvVerbs(const IbvApi& api, const IbvOptions& options, int rank, int world_size, AllGather all_gather);
  ~IbvVerbs() override;
  IbvVerbs(const IbvVerbs&) = delete;
  IbvVerbs& operator=(const IbvVerbs&) = delete;

  int send_room(int peer) const override;
  void post(const VerbsWork& work) override;
  void post_receives(int count) override;
  int poll(VerbsCompletion* out, int max) override;

  IbvTransport transport() const { return transport_; }
  const std::string& device_name() const { return device_name_; }
  uint32_t rkey() const;
  uint64_t heap_address() const { return options_.heap_address; }
  bool registered_by_dmabuf() const { return by_dmabuf_; }

 private:
  struct Pending {
    uint64_t wr_id;  // ours: the work's sequence number
    uint64_t id;     // the backend's
    int peer;
    bool signaled;
  };
  struct SendQueue {
    ibv_qp* qp = nullptr;
    std::deque<Pending> pending;  // posted, not yet retired, in post order
  };
  struct Remote {
    int queue = -1;  // index into queues_; -1: not connected
    uint64_t heap_addr = 0, heap_bytes = 0;
    uint32_t rkey = 0;
    uint32_t qpn = 0, qkey = 0;  // SRD
    ibv_ah* ah = nullptr;        // SRD
  };

  void open_device();
  void register_memory();
  void create_queues();
  std::string local_blob() const;
  void connect(const std::vector<IbvRankInfo>& ranks);
  void release();
  void modify(ibv_qp* qp, const QpTransition& t, const char* state, int peer);
  void fail_locally(int peer, VerbsCompletion::Kind kind, uint64_t id, const std::string& why);
  std::string status_text(const ibv_wc& wc) const;
  int take_send(const ibv_wc& wc, VerbsCompletion* out);
  bool take_receive(const ibv_wc& wc, VerbsCompletion* out);

  const IbvApi& api_;
  const IbvOptions options_;
  const int rank_, world_size_;
  IbvTransport transport_ = IbvTransport::kFailed;
  std::string device_name_;

  ibv_context* context_ = nullptr;
  IbvPort port_{};
  ibv_gid gid_{};
  uint32_t max_message_ = 0;  // the largest write the port carries
  int max_cqe_ = 0;
  bool srd_rnr_retry_ = false;
  int send_depth_ = 0, receive_depth_ = 0;
  ibv_pd* pd_ = nullptr;
  ibv_mr* heap_mr_ = nullptr;
  ibv_mr* scratch_mr_ = nullptr;
  bool by_dmabuf_ = false;
  alignas(64) uint64_t scratch_[8] = {};
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_srq* srq_ = nullptr;               // RC: receive slots shared by the queue pairs
  std::vector<SendQueue> queues_;        // RC: one per connected peer; SRD: one
  std::vector<int> queue_peer_;          // RC: the peer of each queue; SRD: -1
  std::vector<uint32_t> psn_;            // RC: our first PSN, per queue
  std::vector<Remote> remotes_;          // per rank
  std::map<uint32_t, int> queue_of_qpn_;  // our QP number -> queue
  std::map<uint64_t, int> srd_sender_;   // SRD: (address handle number << 32 | QP number) -> rank
  uint64_t next_wr_id_ = 1;
  int receives_posted_ = 0;
  std::deque<VerbsCompletion> local_failures_;  // posts that failed before reaching the device
  std::vector<ibv_wc> wc_;
};

// An IbvVerbs over the loaded libibverbs (VerbsLibrary), exchanging through `all_gather`; when
// the library cannot be loaded, this rank still takes part in the exchange, so every rank raises.
std::unique_ptr<IbvVerbs> open_ibv_verbs(const IbvOptions& options, int rank, int world_size, AllGather all_gather);
std::unique_ptr<IbvVerbs> open_ibv_verbs(const IbvOptions& options, Bootstrap& bootstrap);

}  // namespace interlace
