"""examples/train_sparse_llama.py runs (a few CPU steps) and reports loss, L0 and tokens/s."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_sparse_llama.py")


def test_example_trains():
    out = subprocess.run([sys.executable, EXAMPLE, "--device", "cpu", "--steps", "5"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("final: loss") and "L0 per layer" in last and "tokens/s" in last
