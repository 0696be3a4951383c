// SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104) and kernel randomness: what the bootstrap's
// challenge-response needs, and no more. Written for clarity, not speed: a rendezvous hashes a few
// hundred bytes per rank.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace interlace {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  Digest finish();

 private:
  void compress(const uint8_t* block);

  uint32_t state_[8];
  uint8_t block_[64];
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(const std::string& data);
Digest hmac_sha256(const std::string& key, const std::string& message);

// Compares without an early exit, so the time taken says nothing about where the inputs differ.
bool equal_in_constant_time(const void* a, const void* b, size_t size);

// Fills `data` from the kernel's CSPRNG (getrandom, else /dev/urandom); raises if neither works.
void fill_random(void* data, size_t size);

}  // namespace interlace
