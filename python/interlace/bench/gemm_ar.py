"""gemm_ar benchmark, one rank: gemm_rs.py's with the whole sum on every rank. Started by
`python -m interlace.bench gemm_ar`."""
from absl import app

from interlace.bench import gemm_rs

if __name__ == "__main__":
    gemm_rs.KIND = "ar"
    app.run(gemm_rs.main)
