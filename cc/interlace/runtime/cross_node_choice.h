// The decisions a Group makes about its ranks on other nodes before any GPU work, kept free of CUDA
// so that the CPU tests cover them: which backend the `cross_node` option means for these nodes and
// hosts, and which ranks' heaps each process maps.
//
// Node names say which ranks share NVLink; hostnames say which ranks share a machine. They differ
// when GPUs of one host act as separate nodes (node_name= per rank): the loopback backend then
// carries the "network" writes as copies between heaps of the host, so each process must map every
// heap of its host, while ops' NVLink paths still see only their own node's ranks.
#pragma once

#include <string>
#include <vector>

#include "interlace/transport/cross_node_proxy.h"

namespace interlace {

enum class CrossNodeChoice {
  kAuto,      // loopback when every rank is on one host, else ibverbs RC
  kLoopback,
  kRc,
  kSrd,
};

// "auto", "loopback", "rc" (or "ibverbs"), "srd" (or "efa"); raises naming the choices otherwise.
CrossNodeChoice parse_cross_node_choice(const std::string& name);

// Raises, before anything is created, if the option or the loopback rate (bytes/s, 0: unthrottled)
// is not valid; a rate with a backend that cannot be throttled is refused rather than ignored.
void check_cross_node_options(const std::string& cross_node, double loopback_rate_bytes_per_s);

// The backend for a group whose ranks have these node and host names (indexed by rank; more than
// one node). An explicit loopback over several hosts is refused, naming two ranks on different
// hosts: its copies need every heap in one machine.
CrossNodeBackend choose_cross_node_backend(CrossNodeChoice choice, const std::vector<std::string>& node_names,
                                           const std::vector<std::string>& hostnames);

// The global ranks, ascending and `rank` included, whose heaps `rank` maps: its node's, and with
// the loopback backend every rank of its host. The relation is symmetric, so the processes that
// exchange memory handles agree on who gives and takes.
std::vector<int> heap_peers(int rank, const std::vector<std::string>& node_names,
                            const std::vector<std::string>& hostnames, bool loopback);

}  // namespace interlace
