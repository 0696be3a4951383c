#include "interlace/gemm/tile_plan.h"

#include <algorithm>

#include "interlace/base/error.h"

namespace interlace {

TileGrid tile_grid(int64_t m, int64_t n, int tile_m, int tile_n) {
  IL_CHECK(m >= 0 && n >= 0 && tile_m > 0 && tile_n > 0, "bad tile grid request");
  const int64_t tm = m / tile_m + (m % tile_m != 0);
  const int64_t tn = n / tile_n + (n % tile_n != 0);
  // tm and tn first, so that their product cannot overflow.
  IL_CHECK(tm <= kMaxGemmTiles && tn <= kMaxGemmTiles && tm * tn <= kMaxGemmTiles, "gemm: ", m, " x ", n, " needs ",
           tm, " x ", tn, " output tiles of ", tile_m, " x ", tile_n, "; at most 2^30 tiles are supported");
  return TileGrid{static_cast<int>(tm), static_cast<int>(tn)};
}

int choose_tile_n(int64_t m, int64_t n, int num_sms, int cluster_m) {
  // Time ~ waves x tile area / speed; a 128 x 128 tile runs at about 93% of a 128 x 256 tile's rate
  // (H200, bench/results/NOTES.md).
  constexpr double kNarrowSpeed = 0.93;
  auto waves = [&](int tile_n) {
    const TileGrid g = tile_grid(m, n, 128 * cluster_m, tile_n);
    const int clusters = num_sms / cluster_m;
    return static_cast<double>((g.num_tiles() + clusters - 1) / clusters);
  };
  const double wide = waves(256) * 256;
  const double narrow = waves(128) * 128 / kNarrowSpeed;
  return narrow < wide ? 128 : 256;
}

int decode_swap_tile_n(int64_t m, int64_t n, int num_sms) {
  if (m < 1 || m > 128) return 0;
  if (m <= 64) return 64;
  return 2 * ((n + 127) / 128) <= num_sms ? 128 : 0;
}

GemmSchedule automatic_gemm_schedule(int64_t m, int64_t n, int64_t k, double hbm_bytes_per_sm) {
  if (!lean_hbm(hbm_bytes_per_sm)) return GemmSchedule{};
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return flop >= kLeanCooperativeFlop ? GemmSchedule{false, 8} : GemmSchedule{true, 2};
}

BandedOrder::Params BandedOrder::make(const TileGrid& grid, int band_m) {
  IL_CHECK(band_m >= 1, "band_m must be >= 1");
  // A band taller than the grid is the whole grid; clamping keeps band_m * tiles_n within the tile count.
  const int rows = std::max(1, std::min(band_m, grid.tiles_m));
  return Params{grid.tiles_m, grid.tiles_n, rows};
}

std::vector<int32_t> banded_tile_order(const TileGrid& grid, int band_m) {
  IL_CHECK(band_m >= 1, "band_m must be >= 1");
  std::vector<int32_t> order;
  order.reserve(grid.num_tiles());
  for (int band = 0; band < grid.tiles_m; band += band_m) {
    const int rows = std::min(band_m, grid.tiles_m - band);
    for (int n = 0; n < grid.tiles_n; ++n) {
      for (int m = band; m < band + rows; ++m) order.push_back(m * grid.tiles_n + n);
    }
  }
  return order;
}

}  // namespace interlace
