#include "interlace/runtime/hmac.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>

#include "interlace/base/error.h"

namespace interlace {
namespace {

// FIPS 180-4, 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64
// primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

constexpr size_t kBlockBytes = 64;

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

inline void store_be32(uint8_t* p, uint32_t x) {
  p[0] = static_cast<uint8_t>(x >> 24);
  p[1] = static_cast<uint8_t>(x >> 16);
  p[2] = static_cast<uint8_t>(x >> 8);
  p[3] = static_cast<uint8_t>(x);
}

}  // namespace

Sha256::Sha256()
    : state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::compress(const uint8_t* block) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) w[t] = load_be32(block + 4 * t);
  for (int t = 16; t < 64; ++t) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[t] + w[t];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void* data, size_t size) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  while (size > 0) {
    size_t take = std::min(size, kBlockBytes - block_used_);
    memcpy(block_ + block_used_, p, take);
    block_used_ += take;
    p += take;
    size -= take;
    if (block_used_ == kBlockBytes) {
      compress(block_);
      block_used_ = 0;
    }
  }
}

Digest Sha256::finish() {
  // Padding (FIPS 180-4, 5.1.1): a 1 bit, zeros up to 56 mod 64 bytes, the length in bits.
  const uint64_t total_bits = total_bytes_ * 8;
  const uint8_t one = 0x80;
  update(&one, 1);
  const uint8_t zero = 0;
  while (block_used_ != kBlockBytes - 8) update(&zero, 1);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(total_bits >> (56 - 8 * i));
  update(length, sizeof(length));
  Digest out;
  for (int i = 0; i < 8; ++i) store_be32(out.data() + 4 * i, state_[i]);
  return out;
}

Digest sha256(const std::string& data) {
  Sha256 h;
  h.update(data.data(), data.size());
  return h.finish();
}

Digest hmac_sha256(const std::string& key, const std::string& message) {
  // RFC 2104: a key longer than a block is hashed first; shorter ones are padded with zeros.
  uint8_t block_key[kBlockBytes] = {};
  if (key.size() > kBlockBytes) {
    Digest hashed = sha256(key);
    memcpy(block_key, hashed.data(), hashed.size());
  } else {
    memcpy(block_key, key.data(), key.size());
  }
  uint8_t inner_pad[kBlockBytes];
  uint8_t outer_pad[kBlockBytes];
  for (size_t i = 0; i < kBlockBytes; ++i) {
    inner_pad[i] = block_key[i] ^ 0x36;
    outer_pad[i] = block_key[i] ^ 0x5c;
  }
  Sha256 inner;
  inner.update(inner_pad, sizeof(inner_pad));
  inner.update(message.data(), message.size());
  Digest inner_digest = inner.finish();
  Sha256 outer;
  outer.update(outer_pad, sizeof(outer_pad));
  outer.update(inner_digest.data(), inner_digest.size());
  return outer.finish();
}

bool equal_in_constant_time(const void* a, const void* b, size_t size) {
  // volatile keeps the compiler from turning the loop back into an early-exit comparison.
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < size; ++i) diff |= x[i] ^ y[i];
  return diff == 0;
}

void fill_random(void* data, size_t size) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::getrandom(p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ENOSYS) break;  // a kernel older than 3.17
    IL_CHECK(n > 0, "getrandom() failed: ", strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
  if (size == 0) return;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  IL_CHECK(fd >= 0, "cannot open /dev/urandom for a nonce: ", strerror(errno));
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      IL_FAIL("cannot read /dev/urandom for a nonce: ", n == 0 ? "end of file" : strerror(err));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace interlace
