#include "interlace/runtime/cross_node_path.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "interlace/base/cuda.h"
#include "interlace/transport/cross_node_proxy.h"
#include "interlace/transport/cuda_loopback_engine.h"

namespace interlace {
using detail::concat;

namespace {

template <class T>
T* device_pointer(T* host) {
  void* p = nullptr;
  IL_CUDA_CHECK(cudaHostGetDevicePointer(&p, host, 0));
  return static_cast<T*>(p);
}

}  // namespace

CrossNodePath::CrossNodePath(const Topology& topo, Bootstrap& bootstrap, SymmetricHeap& heap, int device,
                             const HostControl* control, CrossNodePathOptions o)
    : device_(device), capacity_(o.fifo_capacity), timeout_ns_(o.timeout_ns) {
  IL_CHECK(capacity_ > 0 && (capacity_ & (capacity_ - 1)) == 0, "rank ", topo.rank,
           ": the proxy FIFO's capacity must be a power of two, got ", capacity_);
  DeviceGuard guard(device);
  // A constructor that throws runs no destructor: release what was made so far.
  struct Undo {
    CrossNodePath* self;
    bool armed = true;
    ~Undo() {
      if (armed) self->release();
    }
  } undo{this};

  const size_t slot_bytes = sizeof(ProxyRequest) * capacity_;
  IL_CUDA_CHECK(cudaHostAlloc(&host_memory_, slot_bytes + 64, cudaHostAllocMapped));
  std::memset(host_memory_, 0, slot_bytes + 64);
  slots_ = static_cast<ProxyRequest*>(host_memory_);
  consumed_ = reinterpret_cast<uint64_t*>(static_cast<char*>(host_memory_) + slot_bytes);
  IL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&claimed_), sizeof(uint64_t)));
  IL_CUDA_CHECK(cudaMemset(claimed_, 0, sizeof(uint64_t)));
  IL_CUDA_CHECK(cudaDeviceSynchronize());

  const uint64_t heap_bytes = heap.mapped_bytes();
  // The heap's dmabuf, if exported: closed once the proxy is set up (the registration holds the
  // memory, not the fd), or when setup fails.
  struct FdCloser {
    int fd = -1;
    ~FdCloser() {
      if (fd >= 0) close(fd);
    }
  } dmabuf;
  CrossNodeOptions c;
  c.backend = o.backend;
  c.queue = ProxyQueue{slots_, consumed_, capacity_};
  c.on_failure = std::move(o.on_failure);
  char* const my_heap = heap.local_base();
  switch (o.backend) {
    case CrossNodeBackend::kLoopback:
      engine_ = std::make_unique<CudaLoopbackEngine>(device);
      c.engine = engine_.get();
      c.heaps = heap.bases_by_rank();
      c.heap_bytes = heap_bytes;
      c.loopback.rate_bytes_per_s = o.loopback_rate_bytes_per_s;
      break;
    case CrossNodeBackend::kSrd:
      // Arriving flags are added on the engine's stream, so in the order their writes completed.
      engine_ = std::make_unique<CudaLoopbackEngine>(device);
      // The backend cannot see the engine fail, so the sink reports it (once) as the proxy would.
      c.flag_sink = [engine = engine_.get(), my_heap, report = c.on_failure, reported = false](
                        uint64_t offset, uint64_t add) mutable {
        engine->add(reinterpret_cast<uint64_t*>(my_heap + offset), add);
        if (reported || engine->failure().empty()) return;
        reported = true;
        if (report) report(concat("adding an arriving flag into the GPU heap failed: ", engine->failure()));
      };
      [[fallthrough]];
    case CrossNodeBackend::kRc:
      // Registered through a dmabuf of the heap where the GPU exports one, else by address (GPU
      // memory then needs nvidia-peermem); the error, if both fail, says why there was no dmabuf.
      c.ibv.heap_address = reinterpret_cast<uint64_t>(my_heap);
      c.ibv.heap_bytes = heap_bytes;
      c.ibv.dmabuf_fd = dmabuf.fd = heap.export_dmabuf(&c.ibv.no_dmabuf);
      c.all_gather = [&bootstrap](const std::string& mine) { return bootstrap.all_gather(mine); };
      break;
    case CrossNodeBackend::kMemory:
      IL_FAIL("rank ", topo.rank, ": the memory backend is for CPU tests, not a Group");
  }
  proxy_ = std::make_unique<CrossNodeProxy>(topo, std::move(c));

  transport_.fifo = ProxyFifo{device_pointer(slots_), claimed_, device_pointer(consumed_), capacity_};
  transport_.heap = my_heap;
  transport_.heap_bytes = heap_bytes;
  transport_.timeout_ns = timeout_ns_;
  transport_.host_abort = &control->abort;
  transport_.device_aborted = &reinterpret_cast<SignalPad*>(my_heap)->ops.aborted;
  undo.armed = false;
}

CrossNodePath::~CrossNodePath() { release(); }

void CrossNodePath::release() {
  proxy_.reset();   // joins the thread first: nothing runs against what follows
  engine_.reset();  // waits for its stream: copies issued have landed
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  if (claimed_) cudaFree(claimed_);
  if (host_memory_) cudaFreeHost(host_memory_);
  claimed_ = nullptr;
  host_memory_ = nullptr;
  if (previous >= 0) cudaSetDevice(previous);
}

void CrossNodePath::abandon_writes() { proxy_->stop(/*settle=*/false); }

CrossNodeBackend CrossNodePath::backend() const { return proxy_->backend_kind(); }

std::string CrossNodePath::failure() const { return proxy_->failure(); }

PostResult CrossNodePath::post_from_host(const ProxyRequest& request, const volatile int32_t* host_abort) {
  DeviceGuard guard(device_);
  uint64_t claimed = 0;
  IL_CUDA_CHECK(cudaMemcpy(&claimed, claimed_, sizeof claimed, cudaMemcpyDeviceToHost));
  const ProxyFifo host_fifo{slots_, &claimed, consumed_, capacity_};
  const PostResult result = proxy_post(host_fifo, request, timeout_ns_, [host_abort] { return *host_abort != 0; });
  IL_CUDA_CHECK(cudaMemcpy(claimed_, &claimed, sizeof claimed, cudaMemcpyHostToDevice));
  return result;
}

bool CrossNodePath::drain(double timeout_s) {
  uint64_t claimed = 0;
  {
    DeviceGuard guard(device_);
    if (cudaMemcpy(&claimed, claimed_, sizeof claimed, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (__atomic_load_n(consumed_, __ATOMIC_ACQUIRE) < claimed) {
    if (!failure().empty() || std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace interlace
