"""Every --help of python -m twell.train, python -m twell.capture and the example states each
option's default, and the smoke test in twell.train's --help runs as written, in seconds."""
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_sparse_llama.py")


def example_parser():
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("train_sparse_llama", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parser()


def train_parser():
    from twell.train.cli import parser
    return parser()


def capture_parser():
    from twell.capture import parser
    return parser()


def option_blocks(text):
    """{first option string: its help text} from argparse's --help output."""
    blocks, current = {}, None
    for line in text.splitlines():
        m = re.match(r"  (-[^\s,]+)", line)
        if m:
            current = m.group(1)
            blocks[current] = line
        elif current and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


@pytest.mark.parametrize("make", [train_parser, capture_parser, example_parser])
def test_every_default_is_in_the_help(make):
    p = make()
    blocks = option_blocks(p.format_help())
    checked = 0
    for action in p._actions:
        if (not action.option_strings or action.help == "==SUPPRESS==" or action.default is None
                or action.default is False or action.default == "==SUPPRESS=="):
            continue
        block = blocks.get(action.option_strings[0])
        assert block is not None, f"{action.option_strings[0]} is not in --help"
        assert "default" in block, f"--help shows no default for {block.strip()!r}"
        checked += 1
    assert checked >= 3


def smoke_command():
    from twell.train.cli import EPILOG
    lines = EPILOG.replace("\\\n", " ").splitlines()
    smoke = [line for line in lines if "--data synthetic" in line and "--device cpu" in line]
    assert len(smoke) == 1, "the --help examples name one CPU smoke test"
    return shlex.split(smoke[0])


def test_help_smoke_test_runs_in_seconds(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    argv = smoke_command()
    assert argv[:3] == ["python", "-m", "twell.train"]
    train_parser().parse_args(argv[3:])  # valid as written
    start = time.monotonic()
    r = subprocess.run([sys.executable] + argv[1:] + ["--out", str(tmp_path / "smoke"),
                                                      "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - start
    assert r.returncode == 0, r.stdout + r.stderr
    with open(tmp_path / "smoke" / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    logs = [rec for rec in records if rec["kind"] == "log"]
    first, last = logs[0], logs[-1]
    print(f"smoke test: {seconds:.1f} s; step {first['step']}: CE {first['train_ce']:.2f}, density "
          f"{first['mean_density']:.1%}; step {last['step']}: CE {last['train_ce']:.2f}, density "
          f"{last['mean_density']:.1%}")
    # What its comment promises: the loss falls (from ln 128 = 4.85) and so does the density.
    assert last["step"] == 100 and last["train_ce"] < 0.5 and last["val_ce"] < 0.5
    assert last["mean_density"] < 0.6 * first["mean_density"]
    assert max(last["sparse_rows"]) > 0  # twell's sparse path ran
    assert seconds < 300  # wall time: other processes on the machine may slow it a lot
