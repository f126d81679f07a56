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
