"""scripts/sparsity-sweep on the CPU: runs from a file in parallel slots, stopped runs continued by
the same command, a time budget, and bad arguments."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = os.path.join(ROOT, "scripts", "sparsity-sweep")
TINY = "--model tiny --data synthetic --device cpu --steps 4 --eval-every 0 --no-progress --seed 1"


def sweep(args, cwd):
    return subprocess.run([sys.executable, SWEEP] + args, capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_runs_stop_and_continue(tmp_path):
    runs = tmp_path / "runs.txt"
    runs.write_text(f"# two tiny runs\ndefaults: {TINY}\nrelu-a --l1 0\nrelu-b --l1 1e-3  # L1\n")
    out = tmp_path / "sweep"
    r = sweep([str(out), "--runs", str(runs), "--gpus", "0", "--per-gpu", "2", "--stop-at", "2"],
              tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "stopped at step 2" in r.stdout
    for name in ("relu-a", "relu-b"):
        ends = [x for x in records(out / name / "log.jsonl") if x["kind"] == "end"]
        assert ends[-1]["reason"] == "stop-at" and ends[-1]["step"] == 2
    r = sweep([str(out), "--runs", str(runs), "--gpus", "0", "--per-gpu", "2"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for name, coef in (("relu-a", 0.0), ("relu-b", 1e-3)):
        recs = records(out / name / "log.jsonl")
        assert [x for x in recs if x["kind"] == "resume"][0]["step"] == 2
        assert recs[-1]["kind"] == "end" and recs[-1]["reason"] == "done" and recs[-1]["step"] == 4
        assert recs[0]["args"]["l1"] == coef
    r = sweep([str(out), "--runs", str(runs), "--gpus", "0", "--only", "relu-b"], tmp_path)
    assert r.returncode == 0 and "1 of 1 runs done" in r.stdout and "relu-a" not in r.stdout
    r = sweep([str(out), "--runs", str(runs), "--gpus", "0"], tmp_path)  # nothing left to do
    assert r.returncode == 0 and "2 of 2 runs done" in r.stdout


def test_no_run_starts_without_time(tmp_path):
    runs = tmp_path / "runs.txt"
    runs.write_text(f"late {TINY}\n")
    r = sweep([str(tmp_path / "s"), "--runs", str(runs), "--gpus", "0", "--minutes", "0.5",
               "--min-start", "1"], tmp_path)
    assert r.returncode == 3 and "late" in r.stdout
    assert not (tmp_path / "s" / "late").exists()


@pytest.mark.parametrize("text, args, what", [
    ("a --steps 1\na --steps 2\n", [], "named twice"),
    ("bad/name --steps 1\n", [], "run name"),
    ("# nothing\n", [], "names no run"),
    ("a --steps 1\n", ["--per-gpu", "0"], "--per-gpu"),
    ("a --steps 1\n", ["--minutes", "-1"], "--minutes"),
    ("a --steps 1\n", ["--only", "b"], "--only"),
])
def test_bad_arguments(tmp_path, text, args, what):
    runs = tmp_path / "runs.txt"
    runs.write_text(text)
    r = sweep([str(tmp_path / "s"), "--runs", str(runs), "--gpus", "0"] + args, tmp_path)
    assert r.returncode == 2 and what in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
