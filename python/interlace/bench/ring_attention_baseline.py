"""The ring_attention benchmark's baselines, kept out of ring_attention.py: that module defines absl
flags when imported, and a second module defining the same flags in one test session fails.

The baseline is ring attention as ring-flash-attn does it, on torch: every rank holds its zigzag
shard of the sequence (interlace.ring_attention_shard: 2W chunks, rank r holds chunks r and
2W-1-r), computes its queries against one K/V block per step with a single-GPU attention that
returns the log-sum-exp (cuDNN's, through torch's SDPA op), merges the partial results in fp32, and
passes the K/V blocks around the ring with NCCL point-to-point (torch.distributed). Two forms:
ring_serial (transfer, wait, compute) and ring_overlapped (the next block in flight while the
current one computes). compute_only runs the same per-step blocks on one GPU with no transfers: the
floor of the ring's compute.

Layouts as interlace.ring_attention's: q and out [B, S_local, Hq, D], k and v [B, S_local, Hkv, D],
lse float32 [B, Hq, S_local] (natural log of the scaled scores' sum of exponentials). An `attend`
is a call attend(q, k, v, causal, scale) -> (out [B, S_q, Hq, D], lse [B, Hq, S_q]) on those
layouts; causal only where S_q == S_k (the own block's diagonal)."""
import math

import torch
import torch.distributed as dist


def chunk_rows(seq, world, chunk):
    """Rows of chunk `chunk` of the zigzag sharding: S = 2W * base + extra, and the first `extra`
    chunks get one row more (as interlace.ring_attention_shard cuts them)."""
    base, extra = divmod(seq, 2 * world)
    return base + (1 if chunk < extra else 0)


def shard_halves(seq, world, rank):
    """Rows of rank's two halves: (chunk rank's, chunk 2W-1-rank's). Shards of an S that 2W does not
    divide differ by up to 2 rows, so every rank's are computed, never assumed equal."""
    return chunk_rows(seq, world, rank), chunk_rows(seq, world, 2 * world - 1 - rank)


def expand_kv(k, v, heads_q):
    """K and V with each of their heads repeated for its group of query heads (GQA: query head h reads
    KV head h // (Hq // Hkv)), for attentions that need Hq heads everywhere."""
    group = heads_q // k.shape[2]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)


def attend_cudnn(q, k, v, causal, scale, expand=True):
    """(out, lse) of cuDNN's fused attention, through torch's SDPA op on [B, H, S, D] views of the
    [B, S, H, D] tensors (no copies). GQA: K and V are expanded to Hq heads first unless expand is
    False (for a cuDNN that takes fewer KV heads itself; the benchmark checks that it gives the same
    result before relying on it)."""
    if expand:
        k, v = expand_kv(k, v, q.shape[2])
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=None, compute_log_sumexp=True,
        dropout_p=0.0, is_causal=causal, return_debug_mask=False, scale=scale)[:2]
    # Some torch versions return the log-sum-exp as [B, H, S, 1].
    return out.transpose(1, 2), lse.reshape(q.shape[0], q.shape[2], q.shape[1])


def attend_math(q, k, v, causal, scale):
    """(out, lse) in fp32 torch math, any device: the CPU tests' attention."""
    k, v = expand_kv(k, v, q.shape[2])
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
    scores = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).transpose(1, 2), torch.logsumexp(scores, dim=-1)


def merge(out, lse, block_out, block_lse):
    """Folds one block's partial attention (block_out [B, S, H, D], block_lse [B, H, S]) into the
    running result of the same query rows, in place: out (fp32, [B, S, H, D]) and lse (fp32,
    [B, H, S]) become the attention over both key sets. Each side is weighted by
    exp(its lse - the merged lse), never by a bare exp(lse), so nothing overflows."""
    merged = torch.logaddexp(lse, block_lse)

    def per_row(weight):  # [B, H, S] -> [B, S, H, 1], to scale out's rows
        return weight.transpose(1, 2).unsqueeze(-1)

    out.mul_(per_row(torch.exp(lse - merged))).add_(block_out * per_row(torch.exp(block_lse - merged)))
    lse.copy_(merged)


