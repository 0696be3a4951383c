#include "interlace/ops/all_gather/hierarchy.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "interlace/base/error.h"
#include "interlace/ops/all_gather/flags.h"

namespace interlace {

static_assert(sizeof(AllGatherFlags) <= kHierFlagsInRegion, "the hierarchical flags would overlap the flat ones");
static_assert(kHierFlagsInRegion + sizeof(HierAllGatherFlags) <= kOpRegionBytes,
              "the hierarchical flags must fit all_gather's region of the signal pad");

NodeLayout make_node_layout(const std::vector<std::string>& node_names) {
  NodeLayout l;
  std::vector<std::string> names;
  for (const std::string& name : node_names) {
    int node = 0;
    while (node < static_cast<int>(names.size()) && names[node] != name) ++node;
    if (node == static_cast<int>(names.size())) {
      names.push_back(name);
      l.ranks.emplace_back();
    }
    l.node_of.push_back(node);
    l.local_of.push_back(static_cast<int>(l.ranks[node].size()));
    l.ranks[node].push_back(static_cast<int>(l.node_of.size()) - 1);
  }
  return l;
}

const char* ag_path_name(AgPath path) {
  switch (path) {
    case AgPath::kSelf: return "self";
    case AgPath::kNvlink: return "nvlink";
    case AgPath::kNetwork: return "network";
    case AgPath::kRelay: return "relay";
  }
  return "unknown";
}

namespace {

// s's place among the senders to node b: the ranks of the nodes before s's (b excluded), then s's
// local index.
int place_toward(const NodeLayout& l, int s, int b) {
  IL_CHECK(s >= 0 && s < l.world_size() && b >= 0 && b < l.num_nodes(), "all_gather across nodes: rank ", s,
           " or node ", b, " out of range");
  const int a = l.node_of[s];
  IL_CHECK(a != b, "all_gather across nodes: rank ", s, " is on node ", b, "; its shard crosses no network there");
  int place = l.local_of[s];
  for (int n = 0; n < a; ++n) {
    if (n != b) place += static_cast<int>(l.ranks[n].size());
  }
  return place;
}

}  // namespace

int network_receiver(const NodeLayout& l, int s, int b) {
  const std::vector<int>& there = l.ranks[b];
  return there[place_toward(l, s, b) % there.size()];
}

int relay_slot(const NodeLayout& l, int s, int b) {
  return place_toward(l, s, b) / static_cast<int>(l.ranks[b].size());
}

AgRoute all_gather_route(const NodeLayout& l, int s, int r) {
  IL_CHECK(s >= 0 && s < l.world_size() && r >= 0 && r < l.world_size(), "all_gather across nodes: rank ", s,
           " or ", r, " out of range");
  if (s == r) return AgRoute{AgPath::kSelf, -1, -1};
  if (l.node_of[s] == l.node_of[r]) return AgRoute{AgPath::kNvlink, -1, s};
  const int receiver = network_receiver(l, s, l.node_of[r]);
  if (receiver == r) return AgRoute{AgPath::kNetwork, r, r};
  return AgRoute{AgPath::kRelay, receiver, receiver};
}

AgRankWork all_gather_rank_work(const NodeLayout& l, int r) {
  IL_CHECK(r >= 0 && r < l.world_size(), "all_gather across nodes: rank ", r, " out of range");
  AgRankWork w;
  const int mine = l.node_of[r];
  const int size = static_cast<int>(l.ranks[mine].size());
  for (int q : l.ranks[mine]) {
    if (q != r) w.nvlink_peers.push_back(q);
  }
  for (int b = 0; b < l.num_nodes(); ++b) {
    if (b != mine) w.network_peers.push_back(network_receiver(l, r, b));
  }
  // Senders to this node by place; this rank takes places local_of[r], + size, + 2 size, ...
  for (int n = 0; n < l.num_nodes(); ++n) {
    if (n == mine) continue;
    for (int s : l.ranks[n]) {
      if (place_toward(l, s, mine) % size == l.local_of[r]) w.relayed.push_back(s);
    }
  }
  for (int s = 0; s < l.world_size(); ++s) {
    if (s != r) w.waits_for.push_back(s);
  }
  return w;
}

HierAllGatherPlan plan_hier_all_gather(const NodeLayout& l, uint64_t bytes_per_rank, uint64_t chunk_bytes) {
  IL_CHECK(l.world_size() <= kHierMaxRanks, "all_gather across nodes: ", l.world_size(), " ranks, its flags have room for ",
           kHierMaxRanks);
  for (int b = 0; b < l.num_nodes(); ++b) {
    const int size = static_cast<int>(l.ranks[b].size());
    const int senders = l.world_size() - size;
    IL_CHECK((senders + size - 1) / size <= kHierMaxRelayed, "all_gather across nodes: node ", b, " has ", size,
             " ranks for the shards of ", senders, " ranks elsewhere, more than the ", kHierMaxRelayed,
             " relay slots per rank");
  }
  HierAllGatherPlan p;
  p.bytes_per_rank = bytes_per_rank;
  if (chunk_bytes == 0) {
    const uint64_t fitting = (bytes_per_rank + kHierMaxChunks - 1) / kHierMaxChunks;
    p.chunk_bytes = std::max(kHierDefaultChunk, (fitting + 15) / 16 * 16);
  } else {
    IL_CHECK(chunk_bytes % 16 == 0, "all_gather across nodes: chunk_bytes must be a multiple of 16, got ", chunk_bytes);
    p.chunk_bytes = chunk_bytes;
  }
  const uint64_t chunks = bytes_per_rank / p.chunk_bytes + (bytes_per_rank % p.chunk_bytes != 0);
  IL_CHECK(chunks <= kHierMaxChunks, "all_gather across nodes: ", bytes_per_rank, " bytes per rank in chunks of ",
           p.chunk_bytes, " is ", chunks, " chunks, more than the ", kHierMaxChunks, " its flags have room for");
  p.chunks = static_cast<int>(chunks);
  return p;
}

namespace {

uint64_t hier_flags_offset() {
  return offsetof(SignalPad, regions) + (static_cast<uint64_t>(OpId::kAllGather) - 1) * kOpRegionBytes +
         kHierFlagsInRegion;
}

}  // namespace

uint64_t hier_landed_offset(int s) {
  IL_CHECK(s >= 0 && s < kHierMaxRanks, "all_gather across nodes: no landed flag for rank ", s);
  return hier_flags_offset() + offsetof(HierAllGatherFlags, landed) + 8 * static_cast<uint64_t>(s);
}

uint64_t hier_arrived_offset(int slot, int chunk) {
  IL_CHECK(slot >= 0 && slot < kHierMaxRelayed && chunk >= 0 && chunk < kHierMaxChunks,
           "all_gather across nodes: no arrival flag for slot ", slot, ", chunk ", chunk);
  return hier_flags_offset() + offsetof(HierAllGatherFlags, arrived) +
         8 * (static_cast<uint64_t>(slot) * kHierMaxChunks + static_cast<uint64_t>(chunk));
}

uint64_t hier_ready_offset(int q) {
  IL_CHECK(q >= 0 && q < kHierMaxRanks, "all_gather across nodes: no ready flag for rank ", q);
  return hier_flags_offset() + offsetof(HierAllGatherFlags, ready) + 8 * static_cast<uint64_t>(q);
}

}  // namespace interlace
