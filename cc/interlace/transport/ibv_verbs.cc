#include "interlace/transport/ibv_verbs.h"

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <random>

#include "interlace/base/error.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/transport/verbs_library.h"

namespace interlace {
using detail::concat;
namespace {

// efadv.h of rdma-core < 46 lacks it; the value is fixed by the device interface.
constexpr uint32_t kEfaCapsRdmaWrite = 1 << 3;

// Verbs return an errno value, or -1 with errno set.
std::string error_text(int rc) { return std::strerror(rc > 0 ? rc : errno); }

std::string without_prefix(const std::string& why) {
  return why.rfind("interlace: ", 0) == 0 ? why.substr(11) : why;
}

const char* port_state_name(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
  }
}

const char* link_layer_name(uint8_t l) {
  return l == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : l == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand" : "unspecified";
}

}  // namespace

IbvVerbs::IbvVerbs(const IbvApi& api, const IbvOptions& options, int rank, int world_size, AllGather all_gather)
    : api_(api), options_(options), rank_(rank), world_size_(world_size) {
  IL_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "IbvVerbs: rank ", rank, " of ", world_size);
  remotes_.resize(world_size);

  // 1-3: this rank's side. A failure here is told to every rank in the exchange below.
  std::string mine;
  try {
    IL_CHECK(options_.connect.empty() || static_cast<int>(options_.connect.size()) == world_size,
             "IbvOptions::connect has ", options_.connect.size(), " entries for a group of ", world_size);
    IL_CHECK(options_.heap_bytes > 0 && options_.heap_address != 0, "RDMA: no heap to register (address 0x",
             std::hex, options_.heap_address, std::dec, ", ", options_.heap_bytes, " bytes)");
    open_device();
    register_memory();
    create_queues();
    mine = local_blob();
  } catch (const std::exception& e) {
    release();
    mine = encode_ibv_failure(rank_, world_size_, e.what());
  }

  // 4: every rank's connection info; raises the same error on every rank when any is bad or failed.
  std::vector<IbvRankInfo> ranks;
  try {
    ranks = decode_ibv_blobs(all_gather(mine), world_size_);
  } catch (...) {
    release();
    throw;
  }

  // 5-6: bring the queue pairs up, then agree that everyone did.
  std::string why;
  try {
    connect(ranks);
  } catch (const std::exception& e) {
    why = without_prefix(e.what());
  }
  std::vector<std::string> verdicts;
  try {
    verdicts = all_gather(why);
    IL_CHECK(static_cast<int>(verdicts.size()) == world_size_, "RDMA setup: the exchange returned ", verdicts.size(),
             " answers for a group of ", world_size_);
    for (int r = 0; r < world_size_; ++r) {
      IL_CHECK(verdicts[r].empty(), "RDMA setup failed on rank ", r, " while connecting its queue pairs: ", verdicts[r]);
    }
  } catch (...) {
    release();
    throw;
  }
}

IbvVerbs::~IbvVerbs() { release(); }

// ---- Setup -------------------------------------------------------------------------------------

