"""bench/op_graph.py: its options, the CPU run that has nothing to time, and (GPU) its rows: the
torch op, the C++ plan and the dense MLP graph-replayed on a tiny Llama."""
import json
import math
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

import twell  # noqa: E402
from bench_scripts import load  # noqa: E402

TINY = ["--layers", "2", "--hidden", "64", "--intermediate", "256", "--heads", "4", "--vocab", "128",
        "--batch", "2", "--seq", "32"]
FIELDS = {"suite", "device", "dtype", "M", "K", "N", "layers", "density", "reps", "dense_us",
          "plan_us", "op_us", "op_minus_plan_us", "speedup", "plan_dense_layers", "op_dense_layers"}


def _bench():
    return load("op_graph")


def test_op_bench_options():
    op = _bench()
    ms, reps, args = op.options(["--m", "1,16", "--reps", "5", "--hidden", "64"])
    assert (ms, reps, args.hidden, args.layers) == ([1, 16], 5, 64, 8)
    for bad in (["--m", "0"], ["--m", "a"], ["--reps", "2"], ["--m"]):
        with pytest.raises(SystemExit):
            op.options(bad)


def test_op_bench_on_cpu_times_nothing(tmp_path, capsys):
    assert _bench().main(TINY + ["--device", "cpu", "--out", str(tmp_path)]) == 0
    assert "needs a CUDA device" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "op.json")


@pytest.mark.skipif(not (torch.cuda.is_available() and twell.cuda_compiled()), reason="needs CUDA")
def test_op_bench_rows_on_cuda(tmp_path):
    assert _bench().main(TINY + ["--m", "1,3", "--reps", "3", "--densities", "0.05",
                                 "--out", str(tmp_path)]) == 0
    rows = json.load(open(tmp_path / "op.json"))
    assert [r["M"] for r in rows] == [1, 3]
    for r in rows:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["suite"] == "op" and (r["K"], r["N"], r["layers"], r["reps"]) == (64, 256, 2, 3)
        for way in ("dense_us", "plan_us", "op_us"):
            assert 0 < r[way]["p20"] <= r[way]["median"] <= r[way]["p80"], r
        assert math.isfinite(r["op_minus_plan_us"]) and 0 < r["density"] <= 1
        assert 0 <= r["plan_dense_layers"] <= 2 and 0 <= r["op_dense_layers"] <= 2
