"""interlace.torch.ColumnParallelLinear and RowParallelLinear on real GPUs against nn.Linear,
gradients included, eager and under torch.compile(fullgraph=True); one process per GPU."""
import os

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "torch_layers_worker.py")
pytestmark = pytest.mark.gpus(2)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_tensor_parallel_layers_match_nn_linear(mode):
    import torch
    results = run_ranks([WORKER, mode], torch.cuda.device_count(), 300)
    expect_ranks_passed(results)