void IbvVerbs::open_device() {
  const RdmaDevice chosen = choose_rdma_device(list_rdma_devices(api_), options_.device);
  device_name_ = chosen.name;
  int count = 0;
  ibv_device** list = api_.get_device_list(&count);
  IL_CHECK(list != nullptr, "ibv_get_device_list failed: ", error_text(-1));
  int err = 0;
  for (int i = 0; i < count && context_ == nullptr; ++i) {
    if (device_name_ == api_.get_device_name(list[i])) {
      context_ = api_.open_device(list[i]);
      err = errno;
    }
  }
  api_.free_device_list(list);  // an opened context stays valid
  IL_CHECK(context_ != nullptr, "could not open RDMA device ", device_name_, ": ", std::strerror(err ? err : ENODEV));

  ibv_device_attr device{};
  int rc = api_.query_device(context_, &device);
  IL_CHECK(rc == 0, "querying RDMA device ", device_name_, " failed: ", error_text(rc));
  IL_CHECK(options_.port >= 1 && options_.port <= device.phys_port_cnt, "RDMA device ", device_name_, " has no port ",
           int(options_.port), " (it has ", int(device.phys_port_cnt), ")");
  ibv_port_attr port{};
  rc = api_.query_port(context_, options_.port, &port);
  IL_CHECK(rc == 0, "querying port ", int(options_.port), " of ", device_name_, " failed: ", error_text(rc));
  IL_CHECK(port.state == IBV_PORT_ACTIVE, "port ", int(options_.port), " of ", device_name_, " is ",
           port_state_name(port.state), ", not ACTIVE: check its link (cable, switch, subnet manager)");
  max_cqe_ = device.max_cqe;
  send_depth_ = std::min(options_.send_depth, device.max_qp_wr);
  receive_depth_ = std::min(options_.receive_depth, device.max_qp_wr);

  efadv_device_attr efa{};
  if (api_.efa_query_device != nullptr && api_.efa_query_device(context_, &efa, sizeof efa) == 0) {
    transport_ = IbvTransport::kSrd;
    IL_CHECK(efa.device_caps & kEfaCapsRdmaWrite, "EFA device ", device_name_, " offers no RDMA write, which SRD ",
             "transfers need (a newer EFA generation and rdma-core >= 46 have it)");
    srd_rnr_retry_ = (efa.device_caps & EFADV_DEVICE_ATTR_CAPS_RNR_RETRY) != 0;
    max_message_ = efa.max_rdma_size ? efa.max_rdma_size : port.max_msg_sz;
    send_depth_ = std::min<int>(send_depth_, efa.max_sq_wr);
    receive_depth_ = std::min<int>(receive_depth_, efa.max_rq_wr);
  } else {
    transport_ = IbvTransport::kRc;
    IL_CHECK(device.atomic_cap != IBV_ATOMIC_NONE, "RDMA device ", device_name_, " has no atomic operations; the ",
             "RC backend raises flags with FETCH_AND_ADD");
    max_message_ = port.max_msg_sz;
    receive_depth_ = std::min(receive_depth_, device.max_srq_wr);
  }
  IL_CHECK(send_depth_ >= 2 && receive_depth_ >= 1, "RDMA device ", device_name_, " allows ", send_depth_,
           " send and ", receive_depth_, " receive work requests per queue; the proxy needs 2 and 1");

  port_.port_num = options_.port;
  port_.link_layer = port.link_layer;
  port_.mtu = port.active_mtu;
  port_.lid = port.lid;
  port_.gid_index = 0;
  if (transport_ == IbvTransport::kRc && port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    port_.gid_index = options_.gid_index;
    if (port_.gid_index < 0) {
      IL_CHECK(api_.query_gid_ex != nullptr, "libibverbs is too old to list GID types (rdma-core < 32): set the ",
               "RoCE GID index (IbvOptions::gid_index)");
      std::vector<GidEntry> table;
      for (int i = 0; i < port.gid_tbl_len; ++i) {
        ibv_gid_entry e{};
        if (api_.query_gid_ex(context_, options_.port, i, &e, 0, sizeof e) == 0) table.push_back({i, e.gid, e.gid_type});
      }
      port_.gid_index = choose_gid_index(table);
      IL_CHECK(port_.gid_index >= 0, "port ", int(options_.port), " of ", device_name_, " has no GID: give its ",
               "network interface an IP address");
    }
  } else if (transport_ == IbvTransport::kRc) {
    IL_CHECK(port.lid != 0, "port ", int(options_.port), " of ", device_name_, " has no LID: is a subnet manager ",
             "running on the InfiniBand fabric?");
  }
  rc = api_.query_gid(context_, options_.port, port_.gid_index, &gid_);
  IL_CHECK(rc == 0, "reading GID ", port_.gid_index, " of ", device_name_, " port ", int(options_.port),
           " failed: ", error_text(rc));
  static const uint8_t zero[16] = {};
  IL_CHECK(port.link_layer == IBV_LINK_LAYER_INFINIBAND || std::memcmp(gid_.raw, zero, 16) != 0, "GID ",
           port_.gid_index, " of ", device_name_, " port ", int(options_.port), " is empty");
}

