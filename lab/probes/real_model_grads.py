# Lab probe (python3 lab/probes/real_model_grads.py [CHECKPOINT], from the repository root, on a CUDA
# machine with the twell package installed; scripts/real-model train makes the checkpoint).
# Whole-model gradients: dense (cuBLAS bf16 MLPs), twell sparse, and a differently rounded exact
# dense (fp32 MLP math, bf16 out): is twell's difference a bug or the model's sensitivity? And
# in-model: do the twell modules' weight gradients match fp32 math on their own in-model x, dy?
import sys, torch
sys.path.insert(0, "bench")
import model as mb  # noqa
import twell.torch as tt  # noqa
from twell.torch.patch import _set as set_module
args = mb.parse_args(["--checkpoint", sys.argv[1] if len(sys.argv) > 1 else "build/real/run/checkpoint"])
dev = torch.device("cuda")
m, ck, ids, src = mb.load_checkpoint(args, dev, torch.bfloat16)
sw = mb.Swap(m, 0.0, "sparse")

class F32MLP(torch.nn.Module):
    def __init__(self, orig):
        super().__init__()
        self.orig = orig
    def forward(self, x):
        o = self.orig
        xf = x.float()
        h = torch.relu(xf @ o.gate_proj.weight.float().T) * (xf @ o.up_proj.weight.float().T)
        return (h @ o.down_proj.weight.float().T).to(x.dtype)
f32 = [(n, F32MLP(orig)) for n, orig in sw.dense]
def use(which):
    if which == "f32":
        for n, mod in f32:
            set_module(m, n, mod)
    else:
        sw.use(which)
m.train()
params = dict(m.named_parameters())
for p in params.values():
    p.requires_grad_(True)
caps = {}
def step(which, hook=False):
    use(which)
    for p in params.values():
        p.grad = None
    hs = []
    if hook:
        for i, layer in enumerate(m.model.layers):
            def f(mod, inp, out, i=i):
                caps[i] = {"x": inp[0].detach().reshape(-1, inp[0].shape[-1]).clone()}
                out.register_hook(lambda g: caps[i].__setitem__("dy", g.detach().reshape(-1, g.shape[-1]).clone()))
            hs.append(layer.mlp.register_forward_hook(f))
    loss = m(ids, labels=ids, use_cache=False).loss
    loss.backward()
    for h in hs:
        h.remove()
    return float(loss), {k: p.grad.float().clone() for k, p in params.items()}
def total(a, b):
    num = sum(float((a[k] - b[k]).norm() ** 2) for k in a)
    den = sum(float(b[k].norm() ** 2) for k in b)
    return (num / den) ** 0.5
ld, gd = step("dense")
ld2, gd2 = step("dense")
lf, gf = step("f32")
lt, gt = step("twell", hook=True)
print(f"loss dense {ld:.6f} dense again {ld2:.6f} f32 {lf:.6f} twell {lt:.6f}")
print(f"grad rel: dense-vs-dense {total(gd2, gd):.2e}  f32-vs-dense {total(gf, gd):.2e}  "
      f"twell-vs-dense {total(gt, gd):.2e}  twell-vs-f32 {total(gt, gf):.2e}", flush=True)
for i, layer in enumerate(m.model.layers):
    x, dy = caps[i]["x"].float(), caps[i]["dy"].float()
    o = sw.dense[i][1]
    wg, wu, wd = (w.weight.detach().float() for w in (o.gate_proj, o.up_proj, o.down_proj))
    g = x @ wg.T; u = x @ wu.T; h = torch.relu(g) * u; dh = dy @ wd
    dg = dh * u * (g > 0); du = dh * torch.relu(g)
    ref = {"gate_proj": dg.T @ x, "up_proj": du.T @ x, "down_proj": dy.T @ h}
    pre = f"model.layers.{i}.mlp."
    print(f"layer {i} in-model twell grads vs fp32 on its own x, dy: " + " ".join(
        f"{k} {float((gt[pre + k + '.weight'] - ref[k]).norm() / ref[k].norm()):.1e}" for k in ref)
        + " | twell-vs-dense this layer: " + " ".join(
        f"{k} {float((gt[pre + k + '.weight'] - gd[pre + k + '.weight']).norm() / gd[pre + k + '.weight'].norm()):.1e}" for k in ref)
        + " | f32-vs-dense: " + " ".join(
        f"{k} {float((gf[pre + k + '.weight'] - gd[pre + k + '.weight']).norm() / gd[pre + k + '.weight'].norm()):.1e}" for k in ref), flush=True)
