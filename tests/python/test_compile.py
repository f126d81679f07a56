"""torch.compile(fullgraph=True) over modules using the twell ops: one graph, eager results."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import twell.torch as tt  # noqa: E402
import torch._dynamo.testing  # noqa: E402
from torch import nn  # noqa: E402

from torch_cases import devices, problem, module_for, skip_unless_trainable  # noqa: E402


class Block(nn.Module):
    """A residual pre-norm FFN block, as in a transformer."""

    def __init__(self, mlp):
        super().__init__()
        self.norm = nn.LayerNorm(mlp.hidden_size, dtype=mlp.up_proj.weight.dtype,
                                 device=mlp.up_proj.weight.device)
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def train_step(model, x):
    y = model(x)
    loss = y.square().mean() + tt.l1_loss(model)
    loss.backward()
    return loss.detach(), model.mlp.l0


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def compile_counted(model, backend):
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    return torch.compile(model, backend=counter, fullgraph=True), counter


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("gated", [True, False])
def test_training_compiles_to_one_graph(seed, backend, gated):
    device = "cpu"
    skip_unless_trainable(device)
    torch._dynamo.reset()
    p = problem(seed, 24, 32, 128, gated)
    model = Block(module_for(p, torch.float32, device, tile=64, capacity=8, l1_coef=0.1))
    x = torch.from_numpy(p.x).float().reshape(2, 12, 32)
    loss_eager, l0_eager = train_step(model, x)
    g_eager = grads(model)
    model.zero_grad()
    compiled, counter = compile_counted(model, backend)
    loss_c, l0_c = train_step(compiled, x)
    assert counter.frame_count == 1
    torch.testing.assert_close(loss_c, loss_eager)
    torch.testing.assert_close(l0_c, l0_eager)
    for a, b in zip(grads(model), g_eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", devices())
def test_inference_compiles_to_one_graph(seed, device):
    torch._dynamo.reset()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    p = problem(seed, 24, 32, 128, True)
    model = Block(module_for(p, dtype, device, tile=64, capacity=8)).eval()
    x = torch.from_numpy(p.x).to(device, dtype).reshape(2, 12, 32)
    compiled, counter = compile_counted(model, "inductor")
    with torch.no_grad():
        eager = model(x)
        l0_eager = model.mlp.l0.clone()
        torch.testing.assert_close(compiled(x), eager)
        # the compiled call keeps the op's counters; l0 divides them on first read
        torch.testing.assert_close(model.mlp.l0, l0_eager)
        model.mlp.freeze()
        torch.testing.assert_close(compiled(x), eager)
    assert counter.frame_count <= 2  # freeze() adds a buffer: at most one recompilation


def test_dynamic_rows(seed):
    """A symbolic row count: the fake saved size is computed from a SymInt."""
    torch._dynamo.reset()
    p = problem(seed, 40, 32, 128, True)
    model = Block(module_for(p, torch.float32, "cpu", tile=64, capacity=8, l1_coef=0.1))
    compiled, counter = compile_counted(model, "aot_eager")
    x = torch.from_numpy(p.x).float()
    for rows in (17, 23, 40):
        xr = x[:rows]
        torch._dynamo.mark_dynamic(xr, 0)
        loss_c, _ = train_step(compiled, xr)
        model.zero_grad()
        loss_e, _ = train_step(model, xr)
        model.zero_grad()
        torch.testing.assert_close(loss_c, loss_e)
    assert counter.frame_count == 1


@pytest.mark.parametrize("training", [False, True])
def test_compiled_module_refuses_a_wrong_last_dimension(training):
    """[2, 64] into a hidden-32 module would reshape to [4, 32] rows: refused as in eager mode."""
    torch._dynamo.reset()
    mod = tt.SparseGatedMLP(32, 128).train(training)
    compiled = torch.compile(mod, backend="aot_eager")
    refused = r"x: expected \[\.\.\., hidden_size=32\], got \[2, 64\]"
    with torch.set_grad_enabled(training), pytest.raises(ValueError, match=refused):
        compiled(torch.randn(2, 64))
