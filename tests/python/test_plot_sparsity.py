"""scripts/plot-sparsity over a committed study's logs: tables, figures and results files."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "plot-sparsity")
STUDY = os.path.join(ROOT, "bench", "results", "h200", "study", "paper-0.5b-round1")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=300)


def test_tables_figures_and_results(tmp_path):
    out = run(STUDY, "--steps-run", "relu-l1-2e-4", "--out-dir", str(tmp_path),
              "--results", str(tmp_path))
    assert out.returncode == 0, out.stderr
    names = sorted(f[:-len(".jsonl")] for f in os.listdir(STUDY) if f.endswith(".jsonl"))
    for coef in ("0.0001", "0.0002", "0.0004"):
        assert f"L1 {coef}" in out.stdout
    for png in ("sparsity_pareto.png", "sparsity_steps.png"):
        with open(tmp_path / png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    study = json.loads((tmp_path / "study.json").read_text())
    rows = study["runs"] if isinstance(study, dict) else study
    assert sorted(r["name"] for r in rows) == names
    assert (tmp_path / "study.csv").read_text().count("\n") >= len(names) + 1


def test_a_folder_without_logs_is_named(tmp_path):
    out = run(str(tmp_path), "--out-dir", str(tmp_path))
    assert out.returncode != 0
    assert f"no run logs in {tmp_path}" in out.stderr


def test_late_gradient_norm_and_learning_rate(tmp_path):
    """The gradient norm column is the median over the second half of a run's steps, and a run
    at another learning rate is named by it."""
    src = os.path.join(STUDY, "relu-l1-1e-4.jsonl")
    with open(src) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = records[0]["args"]["steps"]
    late = sorted(r["grad_norm"] for r in records
                  if r["kind"] == "log" and r.get("grad_norm") is not None and r["step"] > steps / 2)
    expected = late[len(late) // 2] if len(late) % 2 else (late[len(late) // 2 - 1] + late[len(late) // 2]) / 2
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "relu-l1-0.jsonl").write_text(open(src).read())
    records[0]["args"]["lr"] = 5e-4
    (folder / "slow.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = run(str(folder), "--out-dir", str(tmp_path), "--results", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "grad norm, 2nd half" in out.stdout
    assert f"| {expected:.2f} |" in out.stdout
    assert "lr 0.0005" in out.stdout and out.stdout.count("lr 0.0005") == 3
    rows = {r["name"]: r for r in json.loads((tmp_path / "study.json").read_text())["runs"]}
    assert rows["slow"]["grad_norm_late"] == pytest.approx(expected)
    assert rows["slow"]["lr"] == 5e-4


def test_hot_share_plot(tmp_path):
    """--hot-run draws a run's firing concentration; a log without hot_share is named."""
    src = os.path.join(ROOT, "lab", "runs", "h200", "hot-share", "ship.jsonl")
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "ship.jsonl").write_text(open(src).read())
    (folder / "old.jsonl").write_text(open(os.path.join(STUDY, "relu-l1-1e-4.jsonl")).read())
    out = run(str(folder), "--baseline", "ship", "--hot-run", "ship", "--out-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "hot_share.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    out = run(str(folder), "--baseline", "ship", "--hot-run", "old", "--out-dir", str(tmp_path))
    assert out.returncode != 0 and "old's log has no hot_share" in out.stderr


def test_best_validation_and_training_ce(tmp_path):
    """The table and study.json give each run's lowest validation CE with its step, and its mean
    training CE over the 100 steps up to its last validation."""
    src = os.path.join(STUDY, "relu-l1-1e-4.jsonl")
    with open(src) as f:
        records = [json.loads(line) for line in f if line.strip()]
    logs = [r for r in records if r["kind"] == "log"]
    vals = [r for r in logs if r.get("val_ce") is not None]
    # a run whose best validation is not its last: the second validation made the lowest
    vals[1]["val_ce"] = min(r["val_ce"] for r in vals) - 0.5
    last = vals[-1]["step"]
    window = [r["train_ce"] for r in logs
              if r.get("train_ce") is not None and last - 100 < r["step"] <= last]
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "relu-l1-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = run(str(folder), "--out-dir", str(tmp_path), "--results", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"{vals[1]['val_ce']:.4f} ({vals[1]['step']})" in out.stdout
    row = json.loads((tmp_path / "study.json").read_text())["runs"][0]
    assert (row["best_val_ce"], row["best_val_step"]) == (vals[1]["val_ce"], vals[1]["step"])
    assert row["train_ce"] == pytest.approx(sum(window) / len(window))
    assert f"{row['train_ce']:.3f}" in out.stdout
