#include "interlace/transport/ibv_connect.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;
static_assert(std::is_trivially_copyable_v<IbvWireHeader> && std::is_trivially_copyable_v<IbvWireEntry>);

const char* transport_name(IbvTransport t) {
  switch (t) {
    case IbvTransport::kRc: return "RC (InfiniBand / RoCE)";
    case IbvTransport::kSrd: return "SRD (EFA)";
    case IbvTransport::kFailed: return "none (setup failed)";
  }
  return "unknown";
}

std::string encode_ibv_blob(const IbvWireHeader& header, const std::vector<IbvWireEntry>& entries) {
  IbvWireHeader h = header;
  h.magic = kIbvWireMagic;
  h.version = kIbvWireVersion;
  h.header_bytes = sizeof(IbvWireHeader);
  h.entry_bytes = sizeof(IbvWireEntry);
  h.world_size = static_cast<int32_t>(entries.size());
  std::string blob(sizeof h + entries.size() * sizeof(IbvWireEntry), '\0');
  std::memcpy(blob.data(), &h, sizeof h);
  if (!entries.empty()) std::memcpy(blob.data() + sizeof h, entries.data(), entries.size() * sizeof(IbvWireEntry));
  return blob;
}

std::string encode_ibv_failure(int rank, int world_size, const std::string& why) {
  IbvWireHeader h{};
  h.transport = static_cast<uint16_t>(IbvTransport::kFailed);
  h.rank = rank;
  std::string text = why;
  // Errors read "interlace: ...": the receiver says interlace again.
  if (text.rfind("interlace: ", 0) == 0) text = text.substr(11);
  std::strncpy(h.failure, text.c_str(), sizeof h.failure - 1);
  return encode_ibv_blob(h, std::vector<IbvWireEntry>(world_size > 0 ? world_size : 0, IbvWireEntry{0, 0}));
}

namespace {

IbvRankInfo decode_one(const std::string& blob, int from, int world_size) {
  const std::string who = concat("RDMA setup: rank ", from, "'s connection info");
  IL_CHECK(blob.size() >= sizeof(IbvWireHeader), who, " is ", blob.size(), " bytes, shorter than its ",
           sizeof(IbvWireHeader), "-byte header (a rank of another interlace version, or not interlace?)");
  IbvRankInfo info;
  std::memcpy(&info.header, blob.data(), sizeof info.header);
  const IbvWireHeader& h = info.header;
  IL_CHECK(h.magic == kIbvWireMagic, who, " does not start with interlace's magic number (got 0x", std::hex, h.magic,
           std::dec, ")");
  IL_CHECK(h.version == kIbvWireVersion, who, " has wire version ", h.version, ", this rank ", kIbvWireVersion,
           ": all ranks must run the same interlace version");
  IL_CHECK(h.header_bytes == sizeof(IbvWireHeader) && h.entry_bytes == sizeof(IbvWireEntry), who, " has a ",
           h.header_bytes, "-byte header and ", h.entry_bytes, "-byte entries, this rank ", sizeof(IbvWireHeader),
           " and ", sizeof(IbvWireEntry));
  IL_CHECK(h.rank == from, who, " says it comes from rank ", h.rank);
  if (h.transport == static_cast<uint16_t>(IbvTransport::kFailed)) {
    IL_CHECK(std::memchr(h.failure, '\0', sizeof h.failure) != nullptr, who, " reports a failure it does not end");
    IL_FAIL("RDMA setup failed on rank ", from, ": ", h.failure);
  }
  IL_CHECK(h.transport == static_cast<uint16_t>(IbvTransport::kRc) ||
               h.transport == static_cast<uint16_t>(IbvTransport::kSrd),
           who, " names unknown transport ", h.transport);
  IL_CHECK(h.world_size == world_size, who, " is for a group of ", h.world_size, " ranks, this one has ", world_size);
  const size_t expected = sizeof(IbvWireHeader) + size_t(world_size) * sizeof(IbvWireEntry);
  IL_CHECK(blob.size() == expected, who, " is ", blob.size(), " bytes; a group of ", world_size, " needs ", expected);
  info.entries.resize(world_size);
  std::memcpy(info.entries.data(), blob.data() + sizeof(IbvWireHeader), world_size * sizeof(IbvWireEntry));
  IL_CHECK(info.entries[from].qpn == 0, who, " names a queue pair to itself");
  return info;
}

}  // namespace

