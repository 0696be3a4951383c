// The order in which a persistent GEMM visits its output tiles. An order is a small policy type the
// kernel is templated on: Params the host fills in, and a __host__ __device__ map from a position in
// the order to a tile, so that nothing is uploaded per shape and a first call can be captured in a
// CUDA graph. CTA i takes positions i, i + num_ctas, i + 2 * num_ctas, ... Fused ops will order
// tiles by when their inputs arrive; the plain GEMM orders them for L2 reuse (BandedOrder).
#pragma once

#include <cstdint>
#include <vector>

#include "interlace/base/host_device.h"

namespace interlace {

// The kernel walks positions in 32-bit integers, stepping past the last one by up to a grid of CTAs;
// this many tiles leaves room for any grid.
inline constexpr int64_t kMaxGemmTiles = int64_t{1} << 30;

struct TileGrid {
  int tiles_m = 0;
  int tiles_n = 0;
  int num_tiles() const { return tiles_m * tiles_n; }
};

// Raises when the grid has more than kMaxGemmTiles tiles.
TileGrid tile_grid(int64_t m, int64_t n, int tile_m, int tile_n);

// The output tile width for an m x n problem on num_sms SMs in clusters of cluster_m tile rows: 256
// (the faster tile) unless 128-wide tiles finish sooner because 256-wide ones fill the last wave
// poorly. Tiles are 128 rows high.
int choose_tile_n(int64_t m, int64_t n, int num_sms, int cluster_m = 1);

// Decode sizes with a Linear weight (b K-major): whether the GEMM runs swapped, out^T = b^T a^T, so
// that N fills 64-row tiles and M is the wgmmas' narrow side; and the swapped tiles' width. 0: not
// swapped; 64 for M <= 64; 128 for M <= 128 where 128 x 128 tiles of out would fill at most half the
// SMs (at N = 14336 and 28672 and M = 128 those were faster than the swap: 38.1 against 39.4 us and
// 145 against 162; at N = 4096 and 8192 slower: 70.9 against 47.2 and 27.2 against 22.9, 1 x H200).
int decode_swap_tile_n(int64_t m, int64_t n, int num_sms);

// HBM bytes per second per SM below which a GPU counts as lean on memory (H100 SXM: 3.35 TB/s over 132
// SMs, 25 GB/s an SM; H200: 4.8 TB/s, 36 GB/s).
inline constexpr double kLeanHbmBytesPerSm = 30e9;
// A GPU that does not say (0) counts as well fed: the schedules everywhere else.
inline bool lean_hbm(double hbm_bytes_per_sm) { return hbm_bytes_per_sm > 0 && hbm_bytes_per_sm < kLeanHbmBytesPerSm; }

// The plain GEMM's schedule where its tuning is left automatic (gemm.cu).
struct GemmSchedule {
  bool pingpong = true;  // ping-pong 128 x 128 tiles; false: cooperative, 128 x choose_tile_n
  int band_m = 8;        // cluster-tile rows per band (BandedOrder)
};

// Ping-pong tiles in bands of 8, except on a GPU lean on memory (hbm_bytes_per_sm, per second, below
// kLeanHbmBytesPerSm): there, at the power cap, ping-pong in bands of 8 ran large GEMMs at 0.55-0.87x
// of cuBLAS. Problems of kLeanCooperativeFlop or more take cooperative 128 x 256 tiles (half
// ping-pong's loads per flop) in bands of 8, 0.87-0.97x; smaller ones ping-pong in bands of 2,
// 0.87-1.0x. The boundary is measured, not derived: 8192 x 14336 x 4096 (0.96e12 flop) ran 676
// TFLOP/s ping-pong against 556-600 cooperative, 8192 x 8192 x 8192 (1.1e12) 613 against 670, and
// 4096 x 28672 x 8192 (1.9e12) 568 against 628-664 (1 x H100, bench/results/NOTES.md, twenty-first
// session). On the H200 ping-pong in bands of 8 was the best of the engine's schedules at every
// large shape (fifteenth session).
inline constexpr double kLeanCooperativeFlop = 1e12;
GemmSchedule automatic_gemm_schedule(int64_t m, int64_t n, int64_t k, double hbm_bytes_per_sm);

// Tiles in bands of band_m tile rows; within a band, column by column, so that the tiles running at
// one time share A rows and B columns in L2. The last band has the rows that are left.
struct BandedOrder {
  struct Params {
    int32_t tiles_m = 0;
    int32_t tiles_n = 0;
    int32_t band_m = 1;  // 1 <= band_m <= max(tiles_m, 1), so a band's tile count fits in 32 bits
  };

  static Params make(const TileGrid& grid, int band_m);

  // Position i (0 <= i < tiles_m * tiles_n) to its tile. Two divisions: which band, then which
  // column of it.
  IL_HOST_DEVICE static inline void tile(const Params& p, int32_t i, int32_t& m_idx, int32_t& n_idx) {
    const int32_t band_tiles = p.band_m * p.tiles_n;
    const int32_t band = i / band_tiles;
    const int32_t first_row = band * p.band_m;
    const int32_t left = p.tiles_m - first_row;
    const int32_t rows = left < p.band_m ? left : p.band_m;
    const int32_t in_band = i - band * band_tiles;
    n_idx = in_band / rows;
    m_idx = first_row + (in_band - n_idx * rows);
  }
};

// The same order as a list, built by walking the bands: the reference BandedOrder::tile is tested
// against. Entry value: m_idx * tiles_n + n_idx.
std::vector<int32_t> banded_tile_order(const TileGrid& grid, int band_m);

}  // namespace interlace
