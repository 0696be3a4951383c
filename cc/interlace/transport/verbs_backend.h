// The network backends of the proxy, over the Verbs interface.
//
//   RcBackend (InfiniBand / RoCE reliable connection): the bytes go as an RDMA WRITE and the flag
//   as a fenced, signaled FETCH_AND_ADD on the same queue pair, which the responder executes after
//   the write has landed. No work on the receiving side.
//
//   SrdBackend (EFA's scalable reliable datagrams): delivery is unordered, so the flag cannot
//   follow the bytes on the wire. The bytes go as an RDMA WRITE with immediate data naming the flag
//   and the amount; the receiver's proxy adds it once the write's completion says the bytes have
//   landed (through a FlagSink: into the GPU heap, in stream order).
//
// Both keep the send queues from overflowing (post() refuses when a queue is full: backpressure to
// the GPU) and turn a failed completion into failure(), naming the peer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "interlace/transport/proxy_backend.h"
#include "interlace/transport/verbs.h"

namespace interlace {

class RcBackend : public ProxyBackend {
 public:
  RcBackend(int my_rank, Verbs& verbs);
  bool post(const ProxyWrite& w) override;
  bool progress() override;
  std::string failure() const override { return failure_; }
  // Writes whose signaled work request (the add) has not completed yet.
  uint64_t outstanding() const override { return outstanding_; }

 private:
  int my_rank_;
  Verbs& verbs_;
  uint64_t next_id_ = 0;
  uint64_t outstanding_ = 0;
  std::string failure_;
};

// Where an SRD receiver puts a flag's increments: the GPU heap, written by the receiver's proxy.
using FlagSink = std::function<void(uint64_t flag_offset, uint64_t add)>;

class SrdBackend : public ProxyBackend {
 public:
  // Immediate data is 32 bits: the flag's index in 8-byte words (flags live in the signal pad, at
  // the start of the heap) and the amount to add.
  static constexpr int kAddBits = 8;
  static constexpr uint64_t kMaxAdd = (uint64_t{1} << kAddBits) - 1;
  static constexpr uint64_t kMaxFlagOffset = (uint64_t{1} << (32 - kAddBits)) * 8;

  SrdBackend(int my_rank, Verbs& verbs, FlagSink sink, int receive_slots);
  bool post(const ProxyWrite& w) override;
  bool progress() override;
  std::string failure() const override { return failure_; }
  // Writes whose send completion has not been polled yet (receives are not counted: they are the
  // peers' writes, which their own teardown waits for).
  uint64_t outstanding() const override { return outstanding_; }

  static uint32_t encode(uint64_t flag_offset, uint64_t add) {
    return static_cast<uint32_t>((flag_offset / 8) << kAddBits | add);
  }
  static void decode(uint32_t imm, uint64_t* flag_offset, uint64_t* add) {
    *flag_offset = uint64_t{imm >> kAddBits} * 8;
    *add = imm & kMaxAdd;
  }

 private:
  int my_rank_;
  Verbs& verbs_;
  FlagSink sink_;
  uint64_t next_id_ = 0;
  uint64_t outstanding_ = 0;
  std::string failure_;
};

}  // namespace interlace
