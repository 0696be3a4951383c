#include "interlace/runtime/kernels_across_nodes.h"

#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include "interlace/base/cuda.h"

namespace interlace {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<const void*> kernels;
};

Registry& registry() {
  static Registry r;  // built on first use: registrations run during static initialisation
  return r;
}

}  // namespace

bool register_kernels_across_nodes(std::initializer_list<const void*> kernels) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.kernels.insert(r.kernels.end(), kernels.begin(), kernels.end());
  return true;
}

void load_kernels_across_nodes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  cudaFuncAttributes attributes;
  for (const void* kernel : r.kernels) IL_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
}

}  // namespace interlace
