"""bench/model.py runs end to end (a tiny Llama on the CPU) and writes its harness rows."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "model.py")
TINY = ["--device", "cpu", "--layers", "2", "--hidden", "64", "--intermediate", "256", "--heads",
        "4", "--vocab", "128", "--batch", "2", "--seq", "32", "--reps", "2", "--warmup", "1"]


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
    assert rows[1]["loss_twell"] == pytest.approx(rows[1]["loss_dense"], rel=1e-5)


def test_model_bench_rejects_a_bad_mode():
    out = subprocess.run([sys.executable, BENCH, *TINY, "--modes", "decode", "--no-write"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "unknown mode" in out.stderr


def test_model_bench_takes_a_checkpoint(tmp_path):
    from twell.train.cli import main as train_main

    run = tmp_path / "run"
    train_main(["--model", "tiny", "--data", "synthetic", "--device", "cpu", "--batch-size", "2",
                "--seq-len", "32", "--steps", "2", "--eval-batches", "1", "--l1", "1e-3",
                "--no-progress", "--out", str(run)])
    out = subprocess.run([sys.executable, BENCH, *TINY, "--checkpoint", str(run), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.load(open(tmp_path / "model.json"))
    assert [r["mode"] for r in rows] == ["inference", "training"]
    for r in rows:
        assert r["checkpoint"] == str(run / "checkpoint.pt")
        assert r["input"] == "synthetic (validation split)" and r["target_density"] is None
        assert (r["layers"], r["hidden"], r["intermediate"], r["vocab"]) == (2, 64, 256, 128)
        assert r["l1_coef"] == 1e-3 and 0 < r["density"] <= 1 and 0 <= r["rel_diff"] < 1e-4
        # no GPU, no NVML: the energy fields are there, null
        for k in ("energy_j_per_token_dense", "energy_j_per_token_twell", "energy_ratio",
                  "idle_power_w"):
            assert r[k] is None, k


def test_model_bench_rejects_a_missing_checkpoint(tmp_path):
    out = subprocess.run([sys.executable, BENCH, *TINY, "--checkpoint", str(tmp_path / "none"),
                          "--no-write"], capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "no such file or folder" in out.stderr