void IbvVerbs::register_memory() {
  pd_ = api_.alloc_pd(context_);
  IL_CHECK(pd_ != nullptr, "allocating a protection domain on ", device_name_, " failed: ", error_text(-1));
  // No IBV_ACCESS_RELAXED_ORDERING: a flag's add must not overtake the bytes it counts on PCIe.
  const int access = heap_access(transport_);
  std::string dmabuf_failure = options_.dmabuf_fd < 0 ? options_.no_dmabuf : "";
  if (options_.dmabuf_fd >= 0) {
    if (api_.reg_dmabuf_mr == nullptr) {
      dmabuf_failure = "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core >= 34)";
    } else {
      heap_mr_ = api_.reg_dmabuf_mr(pd_, options_.dmabuf_offset, options_.heap_bytes, options_.heap_address,
                                    options_.dmabuf_fd, access);
      if (heap_mr_ == nullptr) dmabuf_failure = concat("ibv_reg_dmabuf_mr failed: ", error_text(-1));
      by_dmabuf_ = heap_mr_ != nullptr;
    }
  }
  if (heap_mr_ == nullptr) {  // peer memory (nvidia-peermem) or host memory, by address
    heap_mr_ = api_.reg_mr(pd_, reinterpret_cast<void*>(options_.heap_address), options_.heap_bytes, access);
    const int err = errno;
    IL_CHECK(heap_mr_ != nullptr, "registering the heap (", options_.heap_bytes, " bytes at 0x", std::hex,
             options_.heap_address, std::dec, ") with ", device_name_, " failed: ", dmabuf_failure,
             dmabuf_failure.empty() ? "" : "; then ", "ibv_reg_mr failed: ", std::strerror(err),
             " (GPU memory registers through a dmabuf fd, or by address with the nvidia-peermem module loaded)");
  }
  scratch_mr_ = api_.reg_mr(pd_, scratch_, sizeof scratch_, IBV_ACCESS_LOCAL_WRITE);
  IL_CHECK(scratch_mr_ != nullptr, "registering ", sizeof scratch_, " bytes of host memory with ", device_name_,
           " failed: ", error_text(-1));
}

void IbvVerbs::create_queues() {
  std::vector<int> peers;
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_ && (options_.connect.empty() || options_.connect[r])) peers.push_back(r);
  }
  const int queues = transport_ == IbvTransport::kRc ? static_cast<int>(peers.size()) : 1;
  // Every send queue can fill the send completion queue at once: it must hold them all.
  send_depth_ = std::min(send_depth_, max_cqe_ / std::max(queues, 1));
  receive_depth_ = std::min(receive_depth_, max_cqe_);
  IL_CHECK(send_depth_ >= 2, "RDMA device ", device_name_, " has completion queues of ", max_cqe_,
           " entries, too few for ", queues, " queue pairs");
  send_cq_ = api_.create_cq(context_, send_depth_ * std::max(queues, 1), nullptr, nullptr, 0);
  IL_CHECK(send_cq_ != nullptr, "creating a completion queue on ", device_name_, " failed: ", error_text(-1));
  recv_cq_ = api_.create_cq(context_, receive_depth_, nullptr, nullptr, 0);
  IL_CHECK(recv_cq_ != nullptr, "creating a completion queue on ", device_name_, " failed: ", error_text(-1));
  std::random_device random;

  if (transport_ == IbvTransport::kRc) {
    ibv_srq_init_attr srq{};
    srq.attr.max_wr = receive_depth_;
    srq.attr.max_sge = 1;
    srq_ = api_.create_srq(pd_, &srq);
    IL_CHECK(srq_ != nullptr, "creating a shared receive queue on ", device_name_, " failed: ", error_text(-1));
    for (int peer : peers) {
      ibv_qp_init_attr init{};
      init.send_cq = send_cq_;
      init.recv_cq = recv_cq_;
      init.srq = srq_;
      init.qp_type = IBV_QPT_RC;
      init.sq_sig_all = 0;  // only the work the backend asks to signal completes visibly
      init.cap.max_send_wr = send_depth_;
      init.cap.max_send_sge = 1;
      ibv_qp* qp = api_.create_qp(pd_, &init);
      IL_CHECK(qp != nullptr, "creating the queue pair for rank ", peer, " on ", device_name_, " failed: ",
               error_text(-1));
      remotes_[peer].queue = static_cast<int>(queues_.size());
      queue_of_qpn_[qp->qp_num] = remotes_[peer].queue;
      queues_.push_back(SendQueue{qp, {}});
      queue_peer_.push_back(peer);
      psn_.push_back(random() & kPsnMask);
      modify(qp, rc_to_init(port_.port_num), "INIT", peer);
    }
    return;
  }

  // SRD: one queue pair for all peers, ready once it is up (datagrams need no connection).
  ibv_qp_init_attr_ex init{};
  init.qp_type = IBV_QPT_DRIVER;
  init.send_cq = send_cq_;
  init.recv_cq = recv_cq_;
  init.cap.max_send_wr = send_depth_;
  init.cap.max_recv_wr = receive_depth_;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.pd = pd_;
  init.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  init.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  efadv_qp_init_attr efa{};
  efa.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD;
  ibv_qp* qp = api_.efa_create_qp_ex(context_, &init, &efa, sizeof efa);
  IL_CHECK(qp != nullptr, "creating an SRD queue pair on ", device_name_, " failed: ", error_text(-1));
  queue_of_qpn_[qp->qp_num] = 0;
  queues_.push_back(SendQueue{qp, {}});
  queue_peer_.push_back(-1);
  psn_.push_back(random() & kPsnMask);
  modify(qp, srd_to_init(port_.port_num, kSrdQkey), "INIT", -1);
  modify(qp, srd_to_rtr(), "RTR", -1);
  modify(qp, srd_to_rts(psn_[0], srd_rnr_retry_), "RTS", -1);
  for (int peer : peers) remotes_[peer].queue = 0;
}

