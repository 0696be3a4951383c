// What a Group of several nodes decides before any GPU work (runtime/cross_node_choice.h): the
// cross_node option and its rate, the backend "auto" picks from node and host names, and which
// heaps each rank maps (its node's; with loopback, its host's, and symmetrically so).
#include "interlace/runtime/cross_node_choice.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "error_of.h"
#include "interlace/runtime/topology.h"

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

namespace interlace {
namespace {

using Names = std::vector<std::string>;

TEST(CrossNodeOption, ParsesEveryChoiceAndItsVerbsAlias) {
  EXPECT_EQ(parse_cross_node_choice("auto"), CrossNodeChoice::kAuto);
  EXPECT_EQ(parse_cross_node_choice("loopback"), CrossNodeChoice::kLoopback);
  EXPECT_EQ(parse_cross_node_choice("rc"), CrossNodeChoice::kRc);
  EXPECT_EQ(parse_cross_node_choice("ibverbs"), CrossNodeChoice::kRc);
  EXPECT_EQ(parse_cross_node_choice("srd"), CrossNodeChoice::kSrd);
  EXPECT_EQ(parse_cross_node_choice("efa"), CrossNodeChoice::kSrd);
}

TEST(CrossNodeOption, RefusesUnknownNamesNamingTheChoices) {
  for (const char* bad : {"", "memory", "Loopback", "nccl"}) {
    const std::string why = error_of([&] { parse_cross_node_choice(bad); });
    EXPECT_HAS(why, std::string("got '") + bad + "'");
    EXPECT_HAS(why, "'auto', 'loopback'");
    EXPECT_HAS(why, "'rc'");
    EXPECT_HAS(why, "'srd'");
  }
}

TEST(CrossNodeOption, ChecksTheRate) {
  EXPECT_EQ(error_of([] { check_cross_node_options("auto", 0); }), "");
  EXPECT_EQ(error_of([] { check_cross_node_options("loopback", 50e9); }), "");
  EXPECT_EQ(error_of([] { check_cross_node_options("auto", 50e9); }), "");
  EXPECT_EQ(error_of([] { check_cross_node_options("rc", 0); }), "");
  EXPECT_HAS(error_of([] { check_cross_node_options("loopback", -1); }), "loopback_rate must be a number of bytes");
  EXPECT_HAS(error_of([] { check_cross_node_options("loopback", std::numeric_limits<double>::quiet_NaN()); }),
             "got nan");
  EXPECT_HAS(error_of([] { check_cross_node_options("loopback", std::numeric_limits<double>::infinity()); }),
             "loopback_rate must be");
  EXPECT_HAS(error_of([] { check_cross_node_options("srd", 50e9); }),
             "loopback_rate throttles only the loopback backend, but cross_node is 'srd'");
  EXPECT_HAS(error_of([] { check_cross_node_options("bogus", 0); }), "got 'bogus'");
}

TEST(CrossNodeBackendChoice, AutoIsLoopbackOnOneHostAndRcAcrossHosts) {
  const Names nodes = {"a", "a", "b", "b"};
  EXPECT_EQ(choose_cross_node_backend(CrossNodeChoice::kAuto, nodes, {"h", "h", "h", "h"}), CrossNodeBackend::kLoopback);
  EXPECT_EQ(choose_cross_node_backend(CrossNodeChoice::kAuto, nodes, {"h1", "h1", "h2", "h2"}), CrossNodeBackend::kRc);
  // One rank elsewhere is enough to rule the loopback out.
  EXPECT_EQ(choose_cross_node_backend(CrossNodeChoice::kAuto, nodes, {"h", "h", "h", "x"}), CrossNodeBackend::kRc);
}

TEST(CrossNodeBackendChoice, ExplicitChoicesAreKept) {
  const Names nodes = {"a", "b"};
  EXPECT_EQ(choose_cross_node_backend(CrossNodeChoice::kRc, nodes, {"h", "h"}), CrossNodeBackend::kRc);
  EXPECT_EQ(choose_cross_node_backend(CrossNodeChoice::kSrd, nodes, {"h1", "h2"}), CrossNodeBackend::kSrd);
  EXPECT_EQ(choose_cross_node_backend(CrossNodeChoice::kLoopback, nodes, {"h", "h"}), CrossNodeBackend::kLoopback);
}

TEST(CrossNodeBackendChoice, LoopbackAcrossHostsIsRefusedNamingThem) {
  const std::string why = error_of(
      [] { choose_cross_node_backend(CrossNodeChoice::kLoopback, {"a", "a", "b"}, {"h1", "h1", "h2"}); });
  EXPECT_HAS(why, "cross_node='loopback' needs every rank on one host");
  EXPECT_HAS(why, "rank 0 runs on 'h1' and rank 2 on 'h2'");
  EXPECT_HAS(error_of([] { choose_cross_node_backend(CrossNodeChoice::kAuto, {"a"}, {"h", "h"}); }),
             "1 node names for 2 hostnames");
}

TEST(HeapPeers, OneNodeMapsItsNodeOnly) {
  // Two real nodes: the loopback flag changes nothing, since no two nodes share a host.
  const Names nodes = {"a", "b", "a", "b"}, hosts = {"a", "b", "a", "b"};
  for (bool loopback : {false, true}) {
    EXPECT_EQ(heap_peers(0, nodes, hosts, loopback), (std::vector<int>{0, 2}));
    EXPECT_EQ(heap_peers(3, nodes, hosts, loopback), (std::vector<int>{1, 3}));
  }
}

TEST(HeapPeers, EmulatedNodesMapTheirHostOnlyForLoopback) {
  const Names nodes = {"n0", "n0", "n1", "n1"}, hosts = {"h", "h", "h", "h"};
  EXPECT_EQ(heap_peers(1, nodes, hosts, false), (std::vector<int>{0, 1}));
  EXPECT_EQ(heap_peers(1, nodes, hosts, true), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(heap_peers(2, nodes, hosts, true), (std::vector<int>{0, 1, 2, 3}));
}

TEST(HeapPeers, TwoHostsEachSplitInTwoMapOnlyTheirHost) {
  const Names nodes = {"h1a", "h1b", "h2a", "h2b", "h1a", "h2b"};
  const Names hosts = {"h1", "h1", "h2", "h2", "h1", "h2"};
  EXPECT_EQ(heap_peers(0, nodes, hosts, true), (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(heap_peers(5, nodes, hosts, true), (std::vector<int>{2, 3, 5}));
  EXPECT_EQ(heap_peers(5, nodes, hosts, false), (std::vector<int>{3, 5}));
}

// The fd exchange pairs a giver with a taker: r maps q exactly when q maps r, and every rank maps
// every rank of its node (what NVLink uses) whatever else it maps.
TEST(HeapPeers, AreSymmetricAndCoverTheNode) {
  const Names nodes = {"x", "y", "z", "x", "y", "w", "z"};
  const Names hosts = {"h1", "h1", "h2", "h1", "h1", "h2", "h2"};
  for (bool loopback : {false, true}) {
    for (int r = 0; r < 7; ++r) {
      const auto mine = heap_peers(r, nodes, hosts, loopback);
      for (int local : make_topology(r, nodes).local_ranks) {
        EXPECT_NE(std::find(mine.begin(), mine.end(), local), mine.end()) << r << " misses " << local;
      }
      for (int q = 0; q < 7; ++q) {
        const auto theirs = heap_peers(q, nodes, hosts, loopback);
        const bool r_maps_q = std::find(mine.begin(), mine.end(), q) != mine.end();
        const bool q_maps_r = std::find(theirs.begin(), theirs.end(), r) != theirs.end();
        EXPECT_EQ(r_maps_q, q_maps_r) << r << " and " << q;
      }
    }
  }
  EXPECT_HAS(error_of([] { heap_peers(3, {"a"}, {"h"}, false); }), "heap_peers: rank 3");
}

}  // namespace
}  // namespace interlace
