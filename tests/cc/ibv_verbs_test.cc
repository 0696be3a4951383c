// The real Verbs (ibv_verbs.h) without an RDMA device:
//   - the connection blob: round trip, and every way a blob can be wrong, each error naming the rank;
//   - the queue pair attributes of each state transition, and the GID choice (pure functions);
//   - connection setup and the data path against a fake libibverbs function table: the order of the
//     calls, what each is given, completions mapped back to peers, every failure path raising an
//     error that names what is missing and releasing what was made;
//   - the real VerbsLibrary on this machine, which has no RDMA devices: a clean error, told to the
//     other ranks through the exchange.
// Nothing here has run on RDMA hardware.
#include "interlace/transport/ibv_verbs.h"

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/runtime/bootstrap.h"
#include "interlace/runtime/socket.h"
#include "interlace/transport/verbs_backend.h"
#include "interlace/transport/verbs_library.h"
#include "tests/cc/error_of.h"

namespace interlace {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// ---- The blob ----------------------------------------------------------------------------------

constexpr uint64_t kHeapAddress = 0x7f0000000000, kHeapBytes = 1 << 20;

// Rank r's blob as a peer would send it: a queue pair to every other rank (or the SRD one).
std::string peer_blob(int r, int world, IbvTransport t = IbvTransport::kRc,
                      uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND) {
  IbvWireHeader h{};
  h.transport = static_cast<uint16_t>(t);
  h.rank = r;
  h.gid[0] = 0xfe;
  h.gid[1] = 0x80;
  h.gid[15] = static_cast<uint8_t>(r);
  h.lid = static_cast<uint16_t>(10 + r);
  h.link_layer = link_layer;
  h.mtu = IBV_MTU_2048;
  h.srd_qpn = t == IbvTransport::kSrd ? 900 + r : 0;
  h.qkey = t == IbvTransport::kSrd ? kSrdQkey : 0;
  h.rkey = 0x500 + r;
  h.heap_addr = 0x100000ull * (r + 1);
  h.heap_bytes = kHeapBytes;
  std::vector<IbvWireEntry> entries(world, IbvWireEntry{0, 0});
  for (int j = 0; j < world; ++j) {
    if (j != r) entries[j] = IbvWireEntry{t == IbvTransport::kSrd ? 900u + r : 700u + 10 * r + j, 40u + 10 * r + j};
  }
  return encode_ibv_blob(h, entries);
}

std::vector<std::string> blobs(int world) {
  std::vector<std::string> all;
  for (int r = 0; r < world; ++r) all.push_back(peer_blob(r, world));
  return all;
}

IbvWireHeader& header_of(std::string& blob) { return *reinterpret_cast<IbvWireHeader*>(blob.data()); }

TEST(IbvBlob, RoundTrips) {
  const std::vector<IbvRankInfo> ranks = decode_ibv_blobs(blobs(3), 3);
  ASSERT_EQ(ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const IbvWireHeader& h = ranks[r].header;
    EXPECT_EQ(h.rank, r);
    EXPECT_EQ(h.world_size, 3);
    EXPECT_EQ(h.lid, 10 + r);
    EXPECT_EQ(h.gid[15], r);
    EXPECT_EQ(h.rkey, 0x500u + r);
    EXPECT_EQ(h.heap_addr, 0x100000ull * (r + 1));
    EXPECT_EQ(h.heap_bytes, kHeapBytes);
    EXPECT_EQ(h.mtu, IBV_MTU_2048);
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(ranks[r].entries[j].qpn, j == r ? 0u : 700u + 10 * r + j);
      EXPECT_EQ(ranks[r].entries[j].psn, j == r ? 0u : 40u + 10 * r + j);
    }
  }
}

TEST(IbvBlob, EachWrongBlobIsNamedByItsRank) {
  auto broken = [](auto change) {
    std::vector<std::string> all = blobs(3);
    change(all[2]);
    return error_of([&] { decode_ibv_blobs(all, 3); });
  };
  EXPECT_HAS(broken([](std::string& b) { b.resize(100); }), "rank 2's connection info is 100 bytes, shorter than");
  EXPECT_HAS(broken([](std::string& b) { b.resize(b.size() - 1); }), "rank 2's connection info is 351 bytes; a group of 3 needs 352");
  EXPECT_HAS(broken([](std::string& b) { b += "x"; }), "rank 2's connection info is 353 bytes");
  EXPECT_HAS(broken([](std::string& b) { b[0] ^= 1; }), "rank 2's connection info does not start with interlace's magic");
  EXPECT_HAS(broken([](std::string& b) { header_of(b).version = 7; }), "rank 2's connection info has wire version 7, this rank 1");
  EXPECT_HAS(broken([](std::string& b) { header_of(b).entry_bytes = 16; }), "16-byte entries");
  EXPECT_HAS(broken([](std::string& b) { header_of(b).rank = 1; }), "rank 2's connection info says it comes from rank 1");
  EXPECT_HAS(broken([](std::string& b) { header_of(b).transport = 9; }), "names unknown transport 9");
  EXPECT_HAS(broken([](std::string& b) { b = peer_blob(2, 4); }), "is for a group of 4 ranks, this one has 3");
  EXPECT_HAS(broken([](std::string& b) { b = peer_blob(2, 3, IbvTransport::kSrd); }),
             "rank 2 uses SRD (EFA) and rank 0 RC (InfiniBand / RoCE)");
  EXPECT_HAS(broken([](std::string& b) { reinterpret_cast<IbvWireEntry*>(b.data() + sizeof(IbvWireHeader))[2].qpn = 5; }),
             "rank 2's connection info names a queue pair to itself");
  EXPECT_HAS(broken([](std::string& b) { reinterpret_cast<IbvWireEntry*>(b.data() + sizeof(IbvWireHeader))[0].qpn = 0; }),
             "rank 0 connects to rank 2 but not the other way round");
  EXPECT_HAS(broken([](std::string& b) { b = encode_ibv_failure(2, 3, "interlace: no RDMA device named mlx5_9"); }),
             "RDMA setup failed on rank 2: no RDMA device named mlx5_9");
  EXPECT_HAS(broken([](std::string& b) { b = encode_ibv_failure(2, 3, std::string(1000, 'x')); }),
             "RDMA setup failed on rank 2: xxx");  // cut to fit
  EXPECT_HAS(broken([](std::string& b) {
               b = encode_ibv_failure(2, 3, "why");
               std::memset(header_of(b).failure, 'x', sizeof header_of(b).failure);
             }),
             "rank 2's connection info reports a failure it does not end");
  EXPECT_HAS(error_of([] { decode_ibv_blobs(blobs(2), 3); }), "the exchange returned 2 blobs for a group of 3");
}

