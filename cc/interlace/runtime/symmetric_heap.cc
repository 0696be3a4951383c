#include "interlace/runtime/symmetric_heap.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "interlace/base/cuda.h"
#include "interlace/runtime/fd_exchange.h"

namespace interlace {
namespace {

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

constexpr double kHandleExchangeTimeoutS = 30.0;

}  // namespace

SymmetricHeap::SymmetricHeap(Bootstrap& bootstrap, const Topology& topo, int device, size_t bytes,
                             std::vector<int> mapped_ranks, bool rdma)
    : device_(device), local_rank_(topo.local_rank), usable_bytes_(bytes), mapped_ranks_(std::move(mapped_ranks)) {
  if (mapped_ranks_.empty()) mapped_ranks_ = topo.local_ranks;
  for (int r : topo.local_ranks) {
    IL_CHECK(std::binary_search(mapped_ranks_.begin(), mapped_ranks_.end(), r), "rank ", topo.rank,
             ": the heaps to map must include every rank of its node (rank ", r, " is missing)");
  }
  // Same size everywhere, checked before any allocation.
  auto sizes = bootstrap.all_gather(std::to_string(bytes));
  for (int r = 0; r < topo.world_size; ++r) {
    IL_CHECK(sizes[r] == sizes[topo.rank], "symmetric heap sizes differ across ranks: rank ", topo.rank, " asked for ",
             bytes, " bytes, rank ", r, " for ", sizes[r], "; every rank must pass the same heap_bytes");
  }
  IL_CHECK(topo.local_size() <= kMaxLocalRanks, "at most ", kMaxLocalRanks, " ranks per node are supported, got ",
           topo.local_size());
  const DriverApi& cu = driver();
  IL_CUDA_CHECK(cudaSetDevice(device));

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (rdma) {
    int vmm_rdma = 0;
    IL_CU_CHECK(cu.cuDeviceGetAttribute(&vmm_rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device));
    prop.allocFlags.gpuDirectRDMACapable = vmm_rdma ? 1 : 0;
  }
  size_t granularity = 0;
  IL_CU_CHECK(cu.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  data_offset_ = round_up(sizeof(SignalPad), HeapAllocator::kAlignment);
  mapped_bytes_ = round_up(data_offset_ + bytes, granularity);
  usable_bytes_ = mapped_bytes_ - data_offset_;

  CUmemGenericAllocationHandle handle;
  CUresult created = cu.cuMemCreate(&handle, mapped_bytes_, &prop, 0);
  IL_CHECK(created == CUDA_SUCCESS, "rank ", topo.rank, ": cannot allocate a symmetric heap of ", mapped_bytes_,
           " bytes on GPU ", device, " (CUresult ", static_cast<int>(created), "); pass a smaller heap_bytes");
  handle_ = handle;

  int my_fd = -1;
  IL_CU_CHECK(cu.cuMemExportToShareableHandle(&my_fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  std::vector<int> fds;
  try {
    fds = exchange_fds(bootstrap, topo.rank, mapped_ranks_, my_fd, kHandleExchangeTimeoutS);
  } catch (...) {
    ::close(my_fd);
    cu.cuMemRelease(handle);
    throw;
  }
  ::close(my_fd);

  const int n = static_cast<int>(mapped_ranks_.size());
  peer_handles_.assign(n, 0);
  mapped_.assign(n, nullptr);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int p = 0; p < n; ++p) {
    CUmemGenericAllocationHandle h = handle;
    if (mapped_ranks_[p] != topo.rank) {
      IL_CU_CHECK(cu.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[p])),
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      ::close(fds[p]);
      peer_handles_[p] = h;
    }
    CUdeviceptr ptr = 0;
    IL_CU_CHECK(cu.cuMemAddressReserve(&ptr, mapped_bytes_, granularity, 0, 0));
    mapped_[p] = reinterpret_cast<char*>(ptr);
    IL_CU_CHECK(cu.cuMemMap(ptr, mapped_bytes_, 0, h, 0));
    IL_CU_CHECK(cu.cuMemSetAccess(ptr, mapped_bytes_, &access, 1));
  }
  by_rank_.assign(topo.world_size, nullptr);
  for (int p = 0; p < n; ++p) by_rank_[mapped_ranks_[p]] = mapped_[p];
  bases_.assign(topo.local_size(), nullptr);
  for (int p = 0; p < topo.local_size(); ++p) bases_[p] = by_rank_[topo.local_ranks[p]];

  // Flags start at zero on every rank before any peer may write them.
  IL_CUDA_CHECK(cudaMemset(bases_[local_rank_], 0, data_offset_));
  IL_CUDA_CHECK(cudaDeviceSynchronize());
  bootstrap.barrier();
  allocator_ = std::make_unique<HeapAllocator>(data_offset_, usable_bytes_);
}

SymmetricHeap::~SymmetricHeap() {
  const DriverApi& cu = driver();
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (size_t p = 0; p < mapped_.size(); ++p) {
    if (!mapped_[p]) continue;
    auto ptr = reinterpret_cast<CUdeviceptr>(mapped_[p]);
    cu.cuMemUnmap(ptr, mapped_bytes_);
    cu.cuMemAddressFree(ptr, mapped_bytes_);
    if (peer_handles_[p]) cu.cuMemRelease(peer_handles_[p]);
  }
  if (handle_) cu.cuMemRelease(handle_);
  if (previous >= 0) cudaSetDevice(previous);
}

int SymmetricHeap::export_dmabuf(std::string* why) const {
  const DriverApi& cu = driver();
  int supported = 0;
  if (cu.cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, device_) != CUDA_SUCCESS || !supported) {
    *why = "this GPU or driver cannot export a dmabuf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)";
    return -1;
  }
  int fd = -1;
  const CUresult res = cu.cuMemGetHandleForAddressRange(&fd, reinterpret_cast<CUdeviceptr>(local_base()), mapped_bytes_,
                                                        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (res != CUDA_SUCCESS) {
    const char* text = nullptr;
    cu.cuGetErrorString(res, &text);
    *why = std::string("exporting the heap as a dmabuf failed (cuMemGetHandleForAddressRange: ") +
           (text ? text : "unknown error") + ")";
    return -1;
  }
  return fd;
}

long long SymmetricHeap::offset_of(const void* ptr, size_t bytes) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  auto base = reinterpret_cast<uintptr_t>(local_base());
  if (p < base + data_offset_ || p + bytes > base + mapped_bytes_) return -1;
  return static_cast<long long>(p - base);
}

}  // namespace interlace
