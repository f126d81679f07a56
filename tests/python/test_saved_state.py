"""The saved training state is untrusted input to backward, through the binding and the torch op:
bytes that forward never wrote, corrupted or random bytes, and another plan's state raise an error
(CPU at once; CUDA at the plan's next call, the check running on the device), never a crash or
silently wrong gradients."""
import numpy as np
import pytest

import twell

from problems import make_problem

M, K, N, TILE, CAPACITY = 37, 16, 200, 64, 4


def corruptions(rng):
    return {
        "0xff": lambda b: b.fill(0xFF),
        "zero (forward never ran)": lambda b: b.fill(0),
        "random": lambda b: b.__setitem__(slice(None), rng.integers(0, 256, b.size, dtype=np.uint8)),
        "random under the header": lambda b: b.__setitem__(
            slice(0, b.size - 64), rng.integers(0, 256, b.size - 64, dtype=np.uint8)),
        "header tag": lambda b: b.__setitem__(b.size - 64 + 40, b[b.size - 64 + 40] ^ 1),
    }


def step(seed):
    rng = np.random.default_rng(seed)
    p = make_problem(rng, M, K, N).cast(np.float32)
    plan = twell.TrainingPlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY, l1_coef=0.1)
    dy = rng.standard_normal((M, K)).astype(np.float32)
    grads = [np.empty((M, K), np.float32)] + [np.empty((N, K), np.float32) for _ in range(3)]
    return rng, p, plan, dy, grads


def test_binding_backward_rejects_corrupted_state(seed):
    rng, p, plan, dy, grads = step(seed)
    for name, spoil in corruptions(rng).items():
        saved = np.zeros(plan.saved_bytes(M), np.uint8)
        plan.forward(p.x, np.empty((M, K), np.float32), saved)
        plan.backward(dy, *grads, p.x, saved)  # accepted as forward left it
        spoil(saved)
        with pytest.raises(twell.TwellError):
            plan.backward(dy, *grads, p.x, saved)
            pytest.fail(f"{name}: accepted")


def test_torch_op_rejects_corrupted_state(seed):
    torch = pytest.importorskip("torch")
    import twell.torch  # noqa: F401  (registers the ops)

    from torch_cases import devices

    rng = np.random.default_rng(seed)
    p = make_problem(rng, M, K, N)
    for device in devices():
        dt = torch.float32 if device == "cpu" else torch.bfloat16
        t = {k: torch.from_numpy(getattr(p, k)).to(device, dt) for k in ("x", "gate", "up", "down")}
        t["down"] = t["down"].t().contiguous()  # the training ops take down_proj.weight [K, N]
        args = (t["x"], t["gate"], t["up"], t["down"], TILE, CAPACITY, "sparse", -1.0)
        dy = torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(device, dt)
        coef = torch.tensor([0.1], device=device)
        for name, spoil in corruptions(rng).items():
            _, saved, _ = torch.ops.twell.ffn_train(*args)
            host = saved.cpu().numpy().copy()
            spoil(host)
            bad = torch.from_numpy(host).to(device)
            backward = lambda s: torch.ops.twell.ffn_train_backward(  # noqa: E731
                dy, t["x"], t["gate"], t["up"], t["down"], s, coef, TILE, CAPACITY, "sparse", -1.0)
            if device == "cpu":
                with pytest.raises(twell.TwellError, match="saved|header"):
                    backward(bad)
                    pytest.fail(f"{name}: accepted")
            else:  # checked on the device: the plan raises at its next call
                backward(bad)
                torch.cuda.synchronize()
                with pytest.raises(twell.TwellError, match="saved"):
                    backward(saved)
                    pytest.fail(f"{name}: not reported")
                backward(saved)  # reported once; the valid state is accepted again
