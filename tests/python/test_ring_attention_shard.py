"""interlace.ring_attention_shard / unshard on the CPU: the zigzag sharding of issue 13 (rank r holds
chunks r and 2W-1-r of 2W near-equal chunks, the first S % 2W one row longer), checked against an
independent reference (numpy.array_split cuts chunks the same way), for any S including S < 2W, on
NumPy and torch arrays, along any axis; unshard of the stacked shards gives the sequence back."""
import numpy as np
import pytest

import interlace


def expected_shard(seq, rank, world):
    chunks = np.array_split(np.arange(seq), 2 * world)
    return np.concatenate([chunks[rank], chunks[2 * world - 1 - rank]])


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("seq", [0, 1, 5, 6, 7, 37, 128])
def test_shard_is_the_zigzag_and_unshard_inverts_it(world, seq):
    x = np.arange(2 * seq * 3).reshape(2, seq, 3)  # [B, S, D]: row s holds s * 3 ... in batch 0
    shards = [interlace.ring_attention_shard(x, r, world) for r in range(world)]
    for r, shard in enumerate(shards):
        np.testing.assert_array_equal(shard, x[:, expected_shard(seq, r, world)])
    np.testing.assert_array_equal(interlace.ring_attention_unshard(np.concatenate(shards, axis=1), world), x)


def test_torch_tensors_and_another_axis():
    torch = pytest.importorskip("torch")
    x = torch.randn(37, 4, 8)  # the sequence along axis 0
    shards = [interlace.ring_attention_shard(x, r, 3, dim=0) for r in range(3)]
    assert all(isinstance(s, torch.Tensor) for s in shards)
    for r, shard in enumerate(shards):
        assert torch.equal(shard, x[torch.from_numpy(expected_shard(37, r, 3))])
    assert torch.equal(interlace.ring_attention_unshard(torch.cat(shards), 3, dim=0), x)


def test_bad_world_sizes_raise():
    with pytest.raises(interlace.Error):
        interlace.ring_attention_shard(np.zeros((1, 8)), 0, 0)
    with pytest.raises(interlace.Error):
        interlace.ring_attention_shard(np.zeros((1, 8)), 3, 2)
