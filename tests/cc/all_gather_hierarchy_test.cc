// The hierarchical all_gather plan, over every small layout of nodes x local ranks (equal and
// uneven nodes, ranks in node order and interleaved): routes, balance, closed forms against the
// per-rank work lists, and a simulation of the protocol with the network delivering chunks in a
// random order, which must end with every shard everywhere and no flag counting a chunk early.
#include "interlace/ops/all_gather/hierarchy.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "error_of.h"
#include "interlace/ops/all_gather/flags.h"
#include "interlace/runtime/topology.h"
#include "interlace/transport/verbs_backend.h"

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

namespace interlace {
namespace {

// Node names for nodes of the given sizes: node-major ("n0","n0","n1") or dealt out in an
// interleaved, seeded order.
std::vector<std::string> names_for(const std::vector<int>& sizes, bool interleaved, uint64_t seed) {
  std::vector<std::string> names;
  for (size_t n = 0; n < sizes.size(); ++n) {
    for (int i = 0; i < sizes[n]; ++i) names.push_back("n" + std::to_string(n));
  }
  if (interleaved) std::shuffle(names.begin(), names.end(), std::mt19937_64(seed));
  return names;
}

// Every layout of 1..4 nodes of 1..3 ranks, plus equal nodes up to 4 x 8, each in node order
// and interleaved.
std::vector<std::vector<std::string>> small_layouts() {
  std::vector<std::vector<int>> all_sizes;
  for (int n = 1; n <= 4; ++n) {
    std::vector<int> sizes(n, 1);
    while (true) {
      all_sizes.push_back(sizes);
      int i = 0;
      while (i < n && sizes[i] == 3) sizes[i++] = 1;
      if (i == n) break;
      ++sizes[i];
    }
  }
  for (int n = 2; n <= 4; ++n) {
    for (int l = 4; l <= 8; ++l) all_sizes.push_back(std::vector<int>(n, l));
  }
  std::vector<std::vector<std::string>> layouts;
  uint64_t seed = 1;
  for (const auto& sizes : all_sizes) {
    layouts.push_back(names_for(sizes, false, 0));
    layouts.push_back(names_for(sizes, true, seed++));
  }
  return layouts;
}

std::string describe(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += n + " ";
  return s;
}

TEST(NodeLayout, AgreesWithEveryRanksTopology) {
  for (const auto& names : small_layouts()) {
    const NodeLayout l = make_node_layout(names);
    ASSERT_EQ(l.world_size(), static_cast<int>(names.size()));
    for (int r = 0; r < l.world_size(); ++r) {
      const Topology t = make_topology(r, names);
      EXPECT_EQ(l.num_nodes(), t.num_nodes);
      EXPECT_EQ(l.node_of[r], t.node);
      EXPECT_EQ(l.local_of[r], t.local_rank);
      EXPECT_EQ(l.ranks[l.node_of[r]], t.local_ranks);
    }
  }
}

TEST(HierAllGather, EveryShardCrossesTheNetworkOncePerRemoteNodeToABalancedReceiver) {
  for (const auto& names : small_layouts()) {
    SCOPED_TRACE(describe(names));
    const NodeLayout l = make_node_layout(names);
    const int w = l.world_size();
    bool equal = true;
    for (const auto& node : l.ranks) equal = equal && node.size() == l.ranks[0].size();
    std::map<int, int> arrivals;  // network receiver -> shards it takes
    for (int s = 0; s < w; ++s) {
      for (int b = 0; b < l.num_nodes(); ++b) {
        if (b == l.node_of[s]) continue;
        const int receiver = network_receiver(l, s, b);
        ASSERT_EQ(l.node_of[receiver], b);
        if (equal) {
          EXPECT_EQ(l.local_of[receiver], l.local_of[s]) << "equal nodes: rail-aligned";
        }
        ++arrivals[receiver];
        int network_routes = 0;
        for (int r : l.ranks[b]) network_routes += all_gather_route(l, s, r).path == AgPath::kNetwork;
        EXPECT_EQ(network_routes, 1);
      }
    }
    for (int b = 0; b < l.num_nodes(); ++b) {
      int most = 0, least = w;
      for (int r : l.ranks[b]) {
        most = std::max(most, arrivals[r]);
        least = std::min(least, arrivals[r]);
      }
      EXPECT_LE(most - least, 1) << "node " << b;
    }
  }
}

TEST(HierAllGather, RoutesAndTheRanksWorkListsSayTheSame) {
  for (const auto& names : small_layouts()) {
    SCOPED_TRACE(describe(names));
    const NodeLayout l = make_node_layout(names);
    const int w = l.world_size();
    std::vector<AgRankWork> work;
    for (int r = 0; r < w; ++r) work.push_back(all_gather_rank_work(l, r));
    for (int r = 0; r < w; ++r) {
      const AgRankWork& me = work[r];
      EXPECT_EQ(me.nvlink_peers.size() + 1, l.ranks[l.node_of[r]].size());
      EXPECT_EQ(static_cast<int>(me.network_peers.size()), l.num_nodes() - 1);
      EXPECT_EQ(static_cast<int>(me.waits_for.size()), w - 1);
      EXPECT_LE(static_cast<int>(me.relayed.size()), kHierMaxRelayed);
      for (int j = 0; j < static_cast<int>(me.relayed.size()); ++j) {
        const int s = me.relayed[j];
        EXPECT_EQ(relay_slot(l, s, l.node_of[r]), j) << "rank " << r << " relays " << s;
      }
      for (int s = 0; s < w; ++s) {
        const AgRoute route = all_gather_route(l, s, r);
        const bool same_node = l.node_of[s] == l.node_of[r];
        switch (route.path) {
          case AgPath::kSelf:
            EXPECT_EQ(s, r);
            break;
          case AgPath::kNvlink:
            EXPECT_TRUE(same_node && s != r);
            EXPECT_EQ(route.raiser, s);
            EXPECT_EQ(std::count(work[s].nvlink_peers.begin(), work[s].nvlink_peers.end(), r), 1);
            break;
          case AgPath::kNetwork:
            EXPECT_FALSE(same_node);
            EXPECT_EQ(route.network_receiver, r);
            EXPECT_EQ(route.raiser, r);
            EXPECT_EQ(std::count(work[s].network_peers.begin(), work[s].network_peers.end(), r), 1);
            EXPECT_EQ(std::count(me.relayed.begin(), me.relayed.end(), s), 1);
            break;
          case AgPath::kRelay: {
            EXPECT_FALSE(same_node);
            const int via = route.network_receiver;
            EXPECT_NE(via, r);
            EXPECT_EQ(l.node_of[via], l.node_of[r]);
            EXPECT_EQ(route.raiser, via);
            EXPECT_EQ(all_gather_route(l, s, via).path, AgPath::kNetwork);
            EXPECT_EQ(std::count(work[via].relayed.begin(), work[via].relayed.end(), s), 1);
            EXPECT_EQ(std::count(work[via].nvlink_peers.begin(), work[via].nvlink_peers.end(), r), 1);
            break;
          }
        }
        if (s != r) {
          EXPECT_EQ(std::count(me.waits_for.begin(), me.waits_for.end(), s), 1);
        }
      }
      // What crosses the network and NVLink, in shards: closed forms from the lists.
      int network_out = 0, relayed_in = 0;
      for (int q = 0; q < w; ++q) {
        network_out += all_gather_route(l, r, q).path == AgPath::kNetwork;
        relayed_in += all_gather_route(l, q, r).path == AgPath::kNetwork;
      }
      EXPECT_EQ(network_out, l.num_nodes() - 1);
      EXPECT_EQ(relayed_in, static_cast<int>(me.relayed.size()));
    }
  }
}

// The protocol, one chunk operation at a time in a random order among those allowed, for two
// launches (flags only grow). Each rank holds landing slots and the flags of HierAllGatherFlags;
// network requests are in flight until a random step delivers them, bytes then flag.
struct Sim {
  Sim(const NodeLayout& layout, int chunks, uint64_t seed) : l(layout), chunks(chunks), random(seed) {
    const int w = l.world_size();
    has.assign(w, std::vector<std::vector<int>>(w, std::vector<int>(chunks, 0)));
    landed.assign(w, std::vector<uint64_t>(w, 0));
    arrived.assign(w, std::vector<std::vector<uint64_t>>(kHierMaxRelayed, std::vector<uint64_t>(chunks, 0)));
    consumed = arrived;
    base.assign(w, 0);
    for (int r = 0; r < w; ++r) work.push_back(all_gather_rank_work(l, r));
  }

