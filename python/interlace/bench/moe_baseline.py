"""The moe benchmark's routing and baseline (the host-driven MoE pipeline), kept out of moe.py: that
module defines absl flags when imported, and a second module defining the same flags in one test
session fails."""
import torch
import torch.distributed as dist


def routing(rank, tokens, experts, topk, seed, device="cuda"):
    """Rank `rank`'s top-k experts per token (distinct, uniformly random) and their weights,
    reproducible on any rank."""
    g = torch.Generator(device=device).manual_seed(seed * 1009 + rank)
    idx = torch.rand(tokens, experts, generator=g, device=device).argsort(dim=1)[:, :topk].to(torch.int32)
    weights = torch.rand(tokens, topk, generator=g, device=device)
    return idx.contiguous(), weights


class Baseline:
    """The host-driven pipeline, for one routing: dispatch() and combine(expert_out) as a framework
    MoE layer does them, plus the padded (capturable) form for decode."""

    def __init__(self, idx, weights, experts, world, pad_rows):
        """pad_rows: the padded form's rows per (source, expert), at least the most any rank routes
        to one expert."""
        self.T, self.k = idx.shape
        self.E, self.W, self.L, self.C = experts, world, experts // world, pad_rows
        self.idx, self.weights = idx.long(), weights
        flat = self.idx.view(-1)
        self.order = torch.argsort(flat, stable=True)  # (token, j) pairs by expert: destination, then token
        self.tok = self.order // self.k
        self.sent_per_expert = torch.bincount(flat, minlength=self.E)
        # Padded form: pair p goes to slot (expert, position within the expert) of a [E, C] grid.
        sorted_e = flat[self.order]
        first = torch.cumsum(self.sent_per_expert, 0) - self.sent_per_expert
        self.pad_slot = sorted_e * self.C + (torch.arange(flat.numel(), device=flat.device) - first[sorted_e])

    def unique_transport(self):
        """What a de-duplicating dispatch moves: each token once to each rank that holds any of its
        experts, in destination then token order. Returns (token indices to send, send splits, receive
        splits); collective (exchanges the counts once, at setup)."""
        to_rank = torch.zeros(self.T, self.W, dtype=torch.bool, device=self.idx.device)
        if self.T:
            to_rank.scatter_(1, torch.div(self.idx, self.L, rounding_mode="floor"), True)
        dest, token = to_rank.t().nonzero(as_tuple=True)  # destination-major, tokens ascending
        send = torch.bincount(dest, minlength=self.W)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return token, send.tolist(), recv.tolist()

    def exchange_counts(self):
        recv = torch.empty_like(self.sent_per_expert)
        dist.all_to_all_single(recv, self.sent_per_expert)  # [source, local expert]
        return recv.view(self.W, self.L)

    def dispatch(self, x):
        recv_counts = self.exchange_counts()
        send_splits = self.sent_per_expert.view(self.W, self.L).sum(1).tolist()  # the host sync
        recv_splits = recv_counts.sum(1).tolist()
        recv = x.new_empty(sum(recv_splits), x.shape[1])
        dist.all_to_all_single(recv, x[self.tok], recv_splits, send_splits)
        # recv is [source][local expert][token]: stable-sort by local expert
        expert_of_row = torch.arange(self.L, device=x.device).repeat(self.W).repeat_interleave(recv_counts.view(-1))
        perm = torch.argsort(expert_of_row, stable=True)
        self.saved = (send_splits, recv_splits, perm, recv_counts)
        return recv[perm]

    def combine(self, expert_out):
        send_splits, recv_splits, perm, _ = self.saved
        back = torch.empty_like(expert_out)
        back[perm] = expert_out
        home = expert_out.new_empty(self.T * self.k, expert_out.shape[1])
        dist.all_to_all_single(home, back, send_splits, recv_splits)
        pairs = torch.empty_like(home)
        pairs[self.order] = home
        return self.weighted_sum(pairs)

    def weighted_sum(self, pairs):
        y = pairs.view(self.T, self.k, pairs.shape[-1]).float()
        acc = y[:, 0] * self.weights[:, :1]
        for j in range(1, self.k):  # in top-k order, as interlace sums
            acc = acc + y[:, j] * self.weights[:, j:j + 1]
        return acc.to(torch.bfloat16)

    def padded_dispatch(self, x, send, recv):
        send.view(self.E * self.C, -1)[self.pad_slot] = x[self.tok]
        dist.all_to_all_single(recv, send)  # [source, local expert, C, hidden]
        return recv

    def padded_combine(self, expert_out_padded, back):
        dist.all_to_all_single(back, expert_out_padded)  # [expert of this rank's pairs, C, hidden]
        pairs = torch.empty(self.T * self.k, back.shape[-1], dtype=back.dtype, device=back.device)
        pairs[self.order] = back.view(self.E * self.C, -1)[self.pad_slot]
        return self.weighted_sum(pairs)
