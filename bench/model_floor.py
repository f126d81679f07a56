"""The exact-FFN floor of a prefill (bench/model.py --floor): the same model with each MLP reduced
to its gate GEMM (x Wg^T, or x Wu^T without a gate: the product an exact activation-sparse FFN
computes in full before it knows which units fire), its output dropped and zeros returned. Its
time and energy per token against the dense model's bound what any exact sparse FFN can reach on
that model: the attention, norms and logits stay, and so does the gate."""
import torch

from timing import Timer, summary


class GateOnlyMLP(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.weight = (mlp.gate_proj if hasattr(mlp, "gate_proj") else mlp.up_proj).weight

    def forward(self, x):
        torch.nn.functional.linear(x, self.weight)
        return torch.zeros_like(x)


def floor_fields(args, swap, step, device, meter, times, energy_case, tokens):
    """Row fields of the floor model (swap.use("floor")): its times over args.reps steps after
    two warm-ups, its speedup over the dense median, and its energy per token against dense in
    the blocks of energy_case. Leaves the model's own MLPs in place."""
    timer = Timer(device)
    swap.use("floor")
    for _ in range(2):
        step("floor")
    floor = [timer(lambda: step("floor")) for _ in range(args.reps)]
    fields = {"floor_ms": summary(floor),
              "floor_speedup": summary(times["dense"])["median"] / summary(floor)["median"],
              "floor_energy_ratio": None, "avg_power_w_floor": None}
    e = energy_case(args, meter, swap, step, {"dense": times["dense"], "floor": floor}, device, tokens,
                    pair=("dense", "floor"))
    fields["floor_energy_ratio"] = e["energy_ratio"]
    fields["avg_power_w_floor"] = e["avg_power_w_floor"]
    swap.use("dense")  # energy_case returns early without a meter: the model's own MLPs back
    return fields


def floor_note(row):
    if row.get("floor_ms") is None:
        return ""
    note = f"; floor (gate GEMM only) {row['floor_ms']['median']:.2f} ms, {row['floor_speedup']:.3f}x"
    if row.get("floor_energy_ratio") is not None:
        note += f", energy {row['floor_energy_ratio']:.3f}x"
    return note