std::string IbvVerbs::local_blob() const {
  IbvWireHeader h{};
  h.transport = static_cast<uint16_t>(transport_);
  h.rank = rank_;
  std::memcpy(h.gid, gid_.raw, sizeof h.gid);
  h.lid = port_.lid;
  h.link_layer = port_.link_layer;
  h.mtu = static_cast<uint8_t>(port_.mtu);
  h.srd_qpn = transport_ == IbvTransport::kSrd ? queues_[0].qp->qp_num : 0;
  h.qkey = transport_ == IbvTransport::kSrd ? kSrdQkey : 0;
  h.rkey = heap_mr_->rkey;
  h.heap_addr = options_.heap_address;
  h.heap_bytes = options_.heap_bytes;
  std::vector<IbvWireEntry> entries(world_size_, IbvWireEntry{0, 0});
  for (int r = 0; r < world_size_; ++r) {
    const int q = remotes_[r].queue;
    if (q >= 0) entries[r] = IbvWireEntry{queues_[q].qp->qp_num, psn_[q]};
  }
  return encode_ibv_blob(h, entries);
}

void IbvVerbs::connect(const std::vector<IbvRankInfo>& ranks) {
  for (int r = 0; r < world_size_; ++r) {
    Remote& remote = remotes_[r];
    if (remote.queue < 0) continue;
    const IbvWireHeader& h = ranks[r].header;
    remote.heap_addr = h.heap_addr;
    remote.heap_bytes = h.heap_bytes;
    remote.rkey = h.rkey;
    if (transport_ == IbvTransport::kRc) {
      IL_CHECK(h.link_layer == port_.link_layer, "rank ", r, "'s port is ", link_layer_name(h.link_layer),
               " and this rank's (", device_name_, ") ", link_layer_name(port_.link_layer), ": they cannot connect");
      const IbvWireEntry& theirs = ranks[r].entries[rank_];
      ibv_qp* qp = queues_[remote.queue].qp;
      modify(qp, rc_to_rtr(port_, h, theirs.qpn, theirs.psn), "RTR", r);
      modify(qp, rc_to_rts(psn_[remote.queue]), "RTS", r);
    } else {
      remote.qpn = h.srd_qpn;
      remote.qkey = h.qkey;
      ibv_ah_attr address = srd_address(port_.port_num, h.gid);
      remote.ah = api_.create_ah(pd_, &address);
      IL_CHECK(remote.ah != nullptr, "creating the address handle for rank ", r, " on ", device_name_, " failed: ",
               error_text(-1));
      efadv_ah_attr ah{};
      const int rc = api_.efa_query_ah(remote.ah, &ah, sizeof ah);
      IL_CHECK(rc == 0, "reading the address handle number for rank ", r, " failed: ", error_text(rc));
      // A write's receive completion names its sender by our address handle for it and its QP.
      srd_sender_[uint64_t{ah.ahn} << 32 | h.srd_qpn] = r;
    }
  }
}