TEST(IbvBlob, TheFirstBadRankIsReportedSoEveryRankRaisesTheSame) {
  std::vector<std::string> all = blobs(4);
  all[3] = encode_ibv_failure(3, 4, "three");
  all[1] = encode_ibv_failure(1, 4, "one");
  EXPECT_HAS(error_of([&] { decode_ibv_blobs(all, 4); }), "RDMA setup failed on rank 1: one");
}

// ---- Queue pair attributes ---------------------------------------------------------------------

TEST(IbvAttributes, RcInitGrantsWritesAndAtomics) {
  const QpTransition t = rc_to_init(2);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(t.attr.port_num, 2);
  EXPECT_EQ(t.attr.pkey_index, 0);
  EXPECT_EQ(t.attr.qp_access_flags, unsigned(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

TEST(IbvAttributes, RcReadyToReceiveOnInfiniBandRoutesByLid) {
  std::string blob = peer_blob(3, 4);
  const IbvPort local{1, IBV_LINK_LAYER_INFINIBAND, IBV_MTU_4096, 5, 0};
  const QpTransition t = rc_to_rtr(local, header_of(blob), 0x123, 0x1abcdef);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(t.attr.path_mtu, IBV_MTU_2048);  // the smaller of the two ports'
  EXPECT_EQ(t.attr.dest_qp_num, 0x123u);
  EXPECT_EQ(t.attr.rq_psn, 0xabcdefu);  // 24 bits
  EXPECT_EQ(t.attr.max_dest_rd_atomic, kRcMaxAtomics);
  EXPECT_EQ(t.attr.min_rnr_timer, kRcMinRnrTimer);
  EXPECT_EQ(t.attr.ah_attr.is_global, 0);
  EXPECT_EQ(t.attr.ah_attr.dlid, 13);
  EXPECT_EQ(t.attr.ah_attr.port_num, 1);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

TEST(IbvAttributes, RcReadyToReceiveOnRoceRoutesByGid) {
  std::string blob = peer_blob(3, 4, IbvTransport::kRc, IBV_LINK_LAYER_ETHERNET);
  const IbvPort local{1, IBV_LINK_LAYER_ETHERNET, IBV_MTU_1024, 0, 3};
  const QpTransition t = rc_to_rtr(local, header_of(blob), 7, 8);
  EXPECT_EQ(t.attr.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(t.attr.ah_attr.is_global, 1);
  EXPECT_EQ(std::memcmp(t.attr.ah_attr.grh.dgid.raw, header_of(blob).gid, 16), 0);
  EXPECT_EQ(t.attr.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(t.attr.ah_attr.grh.hop_limit, kRoceHopLimit);
  EXPECT_EQ(t.attr.ah_attr.dlid, 0);
}

TEST(IbvAttributes, RcReadyToSendHasTheNamedTimeoutsAndRetries) {
  const QpTransition t = rc_to_rts(0x2000001);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(t.attr.sq_psn, 1u);
  EXPECT_EQ(t.attr.timeout, 20);
  EXPECT_EQ(t.attr.retry_cnt, 7);
  EXPECT_EQ(t.attr.rnr_retry, 7);
  EXPECT_EQ(t.attr.max_rd_atomic, 1);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_MAX_QP_RD_ATOMIC);
}

TEST(IbvAttributes, SrdTransitionsAndAddress) {
  const QpTransition init = srd_to_init(1, kSrdQkey);
  EXPECT_EQ(init.attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(init.attr.qkey, kSrdQkey);
  EXPECT_EQ(init.mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  EXPECT_EQ(srd_to_rtr().attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(srd_to_rtr().mask, IBV_QP_STATE);
  const QpTransition plain = srd_to_rts(5, false), retrying = srd_to_rts(5, true);
  EXPECT_EQ(plain.attr.sq_psn, 5u);
  EXPECT_EQ(plain.mask, IBV_QP_STATE | IBV_QP_SQ_PSN);
  EXPECT_EQ(retrying.mask, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RNR_RETRY);
  EXPECT_EQ(retrying.attr.rnr_retry, 7);
  uint8_t gid[16] = {};
  gid[15] = 9;
  const ibv_ah_attr a = srd_address(1, gid);
  EXPECT_EQ(a.is_global, 1);
  EXPECT_EQ(a.port_num, 1);
  EXPECT_EQ(a.grh.dgid.raw[15], 9);
}

TEST(IbvAttributes, HeapAccessAndPathMtu) {
  EXPECT_TRUE(heap_access(IbvTransport::kRc) & IBV_ACCESS_REMOTE_ATOMIC);
  EXPECT_FALSE(heap_access(IbvTransport::kSrd) & IBV_ACCESS_REMOTE_ATOMIC);  // EFA has no atomics
  EXPECT_TRUE(heap_access(IbvTransport::kSrd) & IBV_ACCESS_REMOTE_WRITE);
  EXPECT_EQ(path_mtu(IBV_MTU_4096, IBV_MTU_1024), IBV_MTU_1024);
  EXPECT_EQ(path_mtu(IBV_MTU_512, IBV_MTU_4096), IBV_MTU_512);
}

ibv_gid gid_of(std::initializer_list<int> bytes) {
  ibv_gid g{};
  int i = 0;
  for (int b : bytes) g.raw[i++] = static_cast<uint8_t>(b);
  return g;
}

TEST(IbvAttributes, ChoosesARoutableRoceV2Gid) {
  const ibv_gid link_local = gid_of({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8});
  const ibv_gid ipv4 = gid_of({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1});
  const ibv_gid global6 = gid_of({0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
  EXPECT_EQ(choose_gid_index({{0, link_local, IBV_GID_TYPE_ROCE_V1},
                              {1, link_local, IBV_GID_TYPE_ROCE_V2},
                              {2, ipv4, IBV_GID_TYPE_ROCE_V1},
                              {3, ipv4, IBV_GID_TYPE_ROCE_V2}}),
            3);
  EXPECT_EQ(choose_gid_index({{0, link_local, IBV_GID_TYPE_ROCE_V2}, {4, global6, IBV_GID_TYPE_ROCE_V2}}), 4);
  EXPECT_EQ(choose_gid_index({{2, link_local, IBV_GID_TYPE_ROCE_V1}, {5, ipv4, IBV_GID_TYPE_ROCE_V1}}), 2);
  EXPECT_EQ(choose_gid_index({}), -1);
}

// ---- A fake libibverbs -------------------------------------------------------------------------

struct Fake {
  // The host.
  std::vector<std::string> names = {"mlx5_0", "mlx5_1"};
  bool efa = false;
  uint32_t efa_caps = (1 << 3) | EFADV_DEVICE_ATTR_CAPS_RNR_RETRY;  // RDMA write, RNR retry
  ibv_port_state port_state = IBV_PORT_ACTIVE;
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  std::vector<ibv_gid_entry> gids;
  bool has_reg_dmabuf = true;
  int dmabuf_errno = 0;  // the heap's ibv_reg_dmabuf_mr fails with it
  int reg_mr_errno = 0;  // the heap's ibv_reg_mr fails with it
  std::string fail_modify;  // a transition that fails: "<qpn> <state>"
  int post_send_rc = 0;

  // What happened.
  std::vector<ibv_device> devices = std::vector<ibv_device>(4);
  std::vector<std::string> log;
  std::map<uint32_t, std::vector<QpTransition>> transitions;  // by QP number
  std::vector<ibv_qp*> qps;
  std::vector<ibv_cq*> cqs;  // send, receive
  std::map<ibv_ah*, std::pair<uint16_t, ibv_ah_attr>> ahs;
  ibv_qp_init_attr rc_init{};
  ibv_qp_init_attr_ex srd_init{};
  int heap_access = 0;
  uint64_t dmabuf_iova = 0;
  int dmabuf_fd = -1;
  std::vector<ibv_send_wr> sends;
  std::vector<ibv_sge> send_sges;  // each send's sge (or a zeroed one)
  std::vector<SrdWrite> srd_writes;
  int receives = 0;
  std::map<ibv_cq*, std::deque<ibv_wc>> completions;  // handed out by poll_cq
  int live = 0;  // objects made and not yet destroyed
  uint32_t next_qpn = 0x100, next_key = 0x1000;
  uint16_t next_ahn = 50;
};
Fake* fake = nullptr;

template <class T>
T* make(const char* what) {
  fake->log.push_back(what);
  ++fake->live;
  return new T{};
}
template <class T>
int destroy(T* p, const char* what) {
  fake->log.push_back(what);
  --fake->live;
  delete p;
  return 0;
}

const char* state_name(ibv_qp_state s) { return s == IBV_QPS_INIT ? "INIT" : s == IBV_QPS_RTR ? "RTR" : "RTS"; }

IbvApi fake_api() {
  IbvApi a{};
  a.get_device_list = [](int* n) {
    *n = static_cast<int>(fake->names.size());
    auto** list = new ibv_device*[fake->names.size() + 1];
    for (size_t i = 0; i < fake->names.size(); ++i) list[i] = &fake->devices[i];
    list[fake->names.size()] = nullptr;
    return list;
  };
  a.free_device_list = [](ibv_device** list) { delete[] list; };
  a.get_device_name = [](ibv_device* d) { return fake->names[d - fake->devices.data()].c_str(); };
  a.open_device = [](ibv_device* d) {
    auto* c = make<ibv_context>("open_device");
    fake->log.back() += " " + fake->names[d - fake->devices.data()];
    return c;
  };
  a.close_device = [](ibv_context* c) { return destroy(c, "close_device"); };
  a.query_device = [](ibv_context*, ibv_device_attr* d) {
    *d = ibv_device_attr{};
    d->phys_port_cnt = 1;
    d->max_qp_wr = 1024;
    d->max_srq_wr = 1024;
    d->max_cqe = 4096;
    d->atomic_cap = fake->efa ? IBV_ATOMIC_NONE : IBV_ATOMIC_HCA;
    return 0;
  };
  a.query_port = [](ibv_context*, uint8_t, ibv_port_attr* p) {
    *p = ibv_port_attr{};
    p->state = fake->port_state;
    p->link_layer = fake->link_layer;
    p->lid = fake->link_layer == IBV_LINK_LAYER_INFINIBAND ? 21 : 0;
    p->active_mtu = IBV_MTU_4096;
    p->max_msg_sz = 1u << 30;
    p->gid_tbl_len = static_cast<int>(fake->gids.size());
    return 0;
  };
  a.query_gid = [](ibv_context*, uint8_t, int index, ibv_gid* gid) {
    if (index < static_cast<int>(fake->gids.size())) {
      *gid = fake->gids[index].gid;
    } else {
      *gid = ibv_gid{};
      gid->raw[0] = 0xfe;
      gid->raw[15] = static_cast<uint8_t>(index + 1);
    }
    return 0;
  };
  a.query_gid_ex = [](ibv_context*, uint32_t, uint32_t index, ibv_gid_entry* e, uint32_t, size_t) {
    if (index >= fake->gids.size()) return ENODATA;
    *e = fake->gids[index];
    return 0;
  };
  a.alloc_pd = [](ibv_context*) { return make<ibv_pd>("alloc_pd"); };
  a.dealloc_pd = [](ibv_pd* p) { return destroy(p, "dealloc_pd"); };
  a.reg_mr = [](ibv_pd*, void* addr, size_t length, int access) -> ibv_mr* {
    const bool heap = length == kHeapBytes;
    if (heap && fake->reg_mr_errno) {
      fake->log.push_back("reg_mr (refused)");
      errno = fake->reg_mr_errno;
      return nullptr;
    }
    auto* mr = make<ibv_mr>(heap ? "reg_mr heap" : "reg_mr scratch");
    mr->addr = addr;
    mr->length = length;
    mr->lkey = fake->next_key++;
    mr->rkey = fake->next_key++;
    if (heap) fake->heap_access = access;
    return mr;
  };
  a.reg_dmabuf_mr = [](ibv_pd*, uint64_t, size_t, uint64_t iova, int fd, int access) -> ibv_mr* {
    if (fake->dmabuf_errno) {
      fake->log.push_back("reg_dmabuf_mr (refused)");
      errno = fake->dmabuf_errno;
      return nullptr;
    }
    auto* mr = make<ibv_mr>("reg_dmabuf_mr heap");
    mr->lkey = fake->next_key++;
    mr->rkey = fake->next_key++;
    fake->dmabuf_iova = iova;
    fake->dmabuf_fd = fd;
    fake->heap_access = access;
    return mr;
  };
  a.dereg_mr = [](ibv_mr* mr) { return destroy(mr, "dereg_mr"); };
  a.create_cq = [](ibv_context*, int, void*, ibv_comp_channel*, int) {
    fake->cqs.push_back(make<ibv_cq>("create_cq"));
    return fake->cqs.back();
  };
  a.destroy_cq = [](ibv_cq* cq) { return destroy(cq, "destroy_cq"); };
  a.create_srq = [](ibv_pd*, ibv_srq_init_attr*) { return make<ibv_srq>("create_srq"); };
  a.destroy_srq = [](ibv_srq* srq) { return destroy(srq, "destroy_srq"); };
  a.create_qp = [](ibv_pd*, ibv_qp_init_attr* init) {
    auto* qp = make<ibv_qp>("create_qp");
    qp->qp_num = fake->next_qpn++;
    fake->rc_init = *init;
    fake->qps.push_back(qp);
    return qp;
  };
  a.efa_create_qp_ex = [](ibv_context*, ibv_qp_init_attr_ex* init, efadv_qp_init_attr* efa, uint32_t) -> ibv_qp* {
    if (efa->driver_qp_type != EFADV_QP_DRIVER_TYPE_SRD) return nullptr;
    auto* qp = make<ibv_qp>("efa_create_qp_ex");
    qp->qp_num = fake->next_qpn++;
    fake->srd_init = *init;
    fake->qps.push_back(qp);
    return qp;
  };
  a.modify_qp = [](ibv_qp* qp, ibv_qp_attr* attr, int mask) {
    const std::string what = std::to_string(qp->qp_num) + " " + state_name(attr->qp_state);
    fake->log.push_back("modify_qp " + what);
    fake->transitions[qp->qp_num].push_back(QpTransition{*attr, mask});
    return what == fake->fail_modify ? EINVAL : 0;
  };
  a.destroy_qp = [](ibv_qp* qp) { return destroy(qp, "destroy_qp"); };
  a.create_ah = [](ibv_pd*, ibv_ah_attr* attr) {
    auto* ah = make<ibv_ah>("create_ah");
    fake->ahs[ah] = {fake->next_ahn++, *attr};
    return ah;
  };
  a.destroy_ah = [](ibv_ah* ah) { return destroy(ah, "destroy_ah"); };
  a.efa_query_device = [](ibv_context*, efadv_device_attr* attr, uint32_t) {
    if (!fake->efa) return EOPNOTSUPP;
    *attr = efadv_device_attr{};
    attr->device_caps = fake->efa_caps;
    attr->max_sq_wr = 512;
    attr->max_rq_wr = 512;
    attr->max_rdma_size = 1u << 30;
    return 0;
  };
  a.efa_query_ah = [](ibv_ah* ah, efadv_ah_attr* attr, uint32_t) {
    attr->ahn = fake->ahs.at(ah).first;
    return 0;
  };
  a.wc_status_str = [](ibv_wc_status s) {
    return s == IBV_WC_SUCCESS ? "success" : s == IBV_WC_RETRY_EXC_ERR ? "transport retry counter exceeded" : "other";
  };
  a.post_send = [](ibv_qp*, ibv_send_wr* wr, ibv_send_wr**) {
    if (fake->post_send_rc) return fake->post_send_rc;
    fake->sends.push_back(*wr);
    fake->send_sges.push_back(wr->num_sge ? wr->sg_list[0] : ibv_sge{});
    return 0;
  };
  a.post_srd_write = [](ibv_qp*, const SrdWrite& w) {
    fake->srd_writes.push_back(w);
    return 0;
  };
  a.post_recv = [](ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr**) {
    fake->receives += wr->num_sge == 1 ? 1 : 1000;  // EFA needs a buffer in every slot
    return 0;
  };
  a.post_srq_recv = [](ibv_srq*, ibv_recv_wr* wr, ibv_recv_wr**) {
    fake->receives += wr->num_sge == 1 ? 1 : 1000;
    return 0;
  };
  a.poll_cq = [](ibv_cq* cq, int max, ibv_wc* wc) {
    int n = 0;
    auto& queue = fake->completions[cq];
    while (n < max && !queue.empty()) {
      wc[n++] = queue.front();
      queue.pop_front();
    }
    return n;
  };
  if (!fake->has_reg_dmabuf) a.reg_dmabuf_mr = nullptr;
  return a;
}

// The other ranks of a group, as the exchange delivers them to this rank.
struct Group {
  int rank, world;
  IbvTransport transport = IbvTransport::kRc;
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  std::vector<std::string> peers;     // blobs by rank (this rank's is replaced by what it sends)
  std::vector<std::string> verdicts;  // the second exchange, by rank
  std::vector<std::string> sent;      // what this rank sent, per exchange

  Group(int r, int w, IbvTransport t = IbvTransport::kRc, uint8_t ll = IBV_LINK_LAYER_INFINIBAND)
      : rank(r), world(w), transport(t), link_layer(ll), verdicts(w) {
    for (int i = 0; i < w; ++i) peers.push_back(peer_blob(i, w, t, ll));
  }
  AllGather exchange() {
    return [this](const std::string& mine) {
      fake->log.push_back("exchange");
      sent.push_back(mine);
      std::vector<std::string> all = sent.size() == 1 ? peers : verdicts;
      all[rank] = mine;
      return all;
    };
  }
};

IbvOptions heap_options() {
  IbvOptions o;
  o.heap_address = kHeapAddress;
  o.heap_bytes = kHeapBytes;
  o.dmabuf_fd = 5;
  return o;
}

// Fake calls that make, change or free something (not the queries).
std::vector<std::string> actions() {
  std::vector<std::string> out;
  for (const auto& l : fake->log) {
    if (l.rfind("query", 0) != 0) out.push_back(l);
  }
  return out;
}

class IbvVerbsFake : public ::testing::Test {
 protected:
  void SetUp() override { fake = &host; }
  void TearDown() override {
    EXPECT_EQ(host.live, 0) << "setup or teardown leaked RDMA objects";
    fake = nullptr;
  }
  std::unique_ptr<IbvVerbs> open(Group& group, const IbvOptions& options = heap_options()) {
    api = fake_api();
    return std::make_unique<IbvVerbs>(api, options, group.rank, group.world, group.exchange());
  }
  std::string open_error(Group& group, const IbvOptions& options = heap_options()) {
    return error_of([&] { open(group, options); });
  }
  Fake host;
  IbvApi api{};
};

TEST_F(IbvVerbsFake, RcSetupMakesEverythingThenConnectsEachQueuePairToWhatItsPeerPublished) {
  Group group(1, 3);
  {
    auto verbs = open(group);
    EXPECT_EQ(verbs->transport(), IbvTransport::kRc);
    EXPECT_EQ(verbs->device_name(), "mlx5_0");
    EXPECT_TRUE(verbs->registered_by_dmabuf());
    const std::vector<std::string> expected = {
        "open_device mlx5_0", "alloc_pd", "reg_dmabuf_mr heap", "reg_mr scratch", "create_cq", "create_cq",
        "create_srq",
        "create_qp", "modify_qp 256 INIT",  // for rank 0
        "create_qp", "modify_qp 257 INIT",  // for rank 2
        "exchange",
        "modify_qp 256 RTR", "modify_qp 256 RTS", "modify_qp 257 RTR", "modify_qp 257 RTS",
        "exchange"};
    EXPECT_EQ(actions(), expected);
  }
  EXPECT_EQ(actions().back(), "close_device");

  // What this rank published.
  const std::vector<IbvRankInfo> mine = decode_ibv_blobs({group.peers[0], group.sent[0], group.peers[2]}, 3);
  const IbvWireHeader& h = mine[1].header;
  EXPECT_EQ(h.transport, uint16_t(IbvTransport::kRc));
  EXPECT_EQ(h.lid, 21);
  EXPECT_EQ(h.mtu, IBV_MTU_4096);
  EXPECT_EQ(h.heap_addr, kHeapAddress);
  EXPECT_EQ(h.heap_bytes, kHeapBytes);
  EXPECT_EQ(host.dmabuf_iova, kHeapAddress);  // peers' writes name the heap's own addresses
  EXPECT_EQ(host.dmabuf_fd, 5);
  EXPECT_EQ(host.heap_access, heap_access(IbvTransport::kRc));
  EXPECT_EQ(mine[1].entries[0].qpn, 256u);
  EXPECT_EQ(mine[1].entries[1].qpn, 0u);
  EXPECT_EQ(mine[1].entries[2].qpn, 257u);
  EXPECT_EQ(host.rc_init.qp_type, IBV_QPT_RC);
  EXPECT_EQ(host.rc_init.sq_sig_all, 0);
  EXPECT_NE(host.rc_init.srq, nullptr);

  // Each queue pair went INIT -> RTR -> RTS with the attributes of the pure functions, and its peer's
  // queue pair number and PSN for this rank (rank r's QP to j is 700 + 10r + j, PSN 40 + 10r + j).
  const IbvPort port{1, IBV_LINK_LAYER_INFINIBAND, IBV_MTU_4096, 21, 0};
  for (const auto& [qpn, peer] : std::vector<std::pair<uint32_t, int>>{{256, 0}, {257, 2}}) {
    const std::vector<QpTransition>& t = host.transitions[qpn];
    ASSERT_EQ(t.size(), 3u);
    EXPECT_EQ(t[0].mask, rc_to_init(1).mask);
    const QpTransition rtr = rc_to_rtr(port, mine[peer].header, 700 + 10 * peer + 1, 40 + 10 * peer + 1);
    EXPECT_EQ(t[1].mask, rtr.mask);
    EXPECT_EQ(t[1].attr.dest_qp_num, 700u + 10 * peer + 1);
    EXPECT_EQ(t[1].attr.rq_psn, 40u + 10 * peer + 1);
    EXPECT_EQ(t[1].attr.ah_attr.dlid, 10 + peer);
    EXPECT_EQ(t[1].attr.path_mtu, IBV_MTU_2048);
    EXPECT_EQ(t[2].mask, rc_to_rts(0).mask);
    EXPECT_EQ(t[2].attr.sq_psn, mine[1].entries[peer].psn);  // the PSN this rank published
    EXPECT_EQ(t[2].attr.timeout, kRcTimeout);
  }
}

TEST_F(IbvVerbsFake, RoceChoosesARoceV2GidAndRoutesByIt) {
  host.link_layer = IBV_LINK_LAYER_ETHERNET;
  host.gids = {{gid_of({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1}), 0, 1, IBV_GID_TYPE_ROCE_V1, 0},
               {gid_of({0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1}), 1, 1, IBV_GID_TYPE_ROCE_V2, 0},
               {gid_of({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}), 2, 1, IBV_GID_TYPE_ROCE_V1, 0},
               {gid_of({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}), 3, 1, IBV_GID_TYPE_ROCE_V2, 0}};
  Group group(0, 2, IbvTransport::kRc, IBV_LINK_LAYER_ETHERNET);
  open(group);
  const QpTransition& rtr = host.transitions[256][1];
  EXPECT_EQ(rtr.attr.ah_attr.is_global, 1);
  EXPECT_EQ(rtr.attr.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(rtr.attr.ah_attr.grh.dgid.raw[15], 1);  // rank 1's GID
  EXPECT_EQ(header_of(group.sent[0]).gid[12], 10);  // this rank published GID 3
  EXPECT_EQ(header_of(group.sent[0]).link_layer, IBV_LINK_LAYER_ETHERNET);
}

TEST_F(IbvVerbsFake, OnlyTheRanksAskedForAreConnected) {
  Group group(0, 4);
  // Ranks 0 and 1 share a node (NVLink), as do 2 and 3: rank 0 connects to 2 and 3 only.
  for (int r : {1, 2, 3}) {
    std::string& b = group.peers[r];
    auto* entries = reinterpret_cast<IbvWireEntry*>(b.data() + sizeof(IbvWireHeader));
    for (int j = 0; j < 4; ++j) {
      if ((r < 2) == (j < 2)) entries[j] = IbvWireEntry{0, 0};
    }
  }
  IbvOptions options = heap_options();
  options.connect = {false, false, true, true};
  auto verbs = open(group, options);
  EXPECT_EQ(host.qps.size(), 2u);
  VerbsCompletion c[4];
  verbs->post(VerbsWork{VerbsWork::kWrite, 1, 0, 0, 8, 0, 0, false, true, 9});
  ASSERT_EQ(verbs->poll(c, 4), 1);
  EXPECT_FALSE(c[0].ok);
  EXPECT_HAS(c[0].status, "rank 1 is not connected over RDMA");
}

TEST_F(IbvVerbsFake, RcPostsWritesAndFencedAddsAndMapsCompletionsBackToPeers) {
  Group group(0, 3);
  IbvOptions options = heap_options();
  options.send_depth = 4;
  auto verbs = open(group, options);
  EXPECT_EQ(verbs->send_room(1), 4);

  RcBackend backend(0, *verbs);
  ASSERT_TRUE(backend.post(ProxyWrite{1, 64, 128, 32, 8, 3}));
  ASSERT_EQ(host.sends.size(), 2u);
  const ibv_send_wr& write = host.sends[0];
  EXPECT_EQ(write.opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(write.send_flags, 0u);  // unsignaled: the add after it completes for both
  EXPECT_EQ(write.wr.rdma.remote_addr, 0x200000u + 128);  // rank 1's heap
  EXPECT_EQ(write.wr.rdma.rkey, 0x501u);
  EXPECT_EQ(host.send_sges[0].addr, kHeapAddress + 64);
  EXPECT_EQ(host.send_sges[0].length, 32u);
  const ibv_send_wr& add = host.sends[1];
  EXPECT_EQ(add.opcode, IBV_WR_ATOMIC_FETCH_AND_ADD);
  EXPECT_EQ(add.send_flags, unsigned(IBV_SEND_SIGNALED | IBV_SEND_FENCE));
  EXPECT_EQ(add.wr.atomic.remote_addr, 0x200000u + 8);
  EXPECT_EQ(add.wr.atomic.compare_add, 3u);
  EXPECT_EQ(add.wr.atomic.rkey, 0x501u);
  EXPECT_EQ(host.send_sges[1].length, 8u);
  EXPECT_EQ(verbs->send_room(1), 2);
  EXPECT_EQ(verbs->send_room(2), 4);

  // The add's completion retires both requests.
  ibv_wc done{};
  done.wr_id = add.wr_id;
  done.status = IBV_WC_SUCCESS;
  done.qp_num = 256;
  host.completions[host.cqs[0]].push_back(done);
  VerbsCompletion c[8];
  ASSERT_EQ(verbs->poll(c, 8), 1);
  EXPECT_TRUE(c[0].ok);
  EXPECT_EQ(c[0].kind, VerbsCompletion::kSend);
  EXPECT_EQ(c[0].peer, 1);
  EXPECT_EQ(verbs->send_room(1), 4);

  // A write with immediate data carries it big-endian.
  verbs->post(VerbsWork{VerbsWork::kWriteWithImm, 2, 0, 16, 8, 0, 0x01020304, false, true, 77});
  EXPECT_EQ(host.sends.back().opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(host.sends.back().imm_data, htobe32(0x01020304));
  EXPECT_EQ(host.sends.back().send_flags, unsigned(IBV_SEND_SIGNALED));

  // A failed completion names the peer and the verbs status, through the backend.
  ASSERT_TRUE(backend.post(ProxyWrite{2, 0, 0, 0, 16, 1}));  // no bytes: the add alone
  ibv_wc failed{};
  failed.wr_id = host.sends.back().wr_id;
  failed.status = IBV_WC_RETRY_EXC_ERR;
  failed.vendor_err = 0x81;
  failed.qp_num = 257;
  host.completions[host.cqs[0]].push_back(failed);
  backend.progress();
  EXPECT_HAS(backend.failure(), "RDMA to rank 2 failed (transport retry counter exceeded, status 12, vendor error 0x81)");
  EXPECT_EQ(verbs->send_room(2), 4);  // the write with immediate data before it retired too
}

TEST_F(IbvVerbsFake, BadPostsComeBackAsFailedCompletionsNamingThePeer) {
  Group group(0, 2);
  auto verbs = open(group);
  VerbsCompletion c[8];
  verbs->post(VerbsWork{VerbsWork::kWrite, 0, 0, 0, 8, 0, 0, false, true, 1});  // itself
  verbs->post(VerbsWork{VerbsWork::kWrite, 1, kHeapBytes - 4, 0, 8, 0, 0, false, true, 2});
  verbs->post(VerbsWork{VerbsWork::kWrite, 1, 0, kHeapBytes, 8, 0, 0, false, true, 3});
  verbs->post(VerbsWork{VerbsWork::kFetchAdd, 1, 0, 12, 0, 1, 0, true, true, 4});
  host.post_send_rc = ENOMEM;
  verbs->post(VerbsWork{VerbsWork::kWrite, 1, 0, 0, 8, 0, 0, false, true, 5});
  ASSERT_EQ(verbs->poll(c, 8), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(c[i].ok);
    EXPECT_EQ(c[i].id, uint64_t(i + 1));
  }
  EXPECT_HAS(c[0].status, "rank 0 is not connected over RDMA");
  EXPECT_HAS(c[1].status, "reads past this rank's heap");
  EXPECT_HAS(c[2].status, "outside rank 1's heap of 1048576 bytes");
  EXPECT_HAS(c[3].status, "not 8-byte aligned");
  EXPECT_HAS(c[4].status, "posting to rank 1 on mlx5_0 failed: Cannot allocate memory");
  EXPECT_EQ(host.sends.size(), 0u);
  EXPECT_EQ(verbs->send_room(1), 256);  // nothing holds a slot
}

TEST_F(IbvVerbsFake, SrdUsesOneQueuePairAndAnAddressHandlePerPeer) {
  host.efa = true;
  host.names = {"rdmap16s27"};
  host.link_layer = IBV_LINK_LAYER_UNSPECIFIED;
  Group group(0, 3, IbvTransport::kSrd, IBV_LINK_LAYER_UNSPECIFIED);
  auto verbs = open(group);
  EXPECT_EQ(verbs->transport(), IbvTransport::kSrd);
  const std::vector<std::string> expected = {
      "open_device rdmap16s27", "alloc_pd", "reg_dmabuf_mr heap", "reg_mr scratch", "create_cq", "create_cq",
      "efa_create_qp_ex", "modify_qp 256 INIT", "modify_qp 256 RTR", "modify_qp 256 RTS",
      "exchange",
      "create_ah", "create_ah",
      "exchange"};
  EXPECT_EQ(actions(), expected);
  EXPECT_EQ(host.srd_init.qp_type, IBV_QPT_DRIVER);
  EXPECT_TRUE(host.srd_init.send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(host.heap_access, heap_access(IbvTransport::kSrd));
  EXPECT_EQ(host.transitions[256][0].attr.qkey, kSrdQkey);
  EXPECT_EQ(host.transitions[256][2].mask, srd_to_rts(0, true).mask);
  const IbvWireHeader& mine = header_of(group.sent[0]);
  EXPECT_EQ(mine.srd_qpn, 256u);
  EXPECT_EQ(mine.qkey, kSrdQkey);

  SrdBackend backend(0, *verbs, [](uint64_t, uint64_t) {}, 4);
  EXPECT_EQ(host.receives, 4);
  ASSERT_TRUE(backend.post(ProxyWrite{2, 64, 128, 32, 8 * 5, 2}));
  ASSERT_EQ(host.srd_writes.size(), 1u);
  const SrdWrite& w = host.srd_writes[0];
  EXPECT_TRUE(w.with_imm);
  EXPECT_EQ(w.imm, SrdBackend::encode(8 * 5, 2));
  EXPECT_EQ(w.remote_qpn, 902u);
  EXPECT_EQ(w.remote_qkey, kSrdQkey);
  EXPECT_EQ(w.rkey, 0x502u);
  EXPECT_EQ(w.remote_addr, 0x300000u + 128);
  EXPECT_EQ(w.sge.addr, kHeapAddress + 64);
  EXPECT_EQ(w.sge.length, 32u);
  EXPECT_EQ(host.ahs.at(w.ah).second.grh.dgid.raw[15], 2);  // rank 2's address handle

  // A write from rank 1 arrives: named by our address handle for rank 1 and its queue pair.
  uint16_t ahn_of_1 = 0;
  for (const auto& [ah, info] : host.ahs) {
    if (info.second.grh.dgid.raw[15] == 1) ahn_of_1 = info.first;
  }
  ibv_wc in{};
  in.status = IBV_WC_SUCCESS;
  in.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  in.wc_flags = IBV_WC_WITH_IMM;
  in.imm_data = htobe32(0xabcdef01);
  in.slid = ahn_of_1;
  in.src_qp = 901;
  in.qp_num = 256;
  host.completions[host.cqs[1]].push_back(in);
  VerbsCompletion c[4];
  ASSERT_EQ(verbs->poll(c, 4), 1);
  EXPECT_EQ(c[0].kind, VerbsCompletion::kReceive);
  EXPECT_TRUE(c[0].ok);
  EXPECT_EQ(c[0].peer, 1);
  EXPECT_EQ(c[0].imm, 0xabcdef01u);

  // Completions in any order; EFA has no atomics.
  verbs->post(VerbsWork{VerbsWork::kWrite, 1, 0, 0, 8, 0, 0, false, true, 11});
  verbs->post(VerbsWork{VerbsWork::kWrite, 1, 0, 0, 8, 0, 0, false, true, 12});
  EXPECT_EQ(verbs->send_room(1), 256 - 3);
  for (uint64_t wr : {host.srd_writes[2].wr_id, host.srd_writes[1].wr_id}) {
    ibv_wc done{};
    done.wr_id = wr;
    done.qp_num = 256;
    host.completions[host.cqs[0]].push_back(done);
  }
  ASSERT_EQ(verbs->poll(c, 4), 2);
  EXPECT_EQ(c[0].id, 12u);
  EXPECT_EQ(c[1].id, 11u);
  EXPECT_EQ(verbs->send_room(1), 256 - 1);
  verbs->post(VerbsWork{VerbsWork::kFetchAdd, 1, 0, 8, 0, 1, 0, true, true, 13});
  ASSERT_EQ(verbs->poll(c, 4), 1);
  EXPECT_HAS(c[0].status, "EFA has no atomics");
}

TEST_F(IbvVerbsFake, AnEfaDeviceWithoutRdmaWriteIsRefused) {
  host.efa = true;
  host.efa_caps = 0;
  host.names = {"rdmap16s27"};
  Group group(0, 2, IbvTransport::kSrd);
  const std::string why = open_error(group);
  EXPECT_HAS(why, "RDMA setup failed on rank 0: EFA device rdmap16s27 offers no RDMA write");
  EXPECT_EQ(group.sent.size(), 1u);  // told the others, then stopped
}

TEST_F(IbvVerbsFake, SetupFailuresSayWhatIsMissingAndAreToldToEveryRank) {
  {
    host.names = {};
    Group group(1, 2);
    EXPECT_HAS(open_error(group), "RDMA setup failed on rank 1: this host has no RDMA devices");
    ASSERT_EQ(group.sent.size(), 1u);
    EXPECT_EQ(header_of(group.sent[0]).transport, uint16_t(IbvTransport::kFailed));
    host.names = {"mlx5_0", "mlx5_1"};
  }
  {
    IbvOptions options = heap_options();
    options.device = "mlx5_9";
    Group group(0, 2);
    EXPECT_HAS(open_error(group, options), "RDMA device 'mlx5_9' is not on this host; it has mlx5_0, mlx5_1");
  }
  {
    host.port_state = IBV_PORT_DOWN;
    Group group(0, 2);
    EXPECT_HAS(open_error(group), "port 1 of mlx5_0 is DOWN, not ACTIVE");
    host.port_state = IBV_PORT_ACTIVE;
  }
  {
    IbvOptions options = heap_options();
    options.heap_bytes = 0;
    Group group(0, 2);
    EXPECT_HAS(open_error(group, options), "no heap to register");
  }
  {
    host.dmabuf_errno = EOPNOTSUPP;
    host.reg_mr_errno = EFAULT;
    Group group(0, 2);
    EXPECT_HAS(open_error(group), "registering the heap (1048576 bytes at 0x7f0000000000) with mlx5_0 failed: "
                                  "ibv_reg_dmabuf_mr failed: Operation not supported; then ibv_reg_mr failed: Bad address");
    IbvOptions no_fd = heap_options();  // the GPU exported no dmabuf: the error says why
    no_fd.dmabuf_fd = -1;
    no_fd.no_dmabuf = "this GPU or driver cannot export a dmabuf";
    Group by_address(0, 2);
    EXPECT_HAS(open_error(by_address, no_fd), "mlx5_0 failed: this GPU or driver cannot export a dmabuf; then "
                                              "ibv_reg_mr failed: Bad address");
    host.has_reg_dmabuf = false;
    Group old(0, 2);
    EXPECT_HAS(open_error(old), "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core >= 34); then ibv_reg_mr failed");
    host.has_reg_dmabuf = true;
    host.reg_mr_errno = 0;
  }
}

TEST_F(IbvVerbsFake, AFailedDmabufRegistrationFallsBackToTheAddress) {
  host.dmabuf_errno = EOPNOTSUPP;
  Group group(0, 2);
  auto verbs = open(group);
  EXPECT_FALSE(verbs->registered_by_dmabuf());
  const std::vector<std::string> log = actions();
  EXPECT_EQ(std::vector<std::string>(log.begin() + 2, log.begin() + 5),
            (std::vector<std::string>{"reg_dmabuf_mr (refused)", "reg_mr heap", "reg_mr scratch"}));
}

TEST_F(IbvVerbsFake, APeersFailureRaisesHereAfterOneExchangeAndReleasesEverything) {
  Group group(0, 3);
  group.peers[2] = encode_ibv_failure(2, 3, "interlace: this host has no RDMA devices");
  EXPECT_HAS(open_error(group), "RDMA setup failed on rank 2: this host has no RDMA devices");
  EXPECT_EQ(group.sent.size(), 1u);
  EXPECT_EQ(std::count(host.log.begin(), host.log.end(), "modify_qp 256 RTR"), 0);
}

TEST_F(IbvVerbsFake, AFailedConnectionIsAgreedOnInTheSecondExchange) {
  {
    host.fail_modify = "257 RTR";  // this rank's queue pair for rank 2
    Group group(0, 3);
    const std::string why = open_error(group);
    EXPECT_HAS(why, "RDMA setup failed on rank 0 while connecting its queue pairs: moving the queue pair for rank 2 "
                    "on mlx5_0 to RTR failed: Invalid argument");
    ASSERT_EQ(group.sent.size(), 2u);
    EXPECT_HAS(group.sent[1], "to RTR failed");
    host.fail_modify.clear();
  }
  {
    Group group(0, 3);
    group.verdicts[1] = "moving the queue pair for rank 0 on mlx5_2 to RTS failed: Connection timed out";
    EXPECT_HAS(open_error(group), "RDMA setup failed on rank 1 while connecting its queue pairs: moving the queue pair "
                                  "for rank 0 on mlx5_2 to RTS failed");
  }
  {
    Group group(0, 2, IbvTransport::kRc, IBV_LINK_LAYER_ETHERNET);  // the peer is RoCE, this rank InfiniBand
    EXPECT_HAS(open_error(group), "rank 1's port is Ethernet (RoCE) and this rank's (mlx5_0) InfiniBand");
  }
}

// ---- The real library, on a machine without RDMA devices ---------------------------------------

TEST(IbvVerbsReal, NoDevicesIsACleanErrorToldToEveryRank) {
  bool loaded = true;
  try {
    if (!VerbsLibrary::load().devices().empty()) GTEST_SKIP() << "this host has RDMA devices";
  } catch (const Error&) {
    loaded = false;  // no libibverbs at all: the same path, with another reason
  }
  std::vector<std::string> sent;
  AllGather exchange = [&](const std::string& mine) {
    sent.push_back(mine);
    return std::vector<std::string>{mine, peer_blob(1, 2)};
  };
  const std::string why = error_of([&] { open_ibv_verbs(heap_options(), 0, 2, exchange); });
  EXPECT_HAS(why, "RDMA setup failed on rank 0: ");
  EXPECT_HAS(why, loaded ? "this host has no RDMA devices" : "the proxy needs libibverbs");
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(reinterpret_cast<const IbvWireHeader*>(sent[0].data())->transport, uint16_t(IbvTransport::kFailed));
  // The other rank, whose setup worked, raises the same error from what it received.
  EXPECT_EQ(error_of([&] { decode_ibv_blobs({sent[0], peer_blob(1, 2)}, 2); }), why);
}

TEST(IbvVerbsReal, TwoRanksOverTheRealBootstrapBothRaiseTheSameErrorInsteadOfWaiting) {
  try {
    if (!VerbsLibrary::load().devices().empty()) GTEST_SKIP() << "this host has RDMA devices";
  } catch (const Error&) {
  }
  const int port = bound_port(listen_tcp("127.0.0.1", 0));
  std::string why[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      why[r] = error_of([&] {
        BootstrapOptions options;
        options.rank = r;
        options.world_size = 2;
        options.master_addr = "127.0.0.1";
        options.master_port = port;
        options.timeout_s = 20;
        Bootstrap bootstrap(options);
        open_ibv_verbs(heap_options(), bootstrap);
      });
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_HAS(why[0], "RDMA setup failed on rank 0: ");
  EXPECT_EQ(why[1], why[0]);
}

TEST(IbvVerbsReal, TheLoadedTableHasEverythingSetupNeeds) {
  const IbvApi* api = nullptr;
  try {
    api = &VerbsLibrary::load().api();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_NE(api->open_device, nullptr);
  EXPECT_NE(api->modify_qp, nullptr);
  EXPECT_NE(api->post_send, nullptr);
  EXPECT_NE(api->poll_cq, nullptr);
  EXPECT_NE(api->reg_dmabuf_mr, nullptr);  // rdma-core 44 here
  EXPECT_NE(api->query_gid_ex, nullptr);
  EXPECT_STREQ(api->wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
}

}  // namespace
}  // namespace interlace
