"""One rank of the distributed tests: a training step under DDP or FSDP2 (gloo, CPU) or DDP over
NCCL (one GPU per rank, bfloat16), gradients saved to <out>/rank<r>.pt. The reference is the same
step in one process on the whole batch."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import twell.torch as tt

WORLD = 2
BATCH = 8


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16),
                         tt.SparseGatedMLP(16, 64, l1_coef=0.1, tile=64, capacity=8))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 16, generator=g)


def step(model, x, target):
    loss = F.mse_loss(model(x), target) + tt.l1_loss(model)
    loss.backward()
    return loss


def reference_grads(device="cpu", dtype=torch.float32):
    model = make_model().to(device, dtype)
    x, target = batch()
    step(model, x.to(device, dtype), target.to(device, dtype))
    return {n: p.grad.float().cpu() for n, p in model.named_parameters()}


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run(rank, mode, init_file, out):
    nccl = mode == "ddp_nccl"
    if nccl:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    try:
        device, dtype = ("cuda", torch.bfloat16) if nccl else ("cpu", torch.float32)
        model = make_model().to(device, dtype)
        if nccl:
            wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        elif mode == "ddp":
            wrapped = nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (WORLD,))  # gloo on the CPU even where a GPU exists
            fully_shard(model[1], mesh=mesh)
            wrapped = fully_shard(model, mesh=mesh)
        x, target = batch()
        shard = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        step(wrapped, x[shard].to(device, dtype), target[shard].to(device, dtype))
        grads = {n: full(p.grad).detach().float().cpu() for n, p in model.named_parameters()}
        torch.save(grads, f"{out}/rank{rank}.pt")
        # Both ranks done with every collective before either tears its group down: a rank that
        # destroyed its gloo group while the other still talked to it once aborted in CI
        # ("terminate called without an active exception", exit -6).
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
    # A finished rank leaves without interpreter finalization: Gloo's worker threads can still hold
    # work objects whose tensors need the GIL as the interpreter tears down, which aborts the
    # process after everything succeeded ("terminate called without an active exception", exit
    # -6, once in CI after the barrier above). An exception in run() still exits non-zero above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
