"""bench/op_train.py: its options, the run without CUDA that measures nothing, and (GPU) its rows:
one FFN training step through the torch op against dense torch, time, peak memory and agreement."""
import json
import math
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import twell  # noqa: E402
from bench_scripts import load  # noqa: E402

FIELDS = {"suite", "device", "dtype", "M", "K", "N", "pattern", "density", "reps", "dense_ms",
          "twell_ms", "speedup", "dense_peak_mb", "twell_peak_mb", "peak_ratio", "dense_held_mb",
          "twell_held_mb", "rel_diff", "saved_form", "twell_saved_mb", "workspace_mb"}


def test_op_train_bench_options():
    a = load("op_train").parse_args(["--m", "256,512", "--densities", "0.01,0.02",
                                     "--patterns", "uniform,heavy_tailed", "--reps", "4"])
    assert (a.m, a.densities, a.patterns, a.reps) == ([256, 512], [0.01, 0.02],
                                                      ["uniform", "heavy_tailed"], 4)
    for bad in (["--m", "0"], ["--m", "x"], ["--densities", "1.5"], ["--patterns", "zipf"],
                ["--reps", "2"], ["--k", "1"]):
        with pytest.raises(SystemExit):
            load("op_train").parse_args(bad)


@pytest.mark.skipif(torch.cuda.is_available() and twell.cuda_compiled(), reason="CUDA is here")
def test_op_train_bench_without_cuda_measures_nothing(tmp_path, capsys):
    assert load("op_train").main(["--out", str(tmp_path)]) == 0
    assert "needs a CUDA device" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "op_train.json")


@pytest.mark.skipif(not (torch.cuda.is_available() and twell.cuda_compiled()), reason="needs CUDA")
def test_op_train_bench_rows_on_cuda(tmp_path):
    assert load("op_train").main(["--m", "512", "--k", "128", "--n", "512", "--densities", "0.02",
                                  "--patterns", "uniform,heavy_tailed", "--reps", "3",
                                  "--warmup", "2", "--out", str(tmp_path)]) == 0
    rows = json.load(open(tmp_path / "op_train.json"))
    assert [r["pattern"] for r in rows] == ["uniform", "heavy_tailed"]
    for r in rows:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["suite"] == "op_train" and (r["M"], r["K"], r["N"]) == (512, 128, 512)
        for way in ("dense_ms", "twell_ms"):
            assert 0 < r[way]["p20"] <= r[way]["median"] <= r[way]["p80"], r
        assert 0 < r["density"] < 0.1 and r["saved_form"] in ("compact", "dense")
        assert r["dense_peak_mb"] > 0 and r["twell_peak_mb"] > 0 and r["twell_held_mb"] > 0
        # bf16 against bf16, both fp32-accumulated: rounding apart
        assert all(math.isfinite(v) and v < 3e-2 for v in r["rel_diff"].values()), r["rel_diff"]
