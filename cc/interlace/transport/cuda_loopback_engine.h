// The loopback backend's engine on a GPU (see loopback_backend.h): the GPU that owns the source
// heap copies into a peer GPU's heap on a stream of its own, then adds to the flag there.
//
//   copy:   cudaMemcpyAsync on the engine's stream (a copy engine, over NVLink between peers).
//   add:    a one-thread kernel on that stream: red.release.sys.global.add.u64 on the flag. The
//           stream starts it only once the copy before it has completed, so a receiver that sees
//           the count sees the bytes: the order of an RDMA write then a fenced flag write.
//   record: an event from a pool, recorded on the stream; done() queries it, and returns it to the
//           pool once it has completed. Events are made only while the pool grows to the most
//           writes ever out at once (the backend's max_in_flight): none per write after that.
//           Asked in issue order (as the backend does), done() queries the stream's events only
//           up to the first one pending: one or two queries per progress(), not one per write.
//
// The stream is non-blocking (it never waits on the legacy default stream) and is the only thing
// the engine ever waits for: it does not synchronize the device, so kernels spinning on flags
// keep running. CUDA errors latch into failure() naming the call; nothing throws after the
// constructor. Calls switch to the engine's device for their duration and switch back.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "interlace/transport/loopback_backend.h"

namespace interlace {

class CudaLoopbackEngine : public LoopbackEngine {
 public:
  // `device` owns the source heap; the peers' heaps must be reachable from it (peer access, or
  // the group's mappings). Raises interlace::Error when the stream cannot be made.
  explicit CudaLoopbackEngine(int device);
  ~CudaLoopbackEngine() override;
  CudaLoopbackEngine(const CudaLoopbackEngine&) = delete;
  CudaLoopbackEngine& operator=(const CudaLoopbackEngine&) = delete;

  void copy(char* dst, const char* src, uint64_t bytes) override;
  void add(uint64_t* flag, uint64_t value) override;
  Ticket record() override;
  bool done(Ticket ticket) override;
  std::string failure() const override { return failure_; }

  cudaStream_t stream() const { return stream_; }
  size_t events_made() const { return events_.size(); }

 private:
  // Switches to device_ (and back when done); false, with failure_ set, if that fails.
  class OnDevice;
  bool ok(cudaError_t err, const char* what);  // latches err into failure_; true on cudaSuccess

  const int device_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;  // every event made; a Ticket indexes it
  std::vector<Ticket> free_;         // events not recorded, or recorded and seen done
  std::vector<uint64_t> sequence_;   // per event: the write it was last recorded for, in issue order
  uint64_t next_sequence_ = 0;
  static constexpr uint64_t kNonePending = ~uint64_t{0};
  uint64_t first_pending_ = kNonePending;  // the earliest write last seen not done
  std::string failure_;
};

}  // namespace interlace