def _rank_and_world(rank, world):
    return (dist.get_rank() if rank is None else rank), (dist.get_world_size() if world is None else world)


def _blocks(q, k, v, causal, rank, world, seq, step, origin_rows):
    """The attention calls of one ring step: [(q rows (slice), query block, key block, value block,
    causal)], for the K/V block k, v that originated at rank (rank - step) mod W, of origin_rows =
    (first half, second half) rows. Under the causal mask the zigzag leaves, per step: the own block
    with its diagonal (step 0); from an earlier rank, every query against the block's first half
    (chunk origin, wholly before both of ours); from a later rank, our second half (chunk 2W-1-rank,
    after both of its chunks) against the whole block; the rest is masked."""
    origin = (rank - step) % world
    everything = slice(0, q.shape[1])
    if step == 0:
        return [(everything, q, k, v, causal)]
    if not causal:
        return [(everything, q, k, v, False)]
    first_q = shard_halves(seq, world, rank)[0]
    if origin < rank:
        first_k = origin_rows[0]
        return [(everything, q, k[:, :first_k], v[:, :first_k], False)] if first_k else []
    if first_q == q.shape[1]:
        return []  # an empty second half (S < 2W)
    return [(slice(first_q, q.shape[1]), q[:, first_q:], k, v, False)]


def _ring(q, k, v, causal, attend, overlap, scale, seq_len, rank, world):
    rank, world = _rank_and_world(rank, world)
    seq = world * q.shape[1] if seq_len is None else seq_len
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rows = [shard_halves(seq, world, r) for r in range(world)]
    if q.shape[1] != sum(rows[rank]) or k.shape[1] != q.shape[1]:
        raise ValueError(f"rank {rank}: q has {q.shape[1]} rows and k {k.shape[1]}; the zigzag shard of "
                         f"{seq} rows over {world} ranks has {sum(rows[rank])}")
    b, _, heads_kv, d = k.shape
    # Two receive slots (the block in use and the one in flight), each K and V of the largest shard.
    # Flat, so that a block of fewer rows is a contiguous prefix: a [B, rows] slice of a [B, S] buffer
    # is not when B > 1, and NCCL sends contiguous tensors.
    most = max(sum(r) for r in rows) * b * heads_kv * d
    slots = [torch.empty(2, most, dtype=k.dtype, device=k.device) for _ in range(2 if world > 1 else 0)]
    # Overlapped, on CUDA, the transfers are issued from a second stream that first waits for the compute
    # stream (the attention issued last read the slot they land in); torch's NCCL runs them on its own
    # stream after that, beside the next attention, and the compute stream waits for them only where it
    # needs the block. Off CUDA (gloo on the CPU) there are no streams.
    side = torch.cuda.Stream(device=q.device) if overlap and q.is_cuda and world > 1 else None

    def exchange(block, step):
        """Sends `block` to rank + 1 and receives the block of step `step` from rank - 1 into slot
        step % 2, whose previous tenant (step - 2's block) the compute stream has finished with once
        everything issued before this call is done. Returns (works, the received K and V)."""
        n = b * sum(rows[(rank - step) % world]) * heads_kv * d
        slot = slots[step % 2]
        recv = tuple(slot[i, :n].view(b, -1, heads_kv, d) for i in (0, 1))
        ops = [dist.P2POp(dist.isend, block[i], (rank + 1) % world, tag=i) for i in (0, 1)]
        ops += [dist.P2POp(dist.irecv, recv[i], (rank - 1) % world, tag=i) for i in (0, 1)]
        if side is None:
            return dist.batch_isend_irecv(ops), recv
        side.wait_stream(torch.cuda.current_stream(q.device))
        with torch.cuda.stream(side):
            return dist.batch_isend_irecv(ops), recv

    def wait(works):
        for work in works:
            work.wait()  # on CUDA: the current stream waits for the transfer; the host does not
        works.clear()  # once: gloo's wait on a finished transfer waits for another

    out = lse = failure = None
    block = (k, v)
    for step in range(world):
        pending = exchange(block, step + 1) if step + 1 < world else None
        if pending is not None and not overlap:
            wait(pending[0])  # serial: the transfer ends before this step's compute starts
        todo = _blocks(q, *block, causal, rank, world, seq, step, rows[(rank - step) % world])
        try:
            for rows_q, qb, kb, vb, mask in todo if failure is None else []:
                part_out, part_lse = attend(qb, kb, vb, mask, scale)
                if out is None:  # step 0 covers every query row: it starts the fp32 accumulators
                    out, lse = part_out.float(), part_lse.float()
                else:
                    merge(out[:, rows_q], lse[:, :, rows_q], part_out, part_lse)
        except Exception as e:  # noqa: BLE001 (raised once the ring is done)
            # A compute that fails (a shape cuDNN refuses, say) stops this rank's compute, not its
            # transfers: the peers wait for the blocks it passes on.
            failure = e
        if pending is not None:
            wait(pending[0])
            block = pending[1]
    if failure is not None:
        raise failure
    if out is None:  # no query rows at all
        return torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
    return out.to(q.dtype), lse


