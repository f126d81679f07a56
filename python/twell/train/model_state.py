"""A Trainer's whole-model state as one process holds it, for checkpoint.py: the weights and
fp32 master weights, the optimizer's state, the shapes a checkpoint must have, and loading them
back (under FSDP2 gathered from and scattered to each rank's shards)."""
import torch

from twell.train import distributed


def weights_state(trainer):
    """(model state dict, fp32 master weights or None) as one process holds them, on rank 0;
    (None, None) on the others. Under FSDP2 every rank calls it (it gathers the shards)."""
    if not trainer.fsdp:
        return (trainer.model.state_dict(), trainer.master) if trainer.dist.main else (None, None)
    distributed.reshard(trainer.model)  # the root keeps its weights gathered after a forward
    params = dict(trainer.model.named_parameters())
    index = {id(p): i for i, p in enumerate(trainer.params)}
    model = {}
    master = [None] * len(trainer.params) if trainer.keeps_master else None
    for name, value in trainer.model.state_dict().items():
        p = params.get(name)
        whole = distributed.full(p if p is not None else value).detach()
        if not trainer.dist.main:
            continue
        whole = whole.to("cpu", copy=True)
        if p is not None and master is not None and id(p) in index:
            master[index[id(p)]] = whole
            whole = whole.to(trainer.dtype)
        model[name] = whole
    return (model, master) if trainer.dist.main else (None, None)


def optimizer_state(trainer):
    """The optimizer's state_dict as one process holds it, on rank 0 (None elsewhere)."""
    opt = trainer.optimizer.state_dict()
    if not trainer.fsdp:
        return opt if trainer.dist.main else None
    state = {}
    for i in sorted(opt["state"]):
        s = {k: distributed.full(v) for k, v in opt["state"][i].items()}
        state[i] = {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in s.items()}
    return {"state": state, "param_groups": opt["param_groups"]} if trainer.dist.main else None


def weights_spec(trainer):
    """Name -> a tensor of the shape and dtype a checkpoint's model entry must have."""
    state = trainer.model.state_dict()
    if not trainer.fsdp:
        return state
    return {k: torch.empty(tuple(v.shape), device="meta",
                           dtype=trainer.dtype if v.is_floating_point() else v.dtype)
            for k, v in state.items()}


def master_spec(trainer):
    """The master weights a checkpoint must have (tensors of their shapes), or None."""
    if trainer.master is not None or not (trainer.fsdp and trainer.keeps_master):
        return trainer.master
    return [torch.empty(tuple(p.shape), device="meta") for p in trainer.params]


@torch.no_grad()
def load_weights(trainer, model, master):
    """Loads checked whole tensors (checkpoint.load): every rank holds them; FSDP2 ranks keep
    their shards (of the fp32 master weights under bf16)."""
    if not trainer.fsdp:
        trainer.model.load_state_dict(model)
        if trainer.master is not None:
            for m, s in zip(trainer.master, master):
                m.copy_(s)
        return
    distributed.reshard(trainer.model)
    index = {id(p): i for i, p in enumerate(trainer.params)}
    params = dict(trainer.model.named_parameters())
    for name, value in trainer.model.state_dict().items():
        p = params.get(name)
        if p is None:  # a buffer
            dict(trainer.model.named_buffers())[name].copy_(model[name])
            continue
        source = master[index[id(p)]] if master is not None else model[name]
        if distributed.is_sharded(p):
            p.to_local().copy_(distributed.shard_like(source.float(), p).to_local())
        else:
            p.copy_(source)


def load_optimizer(trainer, state):
    """Loads a checked optimizer state dict (FSDP2: each rank's shards of its tensors)."""
    if trainer.fsdp:
        params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
        state["state"] = {i: {k: distributed.shard_like(v, params[i])
                              if k != "step" and distributed.is_sharded(params[i]) else v
                              for k, v in s.items()}
                          for i, s in state["state"].items()}
    trainer.optimizer.load_state_dict(state)
