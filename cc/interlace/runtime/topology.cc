#include "interlace/runtime/topology.h"

#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"

namespace interlace {

Topology make_topology(int rank, const std::vector<std::string>& node_names) {
  IL_CHECK(rank >= 0 && rank < static_cast<int>(node_names.size()), "rank ", rank, " out of range");
  Topology t;
  t.rank = rank;
  t.world_size = static_cast<int>(node_names.size());
  std::vector<std::string> nodes;
  for (int r = 0; r < t.world_size; ++r) {
    bool seen = false;
    for (const auto& n : nodes) seen = seen || n == node_names[r];
    if (!seen) nodes.push_back(node_names[r]);
    if (node_names[r] == node_names[rank]) {
      if (r == rank) t.local_rank = static_cast<int>(t.local_ranks.size());
      t.local_ranks.push_back(r);
    }
  }
  t.num_nodes = static_cast<int>(nodes.size());
  for (int n = 0; n < t.num_nodes; ++n) {
    if (nodes[n] == node_names[rank]) t.node = n;
  }
  return t;
}

int fault_peer_rank(int32_t peer, const Topology& topo) {
  if (peer >= kFaultPeerGlobal) return peer - kFaultPeerGlobal < topo.world_size ? peer - kFaultPeerGlobal : -1;
  return peer >= 0 && peer < topo.local_size() ? topo.local_ranks[peer] : -1;
}

}  // namespace interlace
