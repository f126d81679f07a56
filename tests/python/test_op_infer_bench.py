"""bench/op_infer.py: its options and its rows on the CPU (one inference call through the twell
module against torch's dense MLP: time, which way ran, agreement)."""
import json

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from bench_scripts import load  # noqa: E402

FIELDS = {"suite", "device", "dtype", "M", "K", "N", "pattern", "density", "reps", "dense_ms",
          "twell_ms", "speedup", "torch_share", "rel_diff", "threads"}


def test_op_infer_bench_options():
    a = load("op_infer").parse_args(["--m", "1,16", "--densities", "0.01,0.5",
                                     "--dtypes", "float32,bfloat16", "--reps", "4"])
    assert (a.m, a.densities, a.dtypes, a.reps) == ([1, 16], [0.01, 0.5],
                                                    [torch.float32, torch.bfloat16], 4)
    for bad in (["--m", "0"], ["--m", "x"], ["--densities", "1.5"], ["--patterns", "zipf"],
                ["--reps", "2"], ["--k", "1"], ["--dtypes", "float13"], ["--dtypes", "float64"],
                ["--dtypes", "int32"]):
        with pytest.raises(SystemExit):
            load("op_infer").parse_args(bad)


def test_op_infer_bench_rows_on_the_cpu(tmp_path):
    load("op_infer").main(["--m", "1,24", "--k", "64", "--n", "256", "--densities", "0.02,0.5",
                           "--dtypes", "float32,bfloat16", "--reps", "5", "--warmup", "5",
                           "--out", str(tmp_path)])
    rows = json.load(open(tmp_path / "op_infer.json"))
    assert len(rows) == 8
    for i, r in enumerate(rows):  # dtype, then density, then M
        want = (0.02, 0.5)[(i // 2) % 2]
        assert want / 3 < r["density"] < want * 3, (want, r["density"])
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["suite"] == "op_infer" and (r["K"], r["N"]) == (64, 256)
        for way in ("dense_ms", "twell_ms"):
            assert 0 < r[way]["p20"] <= r[way]["median"] <= r[way]["p80"], r
        assert 0 <= r["torch_share"] <= 1 and r["threads"] >= 1
        assert r["rel_diff"] < (1e-5 if r["dtype"] == "float32" else 3e-2), r
