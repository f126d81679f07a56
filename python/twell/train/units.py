"""What twell.train does to a model's units when a dead-unit window closes: re-initialises the
dead ones (--reinit-dead-every) and re-chooses the hot ones (--hot-units), keeping the optimizer's
weights and state in step with the model's."""
import torch

import twell.torch as tt
from twell.torch import hot
from twell.train import distributed


def close_window(trainer):
    """The full window's dead units recorded (LayerMonitor.close_window), then re-initialised
    where --reinit-dead-every says so, then the hot units re-chosen from its counts."""
    a = trainer.args
    # No re-initialisation in the run's last reinit_dead_every steps: re-initialised units fire
    # densely at first, and the final model would keep what had no time to settle.
    reinit = (bool(a.reinit_dead_every)
              and trainer.step - trainer.last_reinit >= a.reinit_dead_every
              and trainer.step + a.reinit_dead_every <= a.steps)
    masks = trainer.monitor.close_window(reinit=reinit, dtype=trainer.dtype)
    if reinit:
        reinit_state(trainer, masks)
    if a.hot_units:
        split_hot(trainer, trainer.monitor.last_hits)


def split_hot(trainer, hits):
    """--hot-units: each layer's most active units of the closed window run dense (split_hot),
    fp32 master weights and every optimizer state following the permutation."""
    index = {id(p): i for i, p in enumerate(trainer.params)}
    with torch.no_grad():
        for name, module in tt.sparse_modules(trainer.model):
            weights = [(module.up_proj.weight, 0), (module.down_proj.weight, 1)] + (
                [(module.gate_proj.weight, 0)] if module.gated else [])
            masters = [(trainer.opt_params[index[id(w)]], d) for w, d in weights]
            separate = any(t is not w for (t, _), (w, _) in zip(masters, weights))
            perm = module.split_hot(trainer.args.hot_units, hits[name],
                                    optimizer=None if separate else trainer.optimizer)
            if separate:
                for t, d in masters:
                    hot.permute_units(t, perm, d)
                    for v in trainer.optimizer.state.get(t, {}).values():
                        if torch.is_tensor(v) and v.shape == t.shape:
                            hot.permute_units(v, perm, d)


def reinit_state(trainer, masks):
    """After LayerMonitor.close_window re-initialised the `masks` units' gate rows: the step and
    counts recorded, the rows copied to fp32 master weights, their AdamW moments zeroed."""
    trainer.last_reinit = trainer.step
    counts = {n: int(mask.sum()) for n, mask in masks.items()}
    trainer.acc["reinit"] = {n: trainer.acc["reinit"].get(n, 0) + c for n, c in counts.items()}
    # The new gate rows must reach the optimizer's weights, and the rows' AdamW moments
    # (built while the units were dead) start again from zero.
    index = {id(p): i for i, p in enumerate(trainer.params)}
    with torch.no_grad():
        for (name, module), mask in zip(tt.sparse_modules(trainer.model), masks.values()):
            if not counts[name]:
                continue
            w = module.first_weight
            target = trainer.opt_params[index[id(w)]]
            if target is not w:
                target[mask] = w[mask].float()
            for key in ("exp_avg", "exp_avg_sq"):
                state = trainer.optimizer.state.get(target, {})
                if key in state and distributed.is_sharded(state[key]):  # FSDP2: my rows
                    state[key].to_local()[distributed.local_rows(mask, state[key])] = 0
                elif key in state:
                    state[key][mask] = 0
