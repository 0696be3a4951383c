// The kernels that may run on a group of several nodes, loaded when such a group is created.
//
// CUDA loads a kernel lazily by default (CUDA_MODULE_LOADING=LAZY): at its first launch or query,
// and the load may wait for the kernels running in the context. A kernel across nodes waits for its
// proxy thread, whose CUDA calls (the loopback backend's copies and flag writes) wait behind that
// load in turn. Two calls queued back to back, the second's kernel not yet loaded, then never finish
// (seen on two H200s: reduce_scatter then all_reduce, both ranks stuck at their first flag). Loading
// every such kernel before any of them runs takes the loads of a group of several nodes out of the
// way; any other kernel loaded lazily beside its ops (another group's, a plain gemm's, the caller's)
// can still stall them on the loopback and SRD backends (README, running across nodes).
#pragma once

#include <initializer_list>

namespace interlace {

// Adds kernels (their host stubs) to the list. Returns true, so that an op's launch file can register
// from a namespace-scope initialiser, next to the kernels it launches.
bool register_kernels_across_nodes(std::initializer_list<const void*> kernels);

// Loads every registered kernel on the current device. Raises on a CUDA error.
void load_kernels_across_nodes();

}  // namespace interlace