void IbvVerbs::modify(ibv_qp* qp, const QpTransition& t, const char* state, int peer) {
  QpTransition copy = t;
  const int rc = api_.modify_qp(qp, &copy.attr, copy.mask);
  IL_CHECK(rc == 0, "moving the queue pair", peer >= 0 ? concat(" for rank ", peer) : std::string(), " on ",
           device_name_, " to ", state, " failed: ", error_text(rc));
}

void IbvVerbs::release() {
  for (Remote& r : remotes_) {
    if (r.ah) api_.destroy_ah(r.ah);
    r.ah = nullptr;
  }
  for (SendQueue& q : queues_) {
    if (q.qp) api_.destroy_qp(q.qp);
  }
  queues_.clear();
  if (srq_) api_.destroy_srq(srq_);
  if (send_cq_) api_.destroy_cq(send_cq_);
  if (recv_cq_) api_.destroy_cq(recv_cq_);
  if (heap_mr_) api_.dereg_mr(heap_mr_);
  if (scratch_mr_) api_.dereg_mr(scratch_mr_);
  if (pd_) api_.dealloc_pd(pd_);
  if (context_) api_.close_device(context_);
  srq_ = nullptr;
  send_cq_ = recv_cq_ = nullptr;
  heap_mr_ = scratch_mr_ = nullptr;
  pd_ = nullptr;
  context_ = nullptr;
}

uint32_t IbvVerbs::rkey() const { return heap_mr_ ? heap_mr_->rkey : 0; }

// ---- Data path ---------------------------------------------------------------------------------

int IbvVerbs::send_room(int peer) const {
  // A peer that cannot be reached gets room, so that post() is called and reports it.
  if (peer < 0 || peer >= world_size_ || remotes_[peer].queue < 0) return send_depth_;
  return send_depth_ - static_cast<int>(queues_[remotes_[peer].queue].pending.size());
}

void IbvVerbs::fail_locally(int peer, VerbsCompletion::Kind kind, uint64_t id, const std::string& why) {
  local_failures_.push_back(VerbsCompletion{kind, id, peer, 0, false, why});
}

void IbvVerbs::post(const VerbsWork& w) {
  if (w.peer < 0 || w.peer >= world_size_ || remotes_[w.peer].queue < 0) {
    return fail_locally(w.peer, VerbsCompletion::kSend, w.id,
                        concat("rank ", w.peer, " is not connected over RDMA (this rank, a rank on its node, or ",
                               "outside the group of ", world_size_, ")"));
  }
  const Remote& remote = remotes_[w.peer];
  SendQueue& queue = queues_[remote.queue];
  const bool add = w.op == VerbsWork::kFetchAdd;
  const uint64_t remote_bytes = add ? 8 : w.bytes;
  if (!add && (w.local_offset > options_.heap_bytes || w.bytes > options_.heap_bytes - w.local_offset)) {
    return fail_locally(w.peer, VerbsCompletion::kSend, w.id,
                        concat("a write of ", w.bytes, " bytes from offset ", w.local_offset,
                               " reads past this rank's heap of ", options_.heap_bytes, " bytes"));
  }
  if (w.remote_offset > remote.heap_bytes || remote_bytes > remote.heap_bytes - w.remote_offset ||
      (add && w.remote_offset % 8 != 0)) {
    return fail_locally(w.peer, VerbsCompletion::kSend, w.id,
                        concat(add ? "an add to the flag at offset " : "a write to offset ", w.remote_offset,
                               " is outside rank ", w.peer, "'s heap of ", remote.heap_bytes, " bytes",
                               add ? " or not 8-byte aligned" : ""));
  }
  if (!add && w.bytes > max_message_) {
    return fail_locally(w.peer, VerbsCompletion::kSend, w.id,
                        concat("a write of ", w.bytes, " bytes exceeds the largest ", device_name_, " carries (",
                               max_message_, ")"));
  }
  if (static_cast<int>(queue.pending.size()) >= send_depth_) {
    return fail_locally(w.peer, VerbsCompletion::kSend, w.id, "posted to a full send queue");
  }

  const uint64_t wr_id = next_wr_id_++;
  const ibv_sge payload{options_.heap_address + w.local_offset, static_cast<uint32_t>(w.bytes), heap_mr_->lkey};
  int rc;
  if (transport_ == IbvTransport::kSrd) {
    if (add) {
      return fail_locally(w.peer, VerbsCompletion::kSend, w.id,
                          "EFA has no atomics: the SRD backend sends flags as immediate data");
    }
    // Always signaled (EFA refuses anything else); Pending::signaled decides whether it is reported.
    const SrdWrite write{wr_id, w.op == VerbsWork::kWriteWithImm, w.imm, payload, remote.rkey,
                         remote.heap_addr + w.remote_offset, remote.ah, remote.qpn, remote.qkey};
    rc = api_.post_srd_write(queue.qp, write);
  } else {
    ibv_sge sge = payload;
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.send_flags = (w.signaled ? IBV_SEND_SIGNALED : 0) | (w.fence ? IBV_SEND_FENCE : 0);
    if (add) {
      sge = ibv_sge{reinterpret_cast<uintptr_t>(&scratch_[0]), 8, scratch_mr_->lkey};  // the old value lands here
      wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
      wr.wr.atomic.remote_addr = remote.heap_addr + w.remote_offset;
      wr.wr.atomic.compare_add = w.add;
      wr.wr.atomic.rkey = remote.rkey;
    } else {
      wr.opcode = w.op == VerbsWork::kWriteWithImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      if (w.op == VerbsWork::kWriteWithImm) wr.imm_data = htobe32(w.imm);
      wr.wr.rdma.remote_addr = remote.heap_addr + w.remote_offset;
      wr.wr.rdma.rkey = remote.rkey;
    }
    wr.sg_list = sge.length > 0 ? &sge : nullptr;
    wr.num_sge = sge.length > 0 ? 1 : 0;
    rc = api_.post_send(queue.qp, &wr, &bad);
  }
  if (rc != 0) {
    return fail_locally(w.peer, VerbsCompletion::kSend, w.id,
                        concat("posting to rank ", w.peer, " on ", device_name_, " failed: ", error_text(rc)));
  }
  queue.pending.push_back(Pending{wr_id, w.id, w.peer, w.signaled});
}

