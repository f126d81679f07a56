"""Misuses of `python -m twell.train` and `python -m twell.capture`: each ends with exit status 2
and one line on stderr naming the argument and what it expected, never a traceback, a hang or a
run that goes on with a meaningless value."""
import json
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

from twell import capture as cap  # noqa: E402
from twell.train import data as td  # noqa: E402
from twell.train.cli import main as train_main  # noqa: E402

BASE = ["--model", "tiny", "--device", "cpu", "--batch-size", "2", "--seq-len", "16",
        "--steps", "2", "--eval-batches", "1", "--no-progress"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Inputs for the misuses: token folders, a text folder, a FIFO, a plain file, a run."""
    root = tmp_path_factory.mktemp("misuse")
    paths = {"root": root, "file": root / "plain.txt"}
    paths["file"].write_text("some words " * 200)
    data = td.TokenData(np.arange(400) % 50, np.arange(100) % 50, 50)
    paths["tokens"] = data.save(str(root / "tokens"))
    paths["beyond"] = data.save(str(root / "beyond"))
    with open(root / "beyond" / "meta.json") as f:
        meta = json.load(f)
    meta["vocab_size"] = 20
    with open(root / "beyond" / "meta.json", "w") as f:
        json.dump(meta, f)
    (root / "empty").mkdir()
    (root / "texts").mkdir()
    (root / "texts" / "a.txt").write_text("text " * 100)
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "fifo")
        (root / "fifo-texts").mkdir()
        os.mkfifo(root / "fifo-texts" / "a.txt")
    paths["run"] = root / "run"
    train_main([*BASE, "--data", "synthetic", "--out", str(paths["run"])])
    return paths


def _path(arg, files, tmp_path):
    """"@name[/more]": a path of the `files` fixture (or its folder); "%name": of the test's."""
    if arg.startswith("%"):
        return str(tmp_path / arg[1:])
    name, _, more = arg[1:].partition("/")
    path = files.get(name, files["root"] / name)
    return os.path.join(path, more) if more else str(path)


def _fill(argv, files, tmp_path):
    return [_path(a, files, tmp_path) if a[:1] in "@%" else a for a in argv]


def _run(main, argv, capsys):
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    captured = capsys.readouterr()
    return rc, captured.err.strip().splitlines(), captured.out


# (extra arguments, the argument the one line must name); "@name" is a path of the `files`
# fixture, "%name" a path in the test's own folder.
TRAIN_MISUSES = [
    (["--steps", "0"], "--steps"), (["--steps", "x"], "--steps"),
    (["--batch-size", "-1"], "--batch-size"), (["--seq-len", "0"], "--seq-len"),
    (["--grad-accum", "0"], "--grad-accum"), (["--log-every", "0"], "--log-every"),
    (["--lr", "nan"], "--lr"), (["--lr", "0"], "--lr"), (["--lr", "-1"], "--lr"),
    (["--lr", "inf"], "--lr"), (["--lr", "fast"], "--lr"),
    (["--min-lr-ratio", "nan"], "--min-lr-ratio"), (["--min-lr-ratio", "2"], "--min-lr-ratio"),
    (["--weight-decay", "inf"], "--weight-decay"), (["--weight-decay", "-0.1"], "--weight-decay"),
    (["--beta1", "1"], "--beta1"), (["--beta2", "-0.5"], "--beta2"), (["--clip", "nan"], "--clip"),
    (["--l1", "nan"], "--l1"), (["--l1", "-1"], "--l1"), (["--l1-warmup", "-1"], "--l1-warmup"),
    (["--warmup", "-3"], "--warmup"), (["--eval-every", "-1"], "--eval-every"),
    (["--eval-batches", "0"], "--eval-batches"), (["--eval-batch-size", "0"], "--eval-batch-size"),
    (["--dead-window", "-5"], "--dead-window"),
    (["--reinit-dead-every", "-1"], "--reinit-dead-every"),
    (["--reinit-dead-every", "5", "--no-dead-tracking"], "--reinit-dead-every"),
    (["--ckpt-every", "-1"], "--ckpt-every"), (["--stop-at", "-2"], "--stop-at"),
    (["--max-minutes", "nan"], "--max-minutes"), (["--max-minutes", "0"], "--max-minutes"),
    (["--seed", "-1"], "--seed"), (["--val-permille", "0"], "--val-permille"),
    (["--val-permille", "2000"], "--val-permille"), (["--max-docs", "0"], "--max-docs"),
    (["--hidden", "0"], "--hidden"), (["--hidden", "60"], "--heads"), (["--heads", "0"], "--heads"),
    (["--kv-heads", "3"], "--kv-heads"), (["--intermediate", "-1"], "--intermediate"),
    (["--layers", "0"], "--layers"), (["--model", "nope"], "--model"),
    (["--activation", "gelu"], "--activation"), (["--frobnicate"], "--frobnicate"),
    (["--device", "tpu"], "--device"), (["--device", "cuda:99"], "--device"),
    (["--device", "cpu:x"], "--device"), (["--tokenizer", "5"], "--tokenizer"),
    (["--data", "@texts", "--tokenizer", "%missing.json"], "--tokenizer"),
    (["--data", "@texts", "--tokenizer", "@file"], "--tokenizer"),
    (["--data", "@texts", "--tokenizer", "@fifo"], "--tokenizer"),
    (["--data", "%missing"], "--data"), (["--data", "@empty"], "--data"),
    (["--data", "@beyond"], "--data"), (["--data", "@fifo-texts"], "--data"),
    (["--data", "@tokens", "--seq-len", "500"], "--seq-len"),
    (["--data", "@tokens", "--seq-len", "150"], "--seq-len"),  # longer than validation
    (["--batch-size", "100000000"], "--batch-size"),
    (["--hidden", "1048576", "--heads", "1024", "--kv-heads", "1024"], "--model"),
    (["--out", "@file"], "--out"), (["--out", "@file/sub"], "--out"),
]


@pytest.mark.parametrize("extra,argument", TRAIN_MISUSES,
                         ids=[" ".join(m[0]) for m in TRAIN_MISUSES])
def test_train_misuse(files, tmp_path, capsys, extra, argument):
    if any("fifo" in a for a in extra) and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    argv = [*BASE, "--data", "synthetic", "--out", str(tmp_path / "out"),
            *_fill(extra, files, tmp_path)]
    rc, err, _ = _run(train_main, argv, capsys)
    assert rc == 2 and len(err) == 1, err
    line = err[0]
    assert line.startswith("twell.train: ") and argument in line and "Traceback" not in line
    assert not os.path.exists(tmp_path / "out" / "log.jsonl")  # nothing ran


CAPTURE_MISUSES = [
    (["@run", "--out", "%c", "--tokens", "0"], "--tokens"),
    (["@run", "--out", "%c", "--tokens", "many"], "--tokens"),
    (["@run", "--out", "%c", "--batch-size", "0"], "--batch-size"),
    (["@run", "--out", "%c", "--seq-len", "-1"], "--seq-len"),
    (["@run", "--out", "%c", "--dtype", "int8"], "--dtype"),
    (["@run"], "--out"),
    (["@run", "--out", "@file"], "--out"),
    (["%missing", "--out", "%c"], "checkpoint"),
    (["@empty", "--out", "%c"], "checkpoint"),
    (["@file", "--out", "%c"], "checkpoint"),
    (["@run", "--out", "%c", "--device", "tpu"], "--device"),
    (["@run", "--out", "%c", "--device", "cuda:99"], "--device"),
    (["@run", "--out", "%c", "--text", "@fifo"], "--text"),
    (["@run", "--out", "%c", "--text", "@empty"], "--text"),
    (["@run", "--out", "%c", "--text", "%missing.txt"], "--text"),
    (["@run", "--out", "%c", "--text", "@file", "--tokenizer", "300"], "--tokenizer"),
    (["@run", "--out", "%c", "--text", "@file", "--tokenizer", "%missing.json"], "--tokenizer"),
    (["@run", "--out", "%c", "--text", "@file", "--tokenizer", "@file"], "--tokenizer"),
    (["@run", "--out", "%c", "--data", "%missing"], "--data"),
    (["@run", "--out", "%c", "--data", "@fifo-texts"], "--data"),
    (["@run", "--out", "%c", "--data", "@beyond"], "--data"),
    (["@run", "--out", "%c", "--data", "@texts", "--text", "@file"], "--text"),
]


@pytest.mark.parametrize("argv,argument", CAPTURE_MISUSES,
                         ids=[" ".join(m[0]) for m in CAPTURE_MISUSES])
def test_capture_misuse(files, tmp_path, capsys, argv, argument):
    if any("fifo" in a for a in argv) and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    rc, err, _ = _run(cap.main, _fill(argv, files, tmp_path) + ["--no-progress"], capsys)
    assert rc == 2 and len(err) == 1, err
    line = err[0]
    assert line.startswith("twell.capture: ") and argument in line and "Traceback" not in line
    assert not os.path.exists(tmp_path / "c" / "manifest.json")


@pytest.mark.parametrize("module,argv,argument", [
    ("twell.train", ["--steps", "0"], "--steps"),
    ("twell.train", ["--lr", "nan"], "--lr"),
    ("twell.train", [*BASE, "--data", "synthetic", "--device", "cuda:99"], "--device"),
    ("twell.capture", ["missing-checkpoint", "--out", "x"], "checkpoint"),
])
def test_entry_points_exit_2_with_one_line(tmp_path, module, argv, argument):
    """The real command lines (python -m): status 2, one line, no traceback."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(cap.__file__)), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", module, *argv, "--out" if module ==
                          "twell.train" else "--no-progress"] + ([str(tmp_path / "o")]
                         if module == "twell.train" else []), capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1, out.stderr
    assert argument in err[0] and "Traceback" not in out.stderr