  struct Op {
    enum Kind { kCopyOwn, kNvlinkPut, kPost, kDeliver, kTake } kind;
    int rank, peer, s, c;
  };

  // One launch; false if it stalls (an op waits on something that never comes).
  bool launch() {
    const int w = l.world_size();
    for (int r = 0; r < w; ++r) std::fill(has[r].begin(), has[r].end(), std::vector<int>(chunks, 0));
    std::vector<Op> ready;
    std::vector<Op> blocked;  // takes wait on arrival flags
    for (int r = 0; r < w; ++r) {
      for (int c = 0; c < chunks; ++c) ready.push_back({Op::kCopyOwn, r, -1, r, c});
      for (int j = 0; j < static_cast<int>(work[r].relayed.size()); ++j) {
        for (int c = 0; c < chunks; ++c) blocked.push_back({Op::kTake, r, -1, work[r].relayed[j], c});
      }
    }
    while (!ready.empty() || !blocked.empty()) {
      // Anything a flag now allows moves to ready.
      for (size_t i = 0; i < blocked.size();) {
        if (allowed(blocked[i])) {
          ready.push_back(blocked[i]);
          blocked[i] = blocked.back();
          blocked.pop_back();
        } else {
          ++i;
        }
      }
      if (ready.empty()) return false;
      const size_t pick = std::uniform_int_distribution<size_t>(0, ready.size() - 1)(random);
      const Op op = ready[pick];
      ready[pick] = ready.back();
      ready.pop_back();
      for (const Op& next : run(op)) (allowed(next) ? ready : blocked).push_back(next);
      if (!final_waits_consistent()) return false;
    }
    for (int r = 0; r < w; ++r) base[r] += chunks;
    return true;
  }