void IbvVerbs::post_receives(int count) {
  for (int i = 0; i < count; ++i) {
    if (receives_posted_ >= receive_depth_) {
      return fail_locally(-1, VerbsCompletion::kReceive, 0,
                          concat("more receive slots asked for than the ", receive_depth_, " there are"));
    }
    // A write with immediate data puts nothing in the slot's buffer, but EFA needs one all the same.
    ibv_sge sge{reinterpret_cast<uintptr_t>(&scratch_[1]), 8, scratch_mr_->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    const int rc = transport_ == IbvTransport::kRc ? api_.post_srq_recv(srq_, &wr, &bad)
                                                   : api_.post_recv(queues_[0].qp, &wr, &bad);
    if (rc != 0) {
      return fail_locally(-1, VerbsCompletion::kReceive, 0,
                          concat("posting a receive slot on ", device_name_, " failed: ", error_text(rc)));
    }
    ++receives_posted_;
  }
}

std::string IbvVerbs::status_text(const ibv_wc& wc) const {
  return concat(api_.wc_status_str(wc.status), ", status ", int(wc.status), ", vendor error 0x", std::hex,
                wc.vendor_err);
}

int IbvVerbs::take_send(const ibv_wc& wc, VerbsCompletion* out) {
  const auto queue = queue_of_qpn_.find(wc.qp_num);
  if (queue == queue_of_qpn_.end()) {
    *out = VerbsCompletion{VerbsCompletion::kSend, 0, -1, 0, false,
                           concat("a completion for unknown queue pair ", wc.qp_num, " (", status_text(wc), ")")};
    return 1;
  }
  std::deque<Pending>& pending = queues_[queue->second].pending;
  Pending done{};
  bool found = false;
  if (transport_ == IbvTransport::kRc) {
    // A queue pair completes in order: every request up to this one is done (the unsignaled ones
    // silently), and gives back its slot.
    while (!pending.empty() && pending.front().wr_id <= wc.wr_id) {
      done = pending.front();
      found = done.wr_id == wc.wr_id;
      pending.pop_front();
    }
  } else {
    // SRD completes in any order.
    const auto it = std::find_if(pending.begin(), pending.end(), [&](const Pending& p) { return p.wr_id == wc.wr_id; });
    if (it != pending.end()) {
      done = *it;
      found = true;
      pending.erase(it);
    }
  }
  if (!found) {
    *out = VerbsCompletion{VerbsCompletion::kSend, 0, queue_peer_[queue->second], 0, false,
                           concat("a completion for unknown work request ", wc.wr_id, " (", status_text(wc), ")")};
    return 1;
  }
  if (wc.status == IBV_WC_SUCCESS) {
    if (!done.signaled) return 0;
    *out = VerbsCompletion{VerbsCompletion::kSend, done.id, done.peer, 0, true, ""};
    return 1;
  }
  *out = VerbsCompletion{VerbsCompletion::kSend, done.id, done.peer, 0, false, status_text(wc)};
  return 1;
}

bool IbvVerbs::take_receive(const ibv_wc& wc, VerbsCompletion* out) {
  if (receives_posted_ > 0) --receives_posted_;
  int peer = -1;
  if (transport_ == IbvTransport::kRc) {
    const auto queue = queue_of_qpn_.find(wc.qp_num);
    if (queue != queue_of_qpn_.end()) peer = queue_peer_[queue->second];
  } else {
    const auto sender = srd_sender_.find(uint64_t{wc.slid} << 32 | wc.src_qp);
    if (sender != srd_sender_.end()) peer = sender->second;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    *out = VerbsCompletion{VerbsCompletion::kReceive, 0, peer, 0, false, status_text(wc)};
  } else if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM)) {
    *out = VerbsCompletion{VerbsCompletion::kReceive, 0, peer, 0, false,
                           concat("a receive that is not a write with immediate data (opcode ", int(wc.opcode), ")")};
  } else if (peer < 0) {
    *out = VerbsCompletion{VerbsCompletion::kReceive, 0, peer, 0, false,
                           concat("a write from an unknown sender (address handle ", wc.slid, ", queue pair ",
                                  wc.src_qp, ")")};
  } else {
    *out = VerbsCompletion{VerbsCompletion::kReceive, 0, peer, be32toh(wc.imm_data), true, ""};
  }
  return true;
}