std::vector<IbvRankInfo> decode_ibv_blobs(const std::vector<std::string>& blobs, int world_size) {
  IL_CHECK(static_cast<int>(blobs.size()) == world_size, "RDMA setup: the exchange returned ", blobs.size(),
           " blobs for a group of ", world_size);
  std::vector<IbvRankInfo> ranks;
  for (int r = 0; r < world_size; ++r) ranks.push_back(decode_one(blobs[r], r, world_size));
  for (int r = 1; r < world_size; ++r) {
    IL_CHECK(ranks[r].header.transport == ranks[0].header.transport, "RDMA setup: rank ", r, " uses ",
             transport_name(IbvTransport(ranks[r].header.transport)), " and rank 0 ",
             transport_name(IbvTransport(ranks[0].header.transport)), ": every node needs the same kind of network");
  }
  for (int a = 0; a < world_size; ++a) {
    for (int b = a + 1; b < world_size; ++b) {
      const bool ab = ranks[a].entries[b].qpn != 0, ba = ranks[b].entries[a].qpn != 0;
      IL_CHECK(ab == ba, "RDMA setup: rank ", ab ? a : b, " connects to rank ", ab ? b : a,
               " but not the other way round (the ranks disagree on which ranks are on other nodes)");
    }
  }
  return ranks;
}

// ---- Queue pair attributes -------------------------------------------------------------------

int heap_access(IbvTransport transport) {
  if (transport == IbvTransport::kSrd) return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
}

ibv_mtu path_mtu(ibv_mtu a, ibv_mtu b) { return std::min(a, b); }  // the enum grows with the size

QpTransition rc_to_init(uint8_t port_num) {
  QpTransition t{};
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = port_num;
  // What peers may do to this rank's memory through this queue pair: write bytes, add to flags.
  t.attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

QpTransition rc_to_rtr(const IbvPort& local, const IbvWireHeader& remote, uint32_t remote_qpn, uint32_t remote_psn) {
  QpTransition t{};
  t.attr.qp_state = IBV_QPS_RTR;
  t.attr.path_mtu = path_mtu(local.mtu, static_cast<ibv_mtu>(remote.mtu));
  t.attr.dest_qp_num = remote_qpn;
  t.attr.rq_psn = remote_psn & kPsnMask;
  t.attr.max_dest_rd_atomic = kRcMaxAtomics;
  t.attr.min_rnr_timer = kRcMinRnrTimer;
  t.attr.ah_attr.port_num = local.port_num;
  t.attr.ah_attr.sl = 0;
  if (local.link_layer == IBV_LINK_LAYER_ETHERNET) {
    // RoCE: no LIDs; packets carry a global route header from our GID to the peer's.
    t.attr.ah_attr.is_global = 1;
    std::memcpy(t.attr.ah_attr.grh.dgid.raw, remote.gid, sizeof remote.gid);
    t.attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(local.gid_index);
    t.attr.ah_attr.grh.hop_limit = kRoceHopLimit;
  } else {
    // InfiniBand within one subnet: the subnet manager's LIDs route.
    t.attr.ah_attr.is_global = 0;
    t.attr.ah_attr.dlid = remote.lid;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition rc_to_rts(uint32_t local_psn) {
  QpTransition t{};
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.sq_psn = local_psn & kPsnMask;
  t.attr.timeout = kRcTimeout;
  t.attr.retry_cnt = kRcRetryCount;
  t.attr.rnr_retry = kRcRnrRetry;
  t.attr.max_rd_atomic = kRcMaxAtomics;
  t.mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
           IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

QpTransition srd_to_init(uint8_t port_num, uint32_t qkey) {
  QpTransition t{};
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = port_num;
  t.attr.qkey = qkey;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  return t;
}

QpTransition srd_to_rtr() {
  QpTransition t{};
  t.attr.qp_state = IBV_QPS_RTR;
  t.mask = IBV_QP_STATE;
  return t;
}

QpTransition srd_to_rts(uint32_t local_psn, bool rnr_retry) {
  QpTransition t{};
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.sq_psn = local_psn & kPsnMask;
  t.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (rnr_retry) {
    t.attr.rnr_retry = kRcRnrRetry;  // as on RC: a receiver short of slots delays, never fails
    t.mask |= IBV_QP_RNR_RETRY;
  }
  return t;
}

ibv_ah_attr srd_address(uint8_t port_num, const uint8_t remote_gid[16]) {
  ibv_ah_attr a{};
  a.port_num = port_num;
  a.is_global = 1;  // EFA addresses by GID
  std::memcpy(a.grh.dgid.raw, remote_gid, 16);
  return a;
}

int choose_gid_index(const std::vector<GidEntry>& table) {
  auto ipv4 = [](const ibv_gid& g) {  // ::ffff:a.b.c.d
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return std::memcmp(g.raw, prefix, sizeof prefix) == 0;
  };
  auto link_local = [](const ibv_gid& g) { return g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80; };  // fe80::/10
  for (const auto& e : table) {
    if (e.type == IBV_GID_TYPE_ROCE_V2 && ipv4(e.gid)) return e.index;
  }
  for (const auto& e : table) {
    if (e.type == IBV_GID_TYPE_ROCE_V2 && !link_local(e.gid)) return e.index;
  }
  return table.empty() ? -1 : table.front().index;
}

}  // namespace interlace
