// The pure parts of connecting ranks over RDMA, kept apart from the device so the CPU tests cover
// them: what ranks tell each other (a fixed-size, versioned blob per rank, exchanged through the
// bootstrap), and the attributes that move a queue pair INIT -> RTR -> RTS.
//
// The blob. Every rank sends one; all_gather hands every rank all of them. A blob is a header about
// the sending rank (its port address: LID, GID, MTU; its heap: address, size, rkey; for SRD its one
// queue pair) and one entry per rank of the group: the queue pair it made for that rank (RC) and
// that queue pair's first packet sequence number; 0 where it connects to no queue pair (itself,
// ranks on its own node). A rank whose setup failed sends a blob that says why, so that every rank
// raises the same error instead of waiting for it. All ranks run on one architecture (little
// endian); the blob is the structs' bytes.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

namespace interlace {

enum class IbvTransport : uint16_t {
  kFailed = 0,  // this rank's setup failed: the header's `failure` says why
  kRc = 1,      // InfiniBand / RoCE reliable connection: a queue pair per peer
  kSrd = 2,     // EFA scalable reliable datagram: one queue pair, an address handle per peer
};
const char* transport_name(IbvTransport t);

constexpr uint32_t kIbvWireMagic = 0x42564c49;  // "ILVB"
constexpr uint16_t kIbvWireVersion = 1;         // bump on any change to the two structs below

struct IbvWireHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t transport;     // IbvTransport
  int32_t rank;           // the sender
  int32_t world_size;     // as the sender sees it
  uint32_t header_bytes;  // sizeof(IbvWireHeader)
  uint32_t entry_bytes;   // sizeof(IbvWireEntry)
  uint8_t gid[16];        // RoCE and EFA address the port by GID; InfiniBand by LID
  uint16_t lid;
  uint8_t link_layer;     // IBV_LINK_LAYER_INFINIBAND / _ETHERNET / _UNSPECIFIED (EFA)
  uint8_t mtu;            // the port's active ibv_mtu
  uint32_t srd_qpn;       // SRD: the queue pair every peer writes to
  uint32_t qkey;          // SRD: the qkey peers must present
  uint32_t rkey;          // the heap's registration
  uint64_t heap_addr;     // the address peers' writes name (the heap's virtual address)
  uint64_t heap_bytes;
  char failure[256];      // kFailed: why, NUL-terminated
};

struct IbvWireEntry {
  uint32_t qpn;  // the sender's queue pair for this rank; 0: none
  uint32_t psn;  // its first packet sequence number (RC)
};

static_assert(sizeof(IbvWireHeader) == 328 && sizeof(IbvWireEntry) == 8, "the wire format has no padding");

// A rank's blob, validated.
struct IbvRankInfo {
  IbvWireHeader header;
  std::vector<IbvWireEntry> entries;  // world_size of them
};

std::string encode_ibv_blob(const IbvWireHeader& header, const std::vector<IbvWireEntry>& entries);
// The blob of a rank whose setup failed (transport kFailed), with `why`, cut to fit.
std::string encode_ibv_failure(int rank, int world_size, const std::string& why);

// Validates every rank's blob, in rank order, and raises interlace::Error at the first problem,
// naming the rank: a short or long blob, not interlace's, another wire version, another world size,
// a rank's failure, transports that differ, a queue pair that one side has and the other lacks.
// Every rank sees the same blobs, so every rank raises the same error (or none).
std::vector<IbvRankInfo> decode_ibv_blobs(const std::vector<std::string>& blobs, int world_size);

// ---- Queue pair attributes -------------------------------------------------------------------

// RC timing and limits. Named, with the reason for each value.
//
// Local ACK timeout: 4.096 us * 2^20 = 4.3 s before a request is resent. Collective libraries
// default to 20 too: shorter values give spurious "retry exceeded" failures on large, congested
// fabrics. With kRcRetryCount a dead peer or link surfaces as an error after about 35 s; a dead
// process is noticed sooner by the group's watchdog (its heartbeat timeout is 30 s).
constexpr uint8_t kRcTimeout = 20;
// Resends before the queue pair fails with IBV_WC_RETRY_EXC_ERR: the most the field holds (3 bits).
constexpr uint8_t kRcRetryCount = 7;
// Receiver-not-ready retries: 7 means retry forever. Only writes with immediate data consume
// receive slots; a receiver short of them (its proxy behind) delays the sender, never fails it.
constexpr uint8_t kRcRnrRetry = 7;
// How long a receiver asks a sender to wait before retrying when it has no receive slot:
// encoding 12 = 0.64 ms.
constexpr uint8_t kRcMinRnrTimer = 12;
// Outstanding RDMA reads / atomics per queue pair, as initiator and as responder. The flag's
// FETCH_AND_ADD is fenced (verbs_backend.h), so there is at most one in flight anyway; 1 is within
// every device's limits.
constexpr uint8_t kRcMaxAtomics = 1;
// RoCE v2 packets are routed: allow any number of hops.
constexpr uint8_t kRoceHopLimit = 255;
// The qkey of our SRD queue pairs. Any value works as long as senders present it; it travels in
// the blob anyway, so it is fixed for legibility.
constexpr uint32_t kSrdQkey = 0x11111111;
// Packet sequence numbers are 24 bits.
constexpr uint32_t kPsnMask = 0xffffff;

// What a queue pair's move to the next state needs: the attributes and which of them apply.
struct QpTransition {
  ibv_qp_attr attr;
  int mask;
};

// This rank's port, as the attributes need it.
struct IbvPort {
  uint8_t port_num;
  uint8_t link_layer;  // IBV_LINK_LAYER_*
  ibv_mtu mtu;         // active MTU
  uint16_t lid;
  int gid_index;       // RoCE: the source GID (sgid_index)
};

// The access the heap is registered with: RC peers write and add to flags; SRD peers only write.
int heap_access(IbvTransport transport);
// The MTU two ports can both carry.
ibv_mtu path_mtu(ibv_mtu a, ibv_mtu b);

QpTransition rc_to_init(uint8_t port_num);
// `remote` is the peer's header; remote_qpn / remote_psn its queue pair for this rank.
QpTransition rc_to_rtr(const IbvPort& local, const IbvWireHeader& remote, uint32_t remote_qpn, uint32_t remote_psn);
QpTransition rc_to_rts(uint32_t local_psn);

QpTransition srd_to_init(uint8_t port_num, uint32_t qkey);
QpTransition srd_to_rtr();
// rnr_retry: when the device can set it (EFADV_DEVICE_ATTR_CAPS_RNR_RETRY), retry forever.
QpTransition srd_to_rts(uint32_t local_psn, bool rnr_retry);
// The address handle for an SRD peer: its GID, through our port.
ibv_ah_attr srd_address(uint8_t port_num, const uint8_t remote_gid[16]);

// One GID table entry, as chosen among.
struct GidEntry {
  int index;
  ibv_gid gid;
  uint32_t type;  // IBV_GID_TYPE_IB / _ROCE_V1 / _ROCE_V2
};
// The GID a RoCE port should use: RoCE v2 (routable) with an IPv4 address, else any RoCE v2 but
// link-local, else the first entry; -1 when the table is empty.
int choose_gid_index(const std::vector<GidEntry>& table);

}  // namespace interlace