int IbvVerbs::poll(VerbsCompletion* out, int max) {
  int n = 0;
  while (n < max && !local_failures_.empty()) {
    out[n++] = local_failures_.front();
    local_failures_.pop_front();
  }
  if (n >= max || send_cq_ == nullptr) return n;
  if (static_cast<int>(wc_.size()) < max) wc_.resize(max);
  int got = api_.poll_cq(send_cq_, max - n, wc_.data());
  if (got < 0) out[n++] = VerbsCompletion{VerbsCompletion::kSend, 0, -1, 0, false, "polling the send completion queue failed"};
  for (int i = 0; i < got; ++i) n += take_send(wc_[i], out + n);
  if (n >= max) return n;
  got = api_.poll_cq(recv_cq_, max - n, wc_.data());
  if (got < 0) out[n++] = VerbsCompletion{VerbsCompletion::kReceive, 0, -1, 0, false, "polling the receive completion queue failed"};
  for (int i = 0; i < got; ++i) n += take_receive(wc_[i], out + n) ? 1 : 0;
  return n;
}

// ---- Opening over the loaded library -----------------------------------------------------------

std::unique_ptr<IbvVerbs> open_ibv_verbs(const IbvOptions& options, int rank, int world_size, AllGather all_gather) {
  const IbvApi* api = nullptr;
  try {
    api = &VerbsLibrary::load().api();
  } catch (const Error& e) {
    // Take part in the exchange all the same, so that every rank raises instead of waiting here.
    decode_ibv_blobs(all_gather(encode_ibv_failure(rank, world_size, e.what())), world_size);
    throw;  // not reached: this rank's own blob reports the failure
  }
  return std::make_unique<IbvVerbs>(*api, options, rank, world_size, std::move(all_gather));
}

std::unique_ptr<IbvVerbs> open_ibv_verbs(const IbvOptions& options, Bootstrap& bootstrap) {
  return open_ibv_verbs(options, bootstrap.rank(), bootstrap.world_size(),
                        [&bootstrap](const std::string& blob) { return bootstrap.all_gather(blob); });
}

}  // namespace interlace
