// The order in which a persistent GEMM visits its output tiles: data the host computes and the
// kernel executes. CTA i takes entries i, i + num_ctas, i + 2 * num_ctas, ... Fused ops will order
// tiles by when their inputs arrive; the plain GEMM orders them for L2 reuse.
#pragma once

#include <cstdint>
#include <vector>

namespace interlace {

struct TileGrid {
  int tiles_m = 0;
  int tiles_n = 0;
  int num_tiles() const { return tiles_m * tiles_n; }
};

TileGrid tile_grid(int64_t m, int64_t n, int tile_m, int tile_n);

// The output tile width for an m x n problem on num_sms SMs in clusters of cluster_m tile rows: 256
// (the faster tile) unless 128-wide tiles finish sooner because 256-wide ones fill the last wave
// poorly. Tiles are 128 rows high.
int choose_tile_n(int64_t m, int64_t n, int num_sms, int cluster_m = 1);

// Tiles in bands of `band_m` tile rows; within a band, column by column, so that the tiles running
// at one time share A rows and B columns in L2. Entry value: m_idx * tiles_n + n_idx.
std::vector<int32_t> banded_tile_order(const TileGrid& grid, int band_m);

}  // namespace interlace
