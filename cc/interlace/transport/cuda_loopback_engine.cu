#include "interlace/transport/cuda_loopback_engine.h"

#include "interlace/base/cuda.h"
#include "interlace/base/error.h"

namespace interlace {
using detail::concat;
namespace {

constexpr LoopbackEngine::Ticket kNoTicket = ~LoopbackEngine::Ticket{0};

// The flag write that follows a copy: the stream starts this only after the copy has completed.
// Release at system scope, so a kernel on the peer GPU that acquires the flag, or the host, sees
// the count no earlier than the bytes.
__global__ void __launch_bounds__(1) loopback_flag_add(uint64_t* flag, uint64_t value) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

}  // namespace

class CudaLoopbackEngine::OnDevice {
 public:
  explicit OnDevice(CudaLoopbackEngine& engine) : engine_(engine) {
    if (!engine.failure_.empty() || !engine.ok(cudaGetDevice(&previous_), "cudaGetDevice")) return;
    ready_ = previous_ == engine.device_ || engine.ok(cudaSetDevice(engine.device_), "cudaSetDevice");
  }
  ~OnDevice() {
    if (ready_ && previous_ != engine_.device_) cudaSetDevice(previous_);
  }
  explicit operator bool() const { return ready_; }

 private:
  CudaLoopbackEngine& engine_;
  int previous_ = -1;
  bool ready_ = false;
};

CudaLoopbackEngine::CudaLoopbackEngine(int device) : device_(device) {
  DeviceGuard guard(device);
  IL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // Load the flag kernel now. Under lazy loading (CUDA's default) its first launch would load it,
  // which may wait for the context's running kernels: an op kernel waiting for this very flag.
  cudaFuncAttributes attributes;
  IL_CUDA_CHECK(cudaFuncGetAttributes(&attributes, loopback_flag_add));
}

CudaLoopbackEngine::~CudaLoopbackEngine() {
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
  // Only this stream is waited for: its copies read and write heaps that may be freed next.
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  cudaStreamDestroy(stream_);
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

bool CudaLoopbackEngine::ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  if (failure_.empty()) {
    failure_ = concat("GPU ", device_, ": ", what, " failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                      ")");
  }
  return false;
}

void CudaLoopbackEngine::copy(char* dst, const char* src, uint64_t bytes) {
  OnDevice on(*this);
  if (!on) return;
  // cudaMemcpyDefault: unified addressing finds both devices; between peers it is a direct copy.
  ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync (the write's bytes)");
}

void CudaLoopbackEngine::add(uint64_t* flag, uint64_t value) {
  OnDevice on(*this);
  if (!on) return;
  void* args[] = {&flag, &value};
  ok(cudaLaunchKernel(reinterpret_cast<const void*>(&loopback_flag_add), dim3(1), dim3(1), args, 0, stream_),
     "launching the flag add");
}

LoopbackEngine::Ticket CudaLoopbackEngine::record() {
  OnDevice on(*this);
  if (!on) return kNoTicket;
  if (free_.empty()) {
    cudaEvent_t event;
    if (!ok(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags")) return kNoTicket;
    events_.push_back(event);
    sequence_.push_back(0);
    free_.push_back(static_cast<Ticket>(events_.size() - 1));
  }
  const Ticket ticket = free_.back();
  if (!ok(cudaEventRecord(events_[ticket], stream_), "cudaEventRecord")) return kNoTicket;
  free_.pop_back();
  sequence_[ticket] = next_sequence_++;
  return ticket;
}

bool CudaLoopbackEngine::done(Ticket ticket) {
  if (ticket >= events_.size()) return false;  // kNoTicket: the engine has failed
  // One stream completes in order: behind a write seen pending, every later one is pending too.
  // Saying so without asking is only ever late, never wrong, and spares a query per write out.
  if (sequence_[ticket] > first_pending_) return false;
  OnDevice on(*this);
  if (!on) return false;
  const cudaError_t state = cudaEventQuery(events_[ticket]);
  if (state == cudaErrorNotReady) {
    first_pending_ = sequence_[ticket];
    return false;
  }
  if (!ok(state, "a write on the loopback stream (cudaEventQuery)")) return false;
  if (sequence_[ticket] == first_pending_) first_pending_ = kNonePending;
  free_.push_back(ticket);
  return true;
}

}  // namespace interlace