  bool allowed(const Op& op) const {
    if (op.kind != Op::kTake) return true;
    const int j = relay_slot(l, op.s, l.node_of[op.rank]);
    return arrived[op.rank][j][op.c] > consumed[op.rank][j][op.c];
  }

  std::vector<Op> run(const Op& op) {
    std::vector<Op> next;
    switch (op.kind) {
      case Op::kCopyOwn:  // into the own landing slot; then it may go out
        has[op.rank][op.rank][op.c] = 1;
        for (int q : work[op.rank].nvlink_peers) next.push_back({Op::kNvlinkPut, op.rank, q, op.rank, op.c});
        for (int q : work[op.rank].network_peers) next.push_back({Op::kPost, op.rank, q, op.rank, op.c});
        break;
      case Op::kNvlinkPut:  // own chunk (rank == s) or a relayed one, then landed[s] on the peer
        EXPECT_TRUE(has[op.rank][op.s][op.c]) << "put of a chunk not there";
        has[op.peer][op.s][op.c] = 1;
        ++landed[op.peer][op.s];
        break;
      case Op::kPost:  // the request sits in the network until a later step delivers it
        EXPECT_TRUE(has[op.rank][op.s][op.c]) << "posted a chunk not in the heap";
        next.push_back({Op::kDeliver, op.rank, op.peer, op.s, op.c});
        break;
      case Op::kDeliver: {  // bytes, then the request's add
        has[op.peer][op.s][op.c] = 1;
        ++arrived[op.peer][relay_slot(l, op.s, l.node_of[op.peer])][op.c];
        break;
      }
      case Op::kTake: {
        const int j = relay_slot(l, op.s, l.node_of[op.rank]);
        EXPECT_TRUE(has[op.rank][op.s][op.c]) << "took a chunk that had not landed";
        consumed[op.rank][j][op.c] = arrived[op.rank][j][op.c];
        ++landed[op.rank][op.s];
        for (int q : work[op.rank].nvlink_peers) next.push_back({Op::kNvlinkPut, op.rank, q, op.s, op.c});
        break;
      }
    }
    return next;
  }

  // Whenever a rank's final wait for s would pass, all of s's chunks are in its landing slot.
  bool final_waits_consistent() const {
    for (int r = 0; r < l.world_size(); ++r) {
      for (int s = 0; s < l.world_size(); ++s) {
        if (s == r || landed[r][s] < base[r] + chunks) continue;
        if (landed[r][s] > base[r] + chunks) return false;
        for (int c = 0; c < chunks; ++c) {
          if (!has[r][s][c]) return false;
        }
      }
    }
    return true;
  }

