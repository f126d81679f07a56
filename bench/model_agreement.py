"""The whole-model benchmark's agreement (bench/model.py): twell's distance from the dense model,
and its floor, the distance of the dense model with its MLPs rounded differently."""
import math

import torch


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


class SplitMLP(torch.nn.Module):
    """The model's own MLP computed exactly but rounded differently: every product as two GEMMs
    over the halves of its inner dimension, added. Its distance from the model's own MLP is how far
    rounding alone moves the outputs (the agreement's floor)."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    @staticmethod
    def _mm(a, linear):
        w, half = linear.weight, a.shape[-1] // 2
        return (torch.nn.functional.linear(a[..., :half], w[:, :half])
                + torch.nn.functional.linear(a[..., half:], w[:, half:]))

    def forward(self, x):
        m = self.mlp
        h = m.act_fn(self._mm(x, m.gate_proj)) * self._mm(x, m.up_proj) \
            if hasattr(m, "gate_proj") else m.act_fn(self._mm(x, m.up_proj))
        return self._mm(h, m.down_proj)


def distance(mode, out, ref, params, ref_grads):
    """Relative distance from the dense model: the logits (inference), or the larger of the loss's
    and all gradients' together (training; the gradients are those in params now)."""
    if mode == "inference":
        return rel(out, ref)
    num = sum(float((p.grad.float() - g.float()).norm() ** 2) for p, g in zip(params, ref_grads))
    den = sum(float(g.float().norm() ** 2) for g in ref_grads)
    return max(math.sqrt(num / max(den, 1e-30)), abs(float(out) - float(ref)) / abs(float(ref)))


def agrees(row):
    """twell within --tolerance of the dense model, or within twice the rounding floor: a trained
    model can amplify bf16 rounding in its gradients (a differently rounded exact MLP moved one
    trained model's gradients by 1.1 relative), which no exact kernel can avoid."""
    diff, floor = row["rel_diff"], row.get("rel_diff_floor") or 0.0
    return math.isfinite(diff) and (diff <= row["tolerance"] or diff <= 2 * floor)
