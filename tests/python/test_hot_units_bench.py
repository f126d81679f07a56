"""bench/hot_units.py on the CPU: synthetic and captured layers, its rows, its refusals."""
import json

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
np = pytest.importorskip("numpy", reason="numpy is not installed")

from bench_scripts import load  # noqa: E402

TINY = ["--device", "cpu", "--k", "32", "--n", "256", "--m", "96", "--calib", "64", "--hot",
        "16,64", "--reps", "3", "--warmup", "1"]


def _check(rows, modes=("inference", "training")):
    assert sorted({r["mode"] for r in rows}) == sorted(modes)
    assert sorted({r["hot_units"] for r in rows}) == [16, 64]
    for r in rows:
        assert r["suite"] == "hot_units" and r["dtype"] == "float32" and r["N"] == 256
        assert 0 < r["density"] < 1 and 16 / 256 <= r["hot_share"] <= 1
        for key in ("dense_ms", "twell_ms", "split_ms"):
            assert r[key]["p20"] <= r[key]["median"] <= r[key]["p80"]
        assert r["speedup"] == pytest.approx(r["dense_ms"]["median"] / r["split_ms"]["median"])
        assert r["rel_diff"] < 1e-5 and r["rel_diff_twell"] < 1e-5  # float32: rounding only
        if r["mode"] == "inference":
            assert isinstance(r["twell_ran_dense"], bool) and isinstance(r["split_ran_dense"], bool)
        else:
            assert r["twell_ran_dense"] is None and r["split_ran_dense"] is None


def test_synthetic_rows(tmp_path):
    assert load("hot_units").main([*TINY, "--densities", "0.03", "--out", str(tmp_path)]) == 0
    rows = json.load(open(tmp_path / "hot_units.json"))
    assert len(rows) == 4 and all(r["M"] == 96 and r["layer"] is None for r in rows)
    _check(rows)
    # the more hot units, the larger their share
    by_h = {r["hot_units"]: r["hot_share"] for r in rows if r["mode"] == "inference"}
    assert by_h[64] > by_h[16]


def test_captured_layers(tmp_path):
    cap = tmp_path / "cap"
    cap.mkdir()
    rng = np.random.default_rng(3)
    k, n, m = 32, 256, 160
    x = rng.standard_normal((m, k)).astype("<f4")
    x[:, 0] = 1
    gate = (rng.standard_normal((n, k)) / k ** 0.5).astype("<f4")
    gate[:, 0] = -1.5  # sparse: a unit fires where its projection beats 1.5
    np.save(cap / "layer0.x.npy", x)
    np.save(cap / "layer0.gate.npy", gate)
    np.save(cap / "layer0.up.npy", (rng.standard_normal((n, k)) / k ** 0.5).astype("<f4"))
    np.save(cap / "layer0.down.npy", (rng.standard_normal((n, k)) / n ** 0.5).astype("<f4"))
    (cap / "manifest.json").write_text(json.dumps({"format": "twell-capture-1", "layers": 1,
                                                   "kind": "gated", "dtype": "float32"}))
    bench = load("hot_units")
    args = [*TINY, "--from", str(cap), "--modes", "inference", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    rows = json.load(open(tmp_path / "hot_units.json"))
    assert all(r["layer"] == 0 and r["M"] == m - 64 for r in rows)
    _check(rows, modes=("inference",))
    with pytest.raises(SystemExit, match="--calib 160: the capture has 160 rows"):
        bench.main([*args[:args.index("--calib")], "--calib", "160", *args[args.index("--hot"):]])
    with pytest.raises(SystemExit, match="--hot 256: expected fewer than the layer's 256 units"):
        bench.main([*TINY[:TINY.index("--hot")], "--hot", "256", "--reps", "3", "--from", str(cap),
                    "--no-write"])
    for bad in (["--hot", "0"], ["--modes", "decode"], ["--densities", "1.5"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