  const NodeLayout& l;
  const int chunks;
  std::mt19937_64 random;
  std::vector<AgRankWork> work;
  std::vector<std::vector<std::vector<int>>> has;  // [r][s][c]: chunk c of s's shard in r's landing slot
  std::vector<std::vector<uint64_t>> landed;       // [r][s]
  std::vector<std::vector<std::vector<uint64_t>>> arrived, consumed;  // [r][j][c]
  std::vector<uint64_t> base;
};

TEST(HierAllGather, TheProtocolDeliversEveryShardUnderAnyDeliveryOrder) {
  uint64_t seed = 100;
  for (const auto& names : small_layouts()) {
    SCOPED_TRACE(describe(names));
    const NodeLayout l = make_node_layout(names);
    if (l.world_size() > 16) continue;  // the big equal layouts: routes above are enough
    for (int chunks : {1, 3}) {
      Sim sim(l, chunks, seed++);
      for (int launch = 0; launch < 2; ++launch) {
        ASSERT_TRUE(sim.launch()) << "launch " << launch << " stalled or counted a chunk early";
        for (int r = 0; r < l.world_size(); ++r) {
          for (int s = 0; s < l.world_size(); ++s) {
            for (int c = 0; c < chunks; ++c) ASSERT_TRUE(sim.has[r][s][c]);
            if (s != r) {
              ASSERT_EQ(sim.landed[r][s], uint64_t(launch + 1) * chunks);
            }
          }
        }
      }
    }
  }
}

TEST(HierAllGather, ChunksFitTheFlags) {
  const NodeLayout l = make_node_layout({"a", "a", "b", "b"});
  HierAllGatherPlan p = plan_hier_all_gather(l, 0);
  EXPECT_EQ(p.chunks, 0);
  p = plan_hier_all_gather(l, 100);
  EXPECT_EQ(p.chunk_bytes, kHierDefaultChunk);
  EXPECT_EQ(p.chunks, 1);
  p = plan_hier_all_gather(l, 3 * kHierDefaultChunk + 1);
  EXPECT_EQ(p.chunks, 4);
  p = plan_hier_all_gather(l, uint64_t{1} << 30);  // 1 GiB: chunks grow to fit
  EXPECT_EQ(p.chunks, kHierMaxChunks);
  EXPECT_EQ(p.chunk_bytes, (uint64_t{1} << 30) / kHierMaxChunks);
  p = plan_hier_all_gather(l, (uint64_t{1} << 30) + 1);
  EXPECT_EQ(p.chunk_bytes % 16, 0u);
  EXPECT_LE(p.chunks, kHierMaxChunks);
  EXPECT_GE(p.chunk_bytes * p.chunks, (uint64_t{1} << 30) + 1);
  p = plan_hier_all_gather(l, 1000, 16);
  EXPECT_EQ(p.chunks, 63);
  EXPECT_HAS(error_of([&] { plan_hier_all_gather(l, 2000, 16); }), "is 125 chunks, more than the 64");
  EXPECT_HAS(error_of([&] { plan_hier_all_gather(l, 1000, 24 + 1); }), "multiple of 16, got 25");
  // One rank per node for 200 nodes: 199 shards to relay each, past the slots.
  std::vector<std::string> many;
  for (int i = 0; i < 200; ++i) many.push_back("n" + std::to_string(i));
  EXPECT_HAS(error_of([&] { plan_hier_all_gather(make_node_layout(many), 1024); }), "relay slots per rank");
}

TEST(HierAllGather, FlagsLieInAllGathersRegionAfterTheFlatOnesAndTravelInSrdsImmediate) {
  const uint64_t region = offsetof(SignalPad, regions);
  const uint64_t flat_end = region + sizeof(AllGatherFlags);
  const uint64_t region_end = region + kOpRegionBytes;
  std::set<uint64_t> seen;
  auto check = [&](uint64_t off) {
    EXPECT_EQ(off % 8, 0u);
    EXPECT_GE(off, flat_end);
    EXPECT_LT(off + 8, region_end + 1);
    EXPECT_LT(off, SrdBackend::kMaxFlagOffset);
    EXPECT_TRUE(seen.insert(off).second) << "two flags at " << off;
  };
  for (int s = 0; s < kHierMaxRanks; s += 37) check(hier_landed_offset(s));
  check(hier_landed_offset(kHierMaxRanks - 1));
  for (int j = 0; j < kHierMaxRelayed; j += 5) {
    for (int c = 0; c < kHierMaxChunks; c += 3) check(hier_arrived_offset(j, c));
  }
  check(hier_arrived_offset(kHierMaxRelayed - 1, kHierMaxChunks - 1));
  EXPECT_HAS(error_of([] { hier_landed_offset(kHierMaxRanks); }), "no landed flag for rank 8192");
  EXPECT_HAS(error_of([] { hier_arrived_offset(0, kHierMaxChunks); }), "no arrival flag");
}

}  // namespace
}  // namespace interlace
