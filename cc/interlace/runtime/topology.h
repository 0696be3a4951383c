// Where each rank runs: nodes x local ranks. Ranks on one node share NVLink.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace interlace {

struct Topology {
  int rank = 0;
  int world_size = 1;
  int node = 0;        // index of this rank's node, in order of first appearance by rank
  int num_nodes = 1;
  int local_rank = 0;  // index of this rank among the ranks of its node
  std::vector<int> local_ranks;  // global ranks on this node, ascending; local_ranks[local_rank] == rank

  int local_size() const { return static_cast<int>(local_ranks.size()); }
};

// Builds the topology from every rank's node name (a hostname, or a name the user gives).
Topology make_topology(int rank, const std::vector<std::string>& node_names);

// The global rank a device fault's peer field names (DeviceFault::peer: a local rank, or
// kFaultPeerGlobal + a global rank), or -1 for none or out of range.
int fault_peer_rank(int32_t peer, const Topology& topo);

}  // namespace interlace
