#include "interlace/runtime/cross_node_choice.h"

#include <cmath>

#include "interlace/base/error.h"

namespace interlace {

CrossNodeChoice parse_cross_node_choice(const std::string& name) {
  if (name == "auto") return CrossNodeChoice::kAuto;
  if (name == "loopback") return CrossNodeChoice::kLoopback;
  if (name == "rc" || name == "ibverbs") return CrossNodeChoice::kRc;
  if (name == "srd" || name == "efa") return CrossNodeChoice::kSrd;
  IL_FAIL("cross_node must be 'auto', 'loopback' (GPUs of one host as nodes), 'rc' (InfiniBand / RoCE) or 'srd' ",
          "(EFA), got '", name, "'");
}

void check_cross_node_options(const std::string& cross_node, double rate) {
  const CrossNodeChoice choice = parse_cross_node_choice(cross_node);
  IL_CHECK(std::isfinite(rate) && rate >= 0, "loopback_rate must be a number of bytes per second >= 0 (0: ",
           "unthrottled; 50e9 for a 400 Gb/s NIC), got ", rate);
  IL_CHECK(rate == 0 || choice == CrossNodeChoice::kAuto || choice == CrossNodeChoice::kLoopback,
           "loopback_rate throttles only the loopback backend, but cross_node is '", cross_node, "'");
}

namespace {

// The first rank on another host than rank 0, or -1 when all share it.
int first_other_host(const std::vector<std::string>& hostnames) {
  for (size_t r = 1; r < hostnames.size(); ++r) {
    if (hostnames[r] != hostnames[0]) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace

CrossNodeBackend choose_cross_node_backend(CrossNodeChoice choice, const std::vector<std::string>& node_names,
                                           const std::vector<std::string>& hostnames) {
  IL_CHECK(node_names.size() == hostnames.size() && !node_names.empty(), "choose_cross_node_backend: ",
           node_names.size(), " node names for ", hostnames.size(), " hostnames");
  const int other = first_other_host(hostnames);
  switch (choice) {
    case CrossNodeChoice::kAuto: return other < 0 ? CrossNodeBackend::kLoopback : CrossNodeBackend::kRc;
    case CrossNodeChoice::kRc: return CrossNodeBackend::kRc;
    case CrossNodeChoice::kSrd: return CrossNodeBackend::kSrd;
    case CrossNodeChoice::kLoopback: break;
  }
  IL_CHECK(other < 0, "cross_node='loopback' needs every rank on one host, but rank 0 runs on '", hostnames[0],
           "' and rank ", other, " on '", hostnames[other], "'; use 'rc' or 'srd' across hosts");
  return CrossNodeBackend::kLoopback;
}

std::vector<int> heap_peers(int rank, const std::vector<std::string>& node_names,
                            const std::vector<std::string>& hostnames, bool loopback) {
  IL_CHECK(node_names.size() == hostnames.size() && rank >= 0 && rank < static_cast<int>(node_names.size()),
           "heap_peers: rank ", rank, " of ", node_names.size(), " node names and ", hostnames.size(), " hostnames");
  std::vector<int> peers;
  for (int r = 0; r < static_cast<int>(node_names.size()); ++r) {
    const bool same_node = node_names[r] == node_names[rank];
    const bool same_host = hostnames[r] == hostnames[rank];
    if (same_node || (loopback && same_host)) peers.push_back(r);
  }
  return peers;
}

}  // namespace interlace
