#include "gtest/gtest.h"
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

}  // namespace
}  // namespace interlace
