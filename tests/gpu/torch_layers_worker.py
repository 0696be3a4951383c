"""One rank of the tensor-parallel layers on GPUs (see test_torch_layers_gpu.py): a two-layer MLP of
ColumnParallelLinear and RowParallelLinear, cut from full nn.Linear layers, against those layers in
fp32 on the whole input (the same bf16 values, rounded where the layers store bf16), forward and
every gradient; eager, then compiled (fullgraph=True)."""
import copy
import os
import sys

import torch

import interlace
import interlace.torch as itorch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
group = interlace.init(heap_bytes=512 << 20)


def check(got, want, what):
    err = ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()
    assert err < 2e-2, f"rank {RANK}: {what}: relative error {err:.3e}"


def rounded(t):
    """t rounded to bf16 where the layers store a bf16 tensor; gradients pass through unchanged."""
    return t + (t.to(torch.bfloat16).float() - t).detach()


def run(tokens, d_in, d_hidden, d_out, bias, compiled):
    torch.manual_seed(1234)  # the same full layers, input and output gradient on every rank
    lin1 = torch.nn.Linear(d_in, d_hidden, bias=bias, device="cuda")
    lin2 = torch.nn.Linear(d_hidden, d_out, bias=bias, device="cuda")
    with torch.no_grad():
        if bias:  # nn.Linear's default bias is small next to the products: make it count
            torch.nn.init.normal_(lin1.bias)
            torch.nn.init.normal_(lin2.bias)
        # The reference runs in fp32 on the values the bf16 layers get (weights, biases, input and
        # output gradient are bf16 numbers) and rounds where they store bf16: the product, then the
        # sum with the bias (as Megatron's layers, the bias is added to the rounded product). A sign
        # flip of a pre-activation moves the input gradient by a whole ReLU term, so without the
        # product's rounding the first GPU run saw 3-4% there, from flips alone.
        for p in (*lin1.parameters(), *lin2.parameters()):
            p.copy_(p.to(torch.bfloat16))
    x = torch.randn(tokens, d_in, device="cuda").to(torch.bfloat16).float().requires_grad_()
    g = torch.randn(tokens, d_out, device="cuda").to(torch.bfloat16).float()

    def linear(t, layer):
        y = rounded(t @ layer.weight.t())
        return rounded(y + layer.bias) if bias else y

    y_ref = linear(torch.relu(linear(x, lin1)), lin2)
    (y_ref * g).sum().backward()
    y_ref = y_ref.detach()

    col = itorch.ColumnParallelLinear.from_linear(copy.deepcopy(lin1).to(torch.bfloat16), group)
    row = itorch.RowParallelLinear.from_linear(copy.deepcopy(lin2).to(torch.bfloat16), group)
    mlp = lambda t: row(torch.relu(col(t)))  # noqa: E731
    if compiled:
        mlp = torch.compile(mlp, fullgraph=True)
    rows = slice(RANK * tokens // WORLD, (RANK + 1) * tokens // WORLD)
    hidden = slice(RANK * d_hidden // WORLD, (RANK + 1) * d_hidden // WORLD)
    x_r = x.detach()[rows].to(torch.bfloat16).requires_grad_()
    y_r = mlp(x_r)
    (y_r.float() * g[rows]).sum().backward()
    torch.cuda.synchronize()
    group.check()
    what = f"tokens {tokens} d {d_in}/{d_hidden}/{d_out} bias {bias} compiled {compiled}"
    check(y_r, y_ref[rows], f"{what}: output")
    check(x_r.grad, x.grad[rows], f"{what}: input gradient")
    check(col.weight.grad, lin1.weight.grad[hidden], f"{what}: column weight gradient")
    check(row.weight.grad, lin2.weight.grad[:, hidden], f"{what}: row weight gradient")
    if bias:
        check(col.bias.grad, lin1.bias.grad[hidden], f"{what}: column bias gradient")
        check(row.bias.grad, lin2.bias.grad, f"{what}: row bias gradient")


def main(mode):
    compiled = mode == "compiled"
    for tokens, d_in, d_hidden, d_out, bias in ((256, 256, 512, 256, True), (1024, 512, 1024, 384, False),
                                                (96, 64, 128, 64, True)):
        run(tokens * WORLD // 2, d_in, d_hidden * WORLD // 2, d_out, bias, compiled)
    print(f"rank {RANK}: tensor-parallel layers ({mode}) match nn.Linear", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
