#include "gtest/gtest.h"
#include "interlace/device/signal_pad.h"
#include "interlace/runtime/topology.h"

namespace interlace {
namespace {

TEST(Topology, NodesByFirstAppearanceAndLocalRanksInOrder) {
  std::vector<std::string> names = {"b", "a", "b", "a", "c"};
  Topology t = make_topology(2, names);
  EXPECT_EQ(t.world_size, 5);
  EXPECT_EQ(t.num_nodes, 3);
  EXPECT_EQ(t.node, 0);
  EXPECT_EQ(t.local_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(make_topology(3, names).node, 1);
  EXPECT_EQ(make_topology(4, names).local_size(), 1);
}

TEST(Topology, OneNode) {
  Topology t = make_topology(1, {"h", "h"});
  EXPECT_EQ(t.num_nodes, 1);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size(), 2);
}

// A fault names its peer by local rank (NVLink waits) or, past kFaultPeerGlobal, by global rank (waits
// on ranks of other nodes, which have no local rank): either way the message gets the global rank.
TEST(Topology, FaultPeersByLocalOrGlobalRank) {
  const Topology t = make_topology(2, {"a", "b", "a", "b", "a"});  // node a: ranks 0, 2, 4
  EXPECT_EQ(fault_peer_rank(0, t), 0);
  EXPECT_EQ(fault_peer_rank(2, t), 4);
  EXPECT_EQ(fault_peer_rank(3, t), -1);  // no fourth rank on this node
  EXPECT_EQ(fault_peer_rank(-1, t), -1);
  EXPECT_EQ(fault_peer_rank(kFaultPeerGlobal + 3, t), 3);  // a rank of node b
  EXPECT_EQ(fault_peer_rank(kFaultPeerGlobal + 5, t), -1);
}

}  // namespace
}  // namespace interlace
