"""Several processes training one model: `torchrun --nproc-per-node N -m twell.train ... --dist
ddp|fsdp2` (twell.train.cli). NCCL between GPUs (each rank on cuda:LOCAL_RANK), gloo on the CPU.

  ddp    torch.nn.parallel.DistributedDataParallel: every rank holds the whole model; gradients
         are averaged over ranks in backward (in the parameters' dtype: bf16 on CUDA, as one
         process's gradients are before they reach its fp32 master weights).
  fsdp2  torch.distributed.fsdp.fully_shard per decoder layer, then the whole model: parameters,
         gradients and AdamW state sharded over ranks. The sharded fp32 parameters are the master
         weights; under bf16 a MixedPrecisionPolicy gathers them as bf16 for compute (exactly the
         bf16 weights one process holds) and reduces gradients in fp32.

What holds (the CPU tests check it, tests/python/test_train_dist.py): the global batch of a step
is the one process's batch (--batch-size sequences; rank r takes its rows, twell.train.data), so
the losses and gradients are one process's up to rounding; the log, the validation figures and
the sparsity statistics are reduced over ranks (sums of counts and hits) and written by rank 0
alone; a checkpoint is the one-process format (rank 0 gathers full tensors, safetensors + JSON,
no pickle: torch.distributed.checkpoint's .metadata is a pickle, so it is not used) and resumes
on any number of ranks; dead units are decided on hits summed over ranks, so every rank
re-initialises the same units with the same draws.
"""
import os

from twell.train.files import InputError

MODES = ("none", "ddp", "fsdp2")
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launch(args, environ=None):
    """(rank, world_size, local_rank) of this process under --dist (torchrun's environment), or
    None for --dist none; InputError where --dist and the launch disagree or --batch-size does
    not split over the ranks. Imports nothing (cli runs it before torch)."""
    env = os.environ if environ is None else environ
    world = env.get("WORLD_SIZE")
    if args.dist == "none":
        if world not in (None, "", "1"):
            raise InputError("--dist", f"ddp or fsdp2 in a launch of WORLD_SIZE {world} (each "
                             "process would train its own model into the same --out)", "none")
        return None
    missing = [k for k in LAUNCH_ENV if not env.get(k)]
    if missing:
        raise InputError("--dist", "a launch by torchrun (torchrun --nproc-per-node N -m "
                         "twell.train ...: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                         "MASTER_PORT in the environment)",
                         f"{args.dist} with no {missing[0]} in the environment")
    try:
        rank, world, local = (int(env[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    except ValueError:
        raise InputError("--dist", "integer RANK, WORLD_SIZE and LOCAL_RANK (torchrun's)",
                         repr({k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}))
    if not (world >= 1 and 0 <= rank < world and local >= 0):
        raise InputError("--dist", "0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0",
                         f"RANK {rank}, WORLD_SIZE {world}, LOCAL_RANK {local}")
    if args.batch_size % world:
        raise InputError("--batch-size", f"a multiple of the world size {world} (the global "
                         f"batch of a step, each rank taking an equal slice)", args.batch_size)
    return rank, world, local


class Group:
    """The processes of a run: rank, world size, the collectives twell.train uses (sums, rank 0's
    decision, gathers) on `device` tensors; one process (world 1) does no communication."""

    def __init__(self, mode="none", rank=0, world=1, local_rank=0, device=None):
        self.mode, self.rank, self.world, self.local_rank = mode, rank, world, local_rank
        self.device = device
        self.main = rank == 0
        self.backend = None

    def start(self, device):
        """init_process_group from torchrun's environment: NCCL for CUDA, gloo for the CPU."""
        import torch
        import torch.distributed as dist

        self.device = device
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if self.backend == "nccl":
            torch.cuda.set_device(device)
        elif not dist.is_gloo_available():
            raise InputError("--dist", "a PyTorch with gloo (torch.distributed on the CPU)",
                             "none in this PyTorch")
        kwargs = {"device_id": device} if self.backend == "nccl" else {}
        dist.init_process_group(self.backend, rank=self.rank, world_size=self.world, **kwargs)
        global _started
        _started = self
        return self

    def sum_(self, t):
        """Sums `t` over ranks in place (on its device); returns it."""
        if self.world > 1:
            import torch.distributed as dist
            dist.all_reduce(t)
        return t

    def decide(self, flag):
        """Rank 0's `flag` (a bool) on every rank: a decision taken from a clock."""
        if self.world == 1:
            return bool(flag)
        import torch
        import torch.distributed as dist
        t = torch.tensor([1 if flag else 0], device=self.device, dtype=torch.int32)
        dist.broadcast(t, 0)
        return bool(t.item())

    def gather(self, value):
        """[value of rank 0, rank 1, ...] (integers) on every rank."""
        if self.world == 1:
            return [value]
        import torch
        import torch.distributed as dist
        t = torch.tensor([value], device=self.device, dtype=torch.int64)
        out = [torch.zeros_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        return [int(x.item()) for x in out]

    def barrier(self):
        if self.world > 1:
            import torch.distributed as dist
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def close(self, ok=True):
        """Ends the process group (after a barrier where the run went well: no rank tears its
        group down while another still talks to it)."""
        import torch.distributed as dist
        global _started
        _started = None
        if self.mode == "none" or not dist.is_initialized():
            return
        if ok:
            self.barrier()
        dist.destroy_process_group()


_started = None  # the Group whose process group this process started


def shutdown(ok=True):
    """Ends the process group setup() started, if any (ok: the ranks agree that the run ended:
    a barrier first)."""
    if _started is not None:
        _started.close(ok)


def single():
    return Group()


def setup(args, resolve_device):
    """The Group of this process and its device: --dist none, one process on --device; else
    torchrun's rank on cuda:LOCAL_RANK (--device auto or cuda) or the CPU (--device cpu, or auto
    without CUDA), its process group started."""
    import torch

    found = launch(args)
    if found is None:
        return single(), resolve_device(args.device)
    rank, world, local = found
    if args.device not in ("auto", "cpu", "cuda"):
        raise InputError("--device", "auto, cpu or cuda under --dist (rank r runs on "
                         "cuda:LOCAL_RANK)", repr(args.device))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if local >= count:
            raise InputError("--device", f"a CUDA device per local rank (LOCAL_RANK {local}; "
                             f"this machine has {count})", repr(args.device))
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return Group(args.dist, rank, world, local).start(device), device


def is_sharded(t):
    """Whether `t` is a DTensor (an FSDP2 parameter, gradient or optimizer state)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(t, DTensor)


def full(t):
    """The whole tensor of a DTensor (a collective: every rank calls it), else `t`."""
    return t.full_tensor() if is_sharded(t) else t


def shard_like(whole, like):
    """This rank's part of `whole` (a tensor every rank holds) placed as the DTensor `like`: a
    DTensor of the same mesh and placements, made without communication."""
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements,
                             src_data_rank=None)


def local_rows(mask, like):
    """This rank's rows of a [N] mask for a DTensor `like` sharded over its first dimension."""
    return shard_like(mask, like).to_local()


def reshard(model):
    """Every FSDP2 module of `model` back to its shards (its parameters the DTensors)."""
    from torch.distributed.fsdp import FSDPModule
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def shard_model(model, group, param_dtype=None):
    """FSDP2: fully_shard on every decoder layer, then on the model; bf16 compute with fp32
    gradient reduction where `param_dtype` is bfloat16 (the parameters stay fp32)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(group.device.type, (group.world,))
    policy = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
              if param_dtype is not None and param_dtype != torch.float32
              else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