def ring_serial(q, k, v, causal, attend, *, scale=None, seq_len=None, rank=None, world=None):
    """Ring attention over the default process group, each step's K/V transfer finished before its
    compute starts. q, k, v: this rank's zigzag shards; seq_len: the global S (default W x S_local);
    scale: default 1 / sqrt(D); rank, world: default the process group's. Returns (out in q's dtype,
    lse fp32)."""
    return _ring(q, k, v, causal, attend, False, scale, seq_len, rank, world)


def ring_overlapped(q, k, v, causal, attend, *, scale=None, seq_len=None, rank=None, world=None):
    """ring_serial with the next block's transfer in flight while the current block computes (on a
    second stream on CUDA), as ring-flash-attn overlaps them."""
    return _ring(q, k, v, causal, attend, True, scale, seq_len, rank, world)


def compute_only(q, k, v, causal, attend, *, scale=None, seq_len=None, rank=None, world=None):
    """The ring's per-step attention calls on one GPU with no transfers and no merges: this rank's own
    K/V stands in for every step's block, cut as the block that step would bring (its first half, or
    whole), so the shapes are the ring's; to the row, where 2W divides S (elsewhere a block from a
    rank with a longer shard is up to 2 rows shorter here). Returns nothing."""
    rank, world = _rank_and_world(rank, world)
    seq = world * q.shape[1] if seq_len is None else seq_len
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    for step in range(world):
        origin_rows = shard_halves(seq, world, (rank - step) % world)
        kb, vb = k[:, :sum(origin_rows)], v[:, :sum(origin_rows)]
        for _, qb, kb, vb, mask in _blocks(q, kb, vb, causal, rank, world, seq, step, origin_rows):
            attend(qb, kb, vb, mask, scale)


def reference(q, k, v, positions, heads, causal, scale, block_rows=4096):
    """fp32 attention of the query rows `positions` (global row indices, a tensor) of the whole
    sequence q, k, v ([B, S, H, D]) for the query heads `heads`: (out [B, len(positions), len(heads),
    D], lse [B, len(heads), len(positions)]). The scores are made block_rows query rows of one head at
    a time (at S = 32768, 512 MiB per 4096 rows), which bounds the memory."""
    group = q.shape[2] // k.shape[2]
    keys = torch.arange(k.shape[1], device=q.device)
    outs, lses = [], []
    for h in heads:
        kf, vf = k[:, :, h // group].float(), v[:, :, h // group].float()  # [B, S, D]
        head_out, head_lse = [], []
        for start in range(0, len(positions), block_rows):
            rows = positions[start:start + block_rows]
            scores = (q[:, rows, h].float() @ kf.transpose(1, 2)) * scale  # [B, rows, S]
            if causal:
                scores = scores.masked_fill(keys[None, None, :] > rows[None, :, None], float("-inf"))
            head_lse.append(torch.logsumexp(scores, dim=-1))
            head_out.append(torch.softmax(scores, dim=-1) @ vf)
            del scores
        outs.append(torch.cat(head_out, dim=1))
        lses.append(torch.cat(head_lse, dim=1))
    return torch.stack(outs, dim=2), torch.stack(lses, dim=1)
