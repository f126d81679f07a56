"""bench/model.py runs end to end (a tiny Llama on the CPU) and writes its harness rows; its
generate mode's rows and parts (prompts, first divergence, the static cache's fallback)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

from bench_scripts import load  # noqa: E402

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "model.py")
TINY = ["--device", "cpu", "--layers", "2", "--hidden", "64", "--intermediate", "256", "--heads",
        "4", "--vocab", "128", "--batch", "2", "--seq", "32", "--reps", "2", "--warmup", "1"]
GENERATE = ["--modes", "generate", "--prompt-len", "8", "--new-tokens", "4"]
GENERATE_FIELDS = {
    "suite", "mode", "device", "backend", "dtype", "layers", "hidden", "intermediate", "heads",
    "vocab", "batch", "prompt_len", "new_tokens", "tokens", "gen_cache", "dense_ms", "twell_ms",
    "speedup", "dense_tokens_per_s", "twell_tokens_per_s", "identical_tokens", "first_divergence",
    "target_density", "density", "density_min", "density_max", "peak_bytes_dense",
    "peak_bytes_twell", "checkpoint", "input", "idle_power_w", "energy_j_per_token_dense",
    "energy_j_per_token_twell", "energy_ratio", "avg_power_w_dense", "avg_power_w_twell",
    "energy_steps"}


def _bench():
    return load("model")


def _check_generate_row(r):
    assert GENERATE_FIELDS <= set(r), GENERATE_FIELDS - set(r)
    assert r["suite"] == "model" and r["mode"] == "generate" and r["backend"] == "cpu"
    assert (r["prompt_len"], r["new_tokens"]) == (8, 4) and r["tokens"] == r["batch"] * 4
    assert "seq" not in r and "rel_diff" not in r
    assert r["gen_cache"] == "static"
    assert r["dense_tokens_per_s"] > 0 and r["twell_tokens_per_s"] > 0 and r["speedup"] > 0
    assert r["dense_tokens_per_s"] == pytest.approx(r["tokens"] / r["dense_ms"]["median"] * 1e3)
    assert r["dense_ms"]["p20"] <= r["dense_ms"]["median"] <= r["dense_ms"]["p80"]
    assert isinstance(r["identical_tokens"], bool)
    if r["identical_tokens"]:
        assert r["first_divergence"] is None
    else:
        d = r["first_divergence"]
        assert 0 <= d["row"] < r["batch"] and 0 <= d["position"] < 4
        split = d["split_divergence"]  # the split MLPs' own generate
        assert split is None or (0 <= split["row"] < r["batch"] and 0 <= split["position"] < 4)
    assert 0 < r["density"] <= 1 and r["density_min"] <= r["density"] <= r["density_max"]
    assert r["energy_j_per_token_dense"] is None and r["idle_power_w"] is None  # no NVML


def test_model_bench_writes_rows(tmp_path):
    out = subprocess.run([sys.executable, BENCH, *TINY, "--densities", "0.05,0.3", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.load(open(tmp_path / "model.json"))
    assert [(r["mode"], r["target_density"]) for r in rows] == [
        ("inference", 0.05), ("training", 0.05), ("inference", 0.3), ("training", 0.3)]
    for r in rows:
        assert r["suite"] == "model" and r["backend"] == "cpu" and r["tokens"] == 64
        # The calibration hits the target on the tokens it saw (all of them here).
        assert abs(r["density"] - r["target_density"]) < 0.01, r
        assert r["dense_ms"]["median"] > 0 and r["twell_ms"]["median"] > 0 and r["speedup"] > 0
        assert 0 <= r["rel_diff"] < 1e-4, r  # float32: rounding only
        assert 0 <= r["rel_diff_floor"] < 1e-4, r  # the split MLP: rounding only too
    assert rows[1]["loss_twell"] == pytest.approx(rows[1]["loss_dense"], rel=1e-5)
    assert all(r["hot_units"] == 0 and r["hot_share"] is None
               and r["hot_units_per_layer"] is None for r in rows)


def test_model_bench_hot_units(tmp_path):
    """--hot-units: the same function (rounding only), rows that say so, and a bad H refused."""
    out = subprocess.run([sys.executable, BENCH, *TINY, "--densities", "0.05", "--hot-units",
                          "64", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.load(open(tmp_path / "model.json"))
    assert [r["mode"] for r in rows] == ["inference", "training"]
    for r in rows:
        assert r["hot_units"] == 64 and len(r["hot_share"]) == 2
        assert all(0.25 <= s <= 1 for s in r["hot_share"])  # at least their share of the units
        assert 0 <= r["rel_diff"] < 1e-4, r
        assert abs(r["density"] - 0.05) < 0.01, r  # l0 counts the hot units too
    assert "hot units a layer 64 (64;" in out.stdout
    assert all(r["hot_units_per_layer"] == [64, 64] for r in rows)
    auto = subprocess.run([sys.executable, BENCH, *TINY, "--densities", "0.05", "--hot-units",
                           "auto", "--modes", "inference", "--out", str(tmp_path / "auto")],
                          capture_output=True, text=True, timeout=600)
    assert auto.returncode == 0, auto.stdout + auto.stderr
    row = json.load(open(tmp_path / "auto" / "model.json"))[0]
    # the default candidates 256..1024 are not below this model's 256 units: only 0 competes
    assert row["hot_units"] == "auto" and row["hot_units_per_layer"] == [0, 0]
    assert 0 <= row["rel_diff"] < 1e-4
    bad = subprocess.run([sys.executable, BENCH, *TINY, "--hot-units", "256"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "--hot-units 256: expected 0 (none) or a multiple of 8 up " \
        "to 255" in bad.stderr


def test_model_bench_floor(tmp_path, capsys):
    """--floor: prefill rows gain the gate-only model's time; the floor MLP runs the gate GEMM and
    returns zeros; training rows have no floor."""
    bench = _bench()
    assert bench.main([*TINY, "--densities", "0.05", "--floor", "--out", str(tmp_path)]) == 0
    rows = json.load(open(tmp_path / "model.json"))
    inference, training = rows
    assert inference["floor_ms"]["median"] > 0
    assert inference["floor_speedup"] == pytest.approx(
        inference["dense_ms"]["median"] / inference["floor_ms"]["median"])
    assert inference["floor_energy_ratio"] is None and inference["avg_power_w_floor"] is None  # no NVML
    assert "floor_ms" not in training
    assert "floor (gate GEMM only)" in capsys.readouterr().out

    import torch
    mlp = torch.nn.Module()
    mlp.gate_proj = torch.nn.Linear(8, 16, bias=False)
    floor = load("model_floor").GateOnlyMLP(mlp)
    x = torch.randn(3, 8)
    y = floor(x)
    assert y.shape == x.shape and not y.any()
    assert floor.weight is mlp.gate_proj.weight

    # Without a meter energy_case returns at once: floor_fields itself puts the dense MLPs back.
    used = []

    class FakeSwap:
        def use(self, which):
            used.append(which)

    import argparse
    args = argparse.Namespace(reps=2, energy_seconds=1.0)
    fields = load("model_floor").floor_fields(args, FakeSwap(), lambda which: None, torch.device("cpu"),
                                              None, {"dense": [4.0, 4.0]}, bench.energy_case, 16)
    assert used[0] == "floor" and used[-1] == "dense"
    assert fields["floor_energy_ratio"] is None and fields["floor_ms"]["median"] >= 0


def test_model_bench_agreement_rule():
    """twell agrees within --tolerance, or within twice the differently rounded model's distance;
    never when the distance is not finite."""
    agrees = _bench().agrees
    row = {"rel_diff": 0.05, "rel_diff_floor": 0.0, "tolerance": 0.1}
    assert agrees(row)
    assert not agrees({**row, "rel_diff": 0.3})
    assert agrees({**row, "rel_diff": 0.8, "rel_diff_floor": 1.1})  # a trained model's gradients
    assert not agrees({**row, "rel_diff": 0.8, "rel_diff_floor": 0.3})
    assert not agrees({**row, "rel_diff": float("nan"), "rel_diff_floor": 1.0})


def test_model_bench_split_mlp_is_the_same_function():
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, hidden_act="relu")
    mlp = transformers.models.llama.modeling_llama.LlamaMLP(cfg)
    x = torch.randn(5, 64)
    torch.testing.assert_close(_bench().SplitMLP(mlp)(x), mlp(x), rtol=1e-5, atol=1e-6)


def test_model_bench_rejects_a_bad_mode():
    out = subprocess.run([sys.executable, BENCH, *TINY, "--modes", "decode", "--no-write"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "unknown mode" in out.stderr


def test_model_bench_generates(tmp_path, capsys):
    bench = _bench()
    rc = bench.main([*TINY, *GENERATE, "--densities", "0.1", "--gen-batches", "1,3", "--out",
                     str(tmp_path)])
    assert rc == 0
    rows = json.load(open(tmp_path / "model.json"))
    assert [(r["mode"], r["batch"]) for r in rows] == [("generate", 1), ("generate", 3)]
    for r in rows:
        _check_generate_row(r)
        assert r["target_density"] == 0.1 and r["input"] == "random ids"
        assert r["warmup"] == 1 and r["reps"] == 2
    printed = capsys.readouterr().out
    assert printed.count("identical tokens ") == 2 and "generate  layers 2 batch 3" in printed
    # --append adds a second run's rows to the file's
    assert bench.main([*TINY, *GENERATE, "--densities", "0.1", "--gen-batches", "2", "--out",
                       str(tmp_path), "--append"]) == 0
    rows = json.load(open(tmp_path / "model.json"))
    assert [(r["mode"], r["batch"]) for r in rows] == [("generate", 1), ("generate", 3), ("generate", 2)]


def test_model_bench_generate_parts():
    import torch

    mg = _bench().model_generate
    ids = torch.arange(12).reshape(2, 6)
    assert mg.prompts(ids, 3, 4).tolist() == [[0, 1, 2, 3], [6, 7, 8, 9], [0, 1, 2, 3]]
    assert mg.prompts(ids, 1, 2).tolist() == [[0, 1]]
    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert mg.first_divergence(a, a.clone()) is None
    b = a.clone()
    b[0, 3], b[1, 2] = 0, 0  # row 1 differs earlier
    assert mg.first_divergence(b, a) == {"row": 1, "position": 2}
    kw = mg.generate_kwargs(5, "static")
    assert kw["max_new_tokens"] == kw["min_new_tokens"] == 5 and kw["do_sample"] is False
    assert kw["eos_token_id"] is None and kw["cache_implementation"] == "static"
    assert "cache_implementation" not in mg.generate_kwargs(5, "dynamic")

    class NoStaticCache:  # a transformers without the static cache
        def generate(self, prompt, attention_mask, **kw):
            if "cache_implementation" in kw:
                raise ValueError("Invalid `cache_implementation` (static)")
            return torch.cat([prompt, prompt[:, :1].repeat(1, kw["max_new_tokens"])], 1)

    said = []
    step = mg.Generate(NoStaticCache(), ids, 3, "static", say=said.append)
    assert step("dense").tolist() == [[0, 0, 0], [6, 6, 6]]
    assert step.cache == "dynamic" and len(said) == 1 and "dynamic cache instead" in said[0]
    step("twell")
    assert len(said) == 1  # said once

    class FailsLater:  # the static cache works, then a call fails: no fallback mid-run
        calls = 0

        def generate(self, prompt, attention_mask, **kw):
            self.calls += 1
            if self.calls > 1:
                raise ValueError("later")
            return torch.cat([prompt, prompt[:, :1].repeat(1, kw["max_new_tokens"])], 1)

    later = mg.Generate(FailsLater(), ids, 3, "static")
    later("dense")
    with pytest.raises(ValueError, match="later"):
        later("twell")
    assert later.cache == "static"

    class Short(NoStaticCache):  # stops a token early
        def generate(self, prompt, attention_mask, **kw):
            return super().generate(prompt, attention_mask, **kw)[:, :-1]

    with pytest.raises(RuntimeError, match="2 new tokens, not 3"):
        mg.Generate(Short(), ids, 3, "dynamic")("dense")


def test_model_bench_rejects_bad_generate_options():
    bench = _bench()
    for extra, message in ((["--prompt-len", "33"], "--prompt-len 33"),
                           (["--new-tokens", "0"], "--new-tokens 0")):
        with pytest.raises(SystemExit, match=message):
            bench.main([*TINY, *GENERATE, *extra, "--no-write"])
    with pytest.raises(SystemExit):  # argparse: not a list of positive integers
        bench.main([*TINY, *GENERATE, "--gen-batches", "1,0", "--no-write"])


def test_model_bench_takes_a_checkpoint(tmp_path):
    from twell.train.cli import main as train_main

    run = tmp_path / "run"
    train_main(["--model", "tiny", "--data", "synthetic", "--device", "cpu", "--batch-size", "2",
                "--seq-len", "32", "--steps", "2", "--eval-batches", "1", "--l1", "1e-3",
                "--no-progress", "--out", str(run)])
    out = subprocess.run([sys.executable, BENCH, *TINY, "--checkpoint", str(run), "--out",
                          str(tmp_path), *GENERATE[2:], "--modes", "inference,training,generate",
                          "--gen-batches", "3"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.load(open(tmp_path / "model.json"))
    assert [r["mode"] for r in rows] == ["inference", "training", "generate"]
    for r in rows:
        assert r["checkpoint"] == str(run / "checkpoint")
        assert r["input"] == "synthetic (validation split)" and r["target_density"] is None
        assert (r["layers"], r["hidden"], r["intermediate"], r["vocab"]) == (2, 64, 256, 128)
        assert r["l1_coef"] == 1e-3 and 0 < r["density"] <= 1
        if r["mode"] == "generate":
            _check_generate_row(r)
            assert r["batch"] == 3  # the 2 validation windows' prompts, repeated
            continue
        assert 0 <= r["rel_diff"] < 1e-4
        # no GPU, no NVML: the energy fields are there, null
        for k in ("energy_j_per_token_dense", "energy_j_per_token_twell", "energy_ratio",
                  "idle_power_w"):
            assert r[k] is None, k
    hot = subprocess.run([sys.executable, BENCH, *TINY, "--checkpoint", str(run), "--no-write",
                          "--modes", "inference", "--hot-units", "32"], capture_output=True,
                         text=True, timeout=600)
    assert hot.returncode == 0 and "hot units a layer 32" in hot.stdout, hot.stdout + hot.stderr


def test_model_bench_rejects_a_missing_checkpoint(tmp_path):
    out = subprocess.run([sys.executable, BENCH, *TINY, "--checkpoint", str(tmp_path / "none"),
                          "--no-write"], capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "no such file or folder" in out.stderr


def test_model_bench_divergence_margin():
    import torch

    mg = _bench().model_generate
    prompt = torch.tensor([[7, 8, 9], [4, 5, 6]])
    ref = torch.tensor([[1, 1, 3], [1, 1, 1]])
    got = torch.tensor([[1, 2, 3], [1, 1, 1]])  # row 0 takes token 2 where dense took 1
    seen = []

    class Out:
        pass

    class FakeSwap:  # token 2's logit moves by moves[which] from dense's
        def __init__(self, moves):
            self.moves, self.which = moves, "dense"

        def use(self, which):
            self.which = which

        def model(self, ids):
            seen.append(ids.tolist())
            last = torch.tensor([0.0, 5.0, 4.99, 1.0])
            last[2] += self.moves[self.which]
            o = Out()
            o.logits = last.repeat(1, ids.shape[1], 1)
            return o

    step = mg.Generate(None, prompt, 3, "static")
    where = mg.first_divergence(got, ref)
    assert where == {"row": 0, "position": 1}
    tie = mg.divergence_margin(FakeSwap({"dense": 0.0, "twell": 0.02, "split": 0.03}), step, got, ref, where)
    assert seen[0] == [[7, 8, 9, 1]]  # the row's prompt and the shared new tokens
    assert tie["margin"] == pytest.approx(0.01, abs=1e-5) and tie["rounding"] is True
    assert tie["twell_shift"] == pytest.approx(0.02, abs=1e-5) and tie["split_shift"] == pytest.approx(0.03, abs=1e-5)
    far = mg.divergence_margin(FakeSwap({"dense": 0.0, "twell": 0.02, "split": 0.001}), step, got, ref, where)
    assert far["rounding"] is False
    assert "a rounding tie" in mg.tie_note(tie) and "beyond rounding" in mg.tie_note(far)
    assert mg.tie_note({"row": 0, "position": 1}) == ""
    far["split_divergence"] = None
    assert mg.tie_note(far).endswith("beyond rounding; split generate identical to dense")
    far["split_divergence"] = {"row": 3, "position": 0}
    assert mg.tie_note(far).endswith("; split generate differs from row 3, new token 0")
    # Dense's own forward of the prefix ranks twell's token first (margin -0.01), by less than
    # twell moves a logit (0.02): a tie within rounding, however little the split model moves;
    # by far more than either moves, beyond it.
    own = mg.divergence_margin(FakeSwap({"dense": 0.02, "twell": 0.0, "split": 0.0195}), step, got,
                               ref, where)
    assert own["margin"] == pytest.approx(-0.01, abs=1e-5) and own["split_shift"] < 1e-3
    assert own["rounding"] is True
    assert "a rounding tie (dense's own forward of the prefix ranks twell's token first)" in mg.tie_note(own)
    odd = mg.divergence_margin(FakeSwap({"dense": 0.5, "twell": 0.5, "split": 0.5}), step, got, ref,
                               where)
    assert odd["margin"] < -0.4 and odd["rounding"] is False
    assert "beyond rounding (dense's own forward" in mg.tie_note(odd)


def test_model_bench_split_divergence():
    """The split model's own generate, compared with dense's tokens, with the split MLPs in place."""
    import torch

    mg = _bench().model_generate
    ref = torch.tensor([[1, 1, 3], [1, 1, 1]])
    used = []

    class FakeSwap:
        def use(self, which):
            used.append(which)

    def step(which=None):
        return {"split": torch.tensor([[1, 1, 3], [1, 2, 1]])}[used[-1]]

    assert mg.split_divergence(FakeSwap(), step, ref) == {"row": 1, "position": 1}
    assert used == ["split"]
    assert mg.split_divergence(FakeSwap(), lambda which=None: ref.clone(), ref) is None
