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
