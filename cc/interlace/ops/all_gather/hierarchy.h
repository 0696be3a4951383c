// all_gather across nodes: the plan, CPU-tested (the kernel is ops/all_gather/hier_kernel.cuh). Every rank's
// shard crosses the network once per remote node, to one rank there, which fans it out over
// NVLink to the rest of its node. Each shard moves in `chunks` chunks.
//
//   sender s, receiver r        path      carried by                        flags raised on r
//   r == s                      kSelf     s copies inp into its landing slot (none)
//   r on s's node               kNvlink   s's SM stores (NvlinkTransport)   landed[s] += 1 per chunk, by s
//   r = network_receiver(s, b)  kNetwork  s's proxy (ProxyTransport), one   arrived[j][c] += 1 by the request
//                                         request per chunk c               (j = relay_slot(s, b)); then
//                                                                           landed[s] += 1, by r itself
//   any other r on node b       kRelay    R = network_receiver(s, b), over  landed[s] += 1 per chunk, by R
//                                         NVLink, chunk c once it arrived
//
// What each rank waits for:
//   - every r, for every s != r: landed[s] >= base + chunks (base: chunks per shard over all
//     earlier launches, kept locally). One wait whatever path the shard took, so a consumer (ag_gemm's
//     InputWait) need not know the topology.
//   - a network receiver R, for each s it relays and each chunk c: arrived[j][c] > consumed[j][c]
//     (consumed: its local copy of what it has taken, updated when it takes the chunk). Then it
//     raises its own landed[s] and forwards chunk c to its node's other ranks.
// Why per-chunk flags at the network receiver: the network may deliver a shard's chunks in any
// order (SRD does), so a count of arrivals does not say which chunk is there, and a relay must not
// forward a chunk that has not landed. Final waits only need counts. Relays wait only on network
// arrivals, and nothing waits on a relay's own progress but its node's final waits: no cycle.
//
// Receivers are balanced: the senders to node b (every rank not on b, by node, then local index:
// its `place`) are dealt round-robin over b's ranks; the one at `place` goes to b's local rank
// place % size(b), into relay slot place / size(b). With equal node sizes that is the rank of the
// same local index (rail-aligned: GPU i of each node talks to GPU i of the others), slot = the
// sender's node index among the others.
//
// Before its first network write of a launch, a sender waits until each of its network receivers
// has started that launch (ready[q], which q raises through the proxy on entry): q's landing slots
// are then free, and so is the sender's staging, since q has received the previous shard.
//
// A network chunk is written from the sender's staging buffer in heap scratch (the proxy carries
// heap bytes only, and must not read `out`, which the caller owns again once the kernel ends while
// the network may still be reading), so the sender copies chunk c of inp there, fences, and then
// posts it. Landing slots are `out` when it is symmetric, else heap scratch copied into out once
// landed[s] is complete.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "interlace/device/signal_pad.h"

namespace interlace {

// Which ranks share a node, for the whole group (Topology holds only this rank's node).
struct NodeLayout {
  std::vector<int> node_of;             // per global rank
  std::vector<int> local_of;            // per global rank: its index among its node's ranks
  std::vector<std::vector<int>> ranks;  // per node: its global ranks, ascending

  int world_size() const { return static_cast<int>(node_of.size()); }
  int num_nodes() const { return static_cast<int>(ranks.size()); }
};

// Nodes numbered as make_topology numbers them: by first appearance in rank order.
NodeLayout make_node_layout(const std::vector<std::string>& node_names);

enum class AgPath { kSelf, kNvlink, kNetwork, kRelay };
const char* ag_path_name(AgPath path);

// The rank of node b that takes rank s's shard off the network (b is not s's node), and the slot
// of its per-chunk arrival flags that s's requests raise there.
int network_receiver(const NodeLayout& layout, int s, int b);
int relay_slot(const NodeLayout& layout, int s, int b);

struct AgRoute {
  AgPath path;
  int network_receiver;  // kNetwork, kRelay: the rank of r's node that s's shard crosses the network to; else -1
  int raiser;            // who raises landed[s] on r: s (kNvlink), r (kNetwork), the receiver (kRelay); kSelf -1
};
AgRoute all_gather_route(const NodeLayout& layout, int s, int r);

// What rank r does in a launch.
struct AgRankWork {
  std::vector<int> nvlink_peers;   // the other ranks of r's node, ascending: r's shard and every relayed one go to each
  std::vector<int> network_peers;  // one per other node, by node: r's shard, through the proxy
  std::vector<int> relayed;        // [j]: the rank whose shard arrives in relay slot j, to forward
  std::vector<int> waits_for;      // every s != r, ascending: landed[s] >= base + chunks
};
AgRankWork all_gather_rank_work(const NodeLayout& layout, int r);

// Per-chunk flags bound these; a larger shard gets larger chunks.
constexpr int kHierMaxChunks = 64;
constexpr int kHierMaxRelayed = 128;  // relay slots per rank: with equal nodes, up to 129 nodes
constexpr int kHierMaxRanks = 8192;

// Placeholder to tune on a network: large enough that a request's fixed cost is small against
// its bytes; the chunk count (at most kHierMaxChunks) lets relays start early.
constexpr uint64_t kHierDefaultChunk = uint64_t{1} << 20;

struct HierAllGatherPlan {
  uint64_t bytes_per_rank = 0;
  uint64_t chunk_bytes = 0;  // a multiple of 16
  int chunks = 0;            // ceil(bytes_per_rank / chunk_bytes) <= kHierMaxChunks; 0 for an empty shard
};

// chunk_bytes 0: kHierDefaultChunk, or larger so that the chunks fit kHierMaxChunks. Raises on a
// chunk size that is not a multiple of 16 or that needs more chunks, and on a layout whose ranks,
// or one rank's relay slots, pass the flags' bounds.
HierAllGatherPlan plan_hier_all_gather(const NodeLayout& layout, uint64_t bytes_per_rank, uint64_t chunk_bytes = 0);

// The flags, in all_gather's region of the signal pad after the single-node kernel's
// (AllGatherFlags; a group runs one kind or the other, but apart they need no argument).
constexpr uint64_t kHierFlagsInRegion = 640 << 10;
struct HierAllGatherFlags {
  uint64_t landed[kHierMaxRanks];                     // [s]: chunks of s's shard landed here, all launches
  uint64_t arrived[kHierMaxRelayed][kHierMaxChunks];  // [j][c]: network arrivals of chunk c in relay slot j
  uint64_t consumed[kHierMaxRelayed][kHierMaxChunks]; // local: arrived[j][c] as last taken
  // [q]: launches network receiver q has started. A sender writes into q's landing slot only once q
  // has started the same launch: q's stream is then past every earlier use of it (its out
  // included), and q has received the sender's previous shard, so the sender's staging is free too.
  uint64_t ready[kHierMaxRanks];
  // [q]: launches whose shards network receiver q holds: its proxy has read this rank's staging.
  uint64_t drained[kHierMaxRanks];
  uint64_t base;                                      // local: chunks per shard over all launches so far
  uint64_t launches;                                  // local: launches so far
  uint32_t finished;                                  // local: CTAs of the running launch that are done
};
// Heap offsets (the same on every rank; SRD needs them in the heap's first 128 MiB).
uint64_t hier_landed_offset(int s);
uint64_t hier_arrived_offset(int slot, int chunk);
uint64_t hier_ready_offset(int q);

}  // namespace interlace
