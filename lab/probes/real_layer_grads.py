# Lab probe (python3 lab/probes/real_layer_grads.py [CHECKPOINT], from the repository root, on a CUDA
# machine with the twell package installed; scripts/real-model train makes the checkpoint).
# Per-layer check of twell's training op inside a really trained model: each MLP's input x and
# upstream gradient dy from a dense training step, then twell's op (sparse, dense) on them against
# an fp32 reference, and where the error sits (rows, neurons).
import sys, torch
sys.path.insert(0, "bench")
import model as mb  # noqa
import twell.torch  # noqa
args = mb.parse_args(["--checkpoint", sys.argv[1] if len(sys.argv) > 1 else "build/real/run/checkpoint"])
dev = torch.device("cuda")
m, ck, ids, src = mb.load_checkpoint(args, dev, torch.bfloat16)
print("ids", tuple(ids.shape), flush=True)
S = ids.shape[1]
m.train()
caps = {}
def fhook(i):
    def f(mod, inp, out):
        caps[i] = {"x": inp[0].detach().reshape(-1, inp[0].shape[-1]).clone()}
        out.register_hook(lambda g: caps[i].__setitem__("dy", g.detach().reshape(-1, g.shape[-1]).clone()))
    return f
hs = [l.mlp.register_forward_hook(fhook(i)) for i, l in enumerate(m.model.layers)]
loss = m(ids, labels=ids, use_cache=False).loss
loss.backward()
for h in hs:
    h.remove()
def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
for i, layer in enumerate(m.model.layers):
    mlp = layer.mlp
    x, dy = caps[i]["x"], caps[i]["dy"].contiguous()
    wg, wu, wd = (w.weight.detach() for w in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    xf, gf, uf, df, dyf = x.float(), wg.float(), wu.float(), wd.float(), dy.float()
    g = xf @ gf.T; u = xf @ uf.T; act = g > 0; h = torch.relu(g) * u; dh = dyf @ df
    dg = dh * u * act; du = dh * torch.relu(g)
    ref = {"y": h @ df.T, "dx": dg @ gf + du @ uf, "dWg": dg.T @ xf, "dWu": du.T @ xf, "dWd": dyf.T @ h}
    gb = (x @ wg.T).float()
    l0 = act.sum(1)
    hf = {"dWg": mlp.gate_proj.weight.grad, "dWu": mlp.up_proj.weight.grad, "dWd": mlp.down_proj.weight.grad}
    print(f"layer {i}: L0 mean {l0.float().mean():.3f} max {int(l0.max())} rows>32 {(l0 > 32).sum().item()} "
          f"empty {(l0 == 0).float().mean():.3f}; |g| of actives median {g[act].abs().median() if act.any() else 0:.3e}; "
          f"sign flips bf16-vs-fp32 gate {int(((gb > 0) != act).sum())}; |x| max {x.abs().max().item():.1f}; "
          f"HF dense vs ref: " + " ".join(f"{k} {rel(hf[k], ref[k]):.1e}" for k in hf), flush=True)
    for dispatch in ("sparse", "dense"):
        xr = x.clone().requires_grad_(True)
        ws = [w.clone().requires_grad_(True) for w in (wg, wu, wd)]
        y, saved, stats = torch.ops.twell.ffn_train(xr, ws[0], ws[1], ws[2], 0, 0, dispatch, -1.0)
        y.backward(dy)
        got = {"y": y.detach(), "dx": xr.grad, "dWg": ws[0].grad, "dWu": ws[1].grad, "dWd": ws[2].grad}
        print(f"  twell {dispatch:6s} saved {saved.numel() / 2**20:.1f} MB: " +
              " ".join(f"{k} {rel(got[k], ref[k]):.1e}" for k in ref), flush=True)
        if dispatch == "sparse":
            for k in ("y", "dx"):
                e = (got[k].float() - ref[k]).norm(dim=1)
                r = ref[k].norm(dim=1)
                top = e.topk(6).indices
                print(f"   {k} worst rows: " + ", ".join(
                    f"{int(t)} (pos {int(t) % S}, L0 {int(l0[t])}, err {e[t]:.2e} / ref {r[t]:.2e})" for t in top)
                    + f"; share of err in top 6 {float(e[top].pow(2).sum() / e.pow(2).sum()):.2f}", flush=True)
            for k in ("dWg", "dWu", "dWd"):
                e = (got[k].float() - ref[k]).norm(dim=1 if k != "dWd" else 0)
                r = ref[k].norm(dim=1 if k != "dWd" else 0)
                cnt = act.sum(0)
                top = e.topk(6).indices
                print(f"   {k} worst neurons: " + ", ".join(
                    f"{int(t)} (rows {int(cnt[t])}, err {e[t]:.2e} / ref {r[t]:.2e})" for t in top)
                    + f"; share in top 6 {float(e[top].pow(2).sum() / e.pow(2).sum()):.2f}", flush=True)
    del g, u, act, h, dh, dg, du, ref, gb
