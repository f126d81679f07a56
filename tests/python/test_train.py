"""twell.train on the CPU: the data loaders (text folder, token folder, rows of a dataset, random
and validation windows) and the entry point on a tiny corpus made here (loss falls, every log
field, exact resume, the time budget, the SiLU baseline)."""
import json
import os
import random

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

from torch import nn  # noqa: E402

import twell.torch as tt  # noqa: E402
from twell.train import data as td  # noqa: E402
from twell.train import report  # noqa: E402
from twell.train.cli import main  # noqa: E402
from twell.train.files import InputError  # noqa: E402

WORDS = ("the of a to in is was for on that with as by at from his an be which or are this "
         "had not but have one all were they their its been has more when who would will "
         "water light house river stone horse garden winter music letter window morning "
         "small great old new long little good high black white red green quick slow").split()

LOG_FIELDS = {"kind", "step", "tokens", "lr", "l1_coef", "train_ce", "l1_term", "l1_value",
              "val_ce", "val_ce_sources", "val_density", "val_dead", "val_hot_share",
              "val_ran_dense", "val_tokens", "grad_norm",
              "tokens_per_s", "elapsed_s", "mean_density", "sparsity", "density", "l0", "dead",
              "dead_fraction", "dead_windows", "hot_share", "silent", "sparse_form", "sparse_rows", "reinit"}


def _write_corpus(folder, files=24, sentences=12, seed=7):
    """A few KB of English-like text in `files` files (and a hidden file the loader skips)."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
    for i in range(files):
        text = " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize()
                        + "." for _ in range(sentences))
        name = os.path.join(folder, "sub" if i % 3 == 0 else "", f"doc{i:02d}.txt")
        with open(name, "w") as f:
            f.write(text + "\n")
    with open(os.path.join(folder, ".hidden"), "w") as f:
        f.write("not a document")
    return folder


@pytest.fixture(autouse=True)
def _keep_determinism():
    """--deterministic sets torch.use_deterministic_algorithms for the process: restore it."""
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _write_corpus(str(tmp_path_factory.mktemp("corpus")))


def _records(out, kind="log"):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def _train(out, *extra, data=None):
    argv = ["--model", "tiny", "--data", data, "--device", "cpu", "--batch-size", "4",
            "--seq-len", "32", "--lr", "3e-3", "--l1", "1e-3", "--log-every", "2",
            "--eval-every", "6", "--eval-batches", "2", "--dead-window", "512", "--no-progress",
            "--out", str(out)] + list(extra)
    return main(argv)


# ---- data --------------------------------------------------------------------------------------

def test_text_folder_bytes(corpus):
    data = td.from_text_folder(corpus)
    assert (data.vocab_size, data.eos_id) == (257, 256)
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(corpus) for f in fs
                   if not f.startswith("."))
    total = sum(os.path.getsize(f) for f in files)
    # every byte of every file once, plus one end-of-text id per file
    assert len(data.train) + len(data.val) == total + len(files)
    assert len(data.val) > 0 and len(data.train) > len(data.val)
    ids = np.concatenate([data.train, data.val])
    assert int((ids == 256).sum()) == len(files) and int(ids.max()) == 256
    again = td.from_text_folder(corpus)
    assert np.array_equal(again.train, data.train) and np.array_equal(again.val, data.val)
    docs = bytes(int(i) for i in data.train[:np.argmax(data.train == 256)]).decode()
    assert docs.split()[0].rstrip(".").lower() in WORDS


def test_text_folder_bpe(corpus, tmp_path):
    pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    data = td.from_text_folder(corpus, 300)
    assert data.vocab_size <= 300 and data.eos_id == 0
    assert len(data.train) < 0.8 * sum(len(open(os.path.join(r, f)).read())
                                       for r, _, fs in os.walk(corpus) for f in fs)
    saved = data.save(str(tmp_path / "tok"))
    back = td.load_token_folder(saved)
    assert np.array_equal(back.train, data.train) and np.array_equal(back.val, data.val)
    assert (back.vocab_size, back.eos_id) == (data.vocab_size, data.eos_id)
    # the saved tokenizer reads back and decodes the ids to the text
    enc = td.make_encoder(str(tmp_path / "tok"))
    first = list(back.train[:np.argmax(back.train == 0)])
    text = enc.tok.decode([int(i) for i in first])
    assert text.split()[0].rstrip(".").lower() in WORDS


def test_windows_are_deterministic_and_sharded():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = td.RandomWindows(tokens, 8, 16, seed=3)
    b = td.RandomWindows(tokens, 8, 16, seed=3)
    first = [next(a) for _ in range(3)]
    assert all(np.array_equal(x, next(b)) for x in first)
    assert first[0].shape == (8, 17) and first[0].dtype == np.int64
    assert np.all(np.diff(first[0], axis=1) == 1)  # contiguous windows
    b.load_state_dict(a.state_dict())
    assert np.array_equal(next(a), next(b))
    assert not np.array_equal(td.RandomWindows(tokens, 8, 16, seed=4).batch(0), first[0])
    ranks = [td.RandomWindows(tokens, 64, 16, seed=3, rank=r, world_size=4) for r in range(4)]
    for r, s in enumerate(ranks):
        batch = s.batch(0)
        assert batch.min() >= 2500 * r and batch.max() < 2500 * (r + 1)
    with pytest.raises(ValueError, match="seed/rank/world_size"):
        ranks[1].load_state_dict(ranks[0].state_dict())
    val = td.eval_windows(tokens[:1000], 4, 16)
    targets = np.concatenate([b[:, 1:].reshape(-1) for b in val])
    assert np.array_equal(targets, np.arange(1, 1 + len(targets)))  # each target once
    halves = [td.eval_windows(tokens[:1000], 4, 16, rank=r, world_size=2) for r in range(2)]
    assert sum(len(np.concatenate(h)) for h in halves) == sum(len(b) for b in val)
    with pytest.raises(ValueError, match="shorter than one window"):
        td.RandomWindows(tokens[:10], 2, 16)


def test_hf_dataset_rows():
    rows = [{"text": f"row {i}: " + " ".join(WORDS[i % 40:i % 40 + 8])} for i in range(60)]
    data = td.from_hf_dataset(rows)
    assert data.vocab_size == 257 and len(data.train) + len(data.val) == sum(
        len(r["text"]) + 1 for r in rows)
    with pytest.raises(ValueError, match="no field 'body'"):
        td.from_hf_dataset(rows, text_field="body")
    try:
        import datasets  # noqa: F401  (only whether it is installed)
    except ImportError:
        with pytest.raises(ImportError, match="pip install datasets"):
            td.from_hf_dataset("some/dataset")


def test_load_spec_errors(tmp_path):
    with pytest.raises(ValueError, match="expected 'synthetic'"):
        td.load(str(tmp_path / "missing"))
    assert td.load("synthetic").vocab_size == 128


# ---- the entry point ---------------------------------------------------------------------------

def test_train_loss_falls_and_logs_every_field(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    last = _train(out, "--steps", "24", data=corpus)
    logs = _records(out)
    assert [r["step"] for r in logs] == list(range(2, 25, 2))
    for r in logs:
        assert set(r) == LOG_FIELDS, set(r) ^ LOG_FIELDS
        assert len(r["density"]) == len(r["dead"]) == len(r["sparse_form"]) == 2
        assert all(0 < d <= 1 for d in r["density"]) and r["silent"] == []
        assert r["tokens"] == r["step"] * 4 * 32 and r["tokens_per_s"] > 0
        assert r["l1_value"] == pytest.approx(r["l1_term"] / 1e-3)
        assert r["sparse_form"] == [1.0, 1.0]  # the CPU backend saves the compact form
        assert all(0 <= x <= 1 for x in r["sparse_rows"])
    assert logs[-1]["train_ce"] < logs[0]["train_ce"] - 0.5, [r["train_ce"] for r in logs]
    evaluated = [r for r in logs if r["val_ce"] is not None]
    assert [r["step"] for r in evaluated] == [6, 12, 18, 24]
    assert evaluated[-1]["val_ce"] < evaluated[0]["val_ce"]
    assert all(len(r["val_density"]) == 2 for r in evaluated)
    for r in evaluated:  # validation: 7 windows of 32 tokens, dead units, inference path
        assert r["val_tokens"] == 224 and all(0 <= d <= 256 for d in r["val_dead"])
        assert all(0 <= f <= 1 for f in r["val_ran_dense"])
        _check_hot_share(r["val_hot_share"], 2)
    assert logs[-1]["dead_windows"] >= 1 and all(d is not None for d in logs[-1]["dead"])
    _check_hot_share(logs[-1]["hot_share"], 2)
    assert logs[0]["hot_share"] == [None, None]  # no window closed yet
    config = _records(out, "config")[0]
    assert config["hot_fractions"] == [0.01, 0.02, 0.05, 0.1, 0.2, 0.5]
    assert config["layers"] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert config["vocab_size"] == 257 and config["model"]["intermediate"] == 256
    assert _records(out, "end")[0]["reason"] == "done"
    assert os.path.isfile(out / "checkpoint" / "state.json") and last["step"] == 24
    stdout = capsys.readouterr().out.strip().splitlines()
    assert stdout[-1].startswith("final: loss") and "L0 per layer" in stdout[-1]
    assert "tokens/s" in stdout[-1] and "dead" in stdout[-1] and "inference ran" in stdout[-1]
    table = stdout.index("per layer at step 24 (L0 and density over the validation tokens):")
    for name, line in zip(config["layers"], stdout[table + 2:table + 4]):
        assert line.split()[0] == name and line.split()[1].endswith("/256"), line


@pytest.mark.parametrize("extra", [(), ("--precision", "bf16", "--reinit-dead-every", "2",
                                        "--l1", "3e-2")], ids=["fp32", "bf16-master-reinit"])
def test_resume_continues_exactly(corpus, tmp_path, extra):
    common = ["--steps", "12", "--deterministic", *extra]
    whole = tmp_path / "whole"
    _train(whole, *common, data=corpus)
    split = tmp_path / "split"
    _train(split, *common, "--stop-at", "6", data=corpus)
    assert _records(split, "end")[0]["reason"] == "stop-at"
    assert [r["step"] for r in _records(split)][-1] == 6
    _train(split, *common, "--resume", data=corpus)
    a, b = _records(whole), _records(split)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(2, 13, 2))
    for ra, rb in zip(a, b):
        for key in ("train_ce", "val_ce", "lr", "tokens", "l1_term"):
            if ra[key] is None:
                assert rb[key] is None, key
            else:
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (ra["step"], key)
        assert rb["density"] == pytest.approx(ra["density"], rel=1e-5, abs=1e-7)
        assert rb["dead"] == ra["dead"] and rb["reinit"] == ra["reinit"]
        assert rb["hot_share"] == ra["hot_share"]
    assert [r["step"] for r in _records(split, "resume")] == [6]
    # resuming a finished run does nothing
    _train(split, *common, "--resume", data=corpus)
    assert _records(split, "end")[-1]["reason"] == "already done"
    assert [r["step"] for r in _records(split)] == [r["step"] for r in a]


def _check_hot_share(per_layer, layers):
    """Per layer: one share per fraction, in [f, 1] (the top f of the units carry at least f of
    the hits) and non-decreasing."""
    assert len(per_layer) == layers
    for shares in per_layer:
        assert len(shares) == 6
        assert all(f - 1e-9 <= v <= 1 for f, v in zip((0.01, 0.02, 0.05, 0.1, 0.2, 0.5), shares))
        assert shares == sorted(shares)


def test_time_budget_stops_cleanly_and_resumes(corpus, tmp_path, capsys):
    out = tmp_path / "budget"
    _train(out, "--steps", "8", "--max-minutes", "0.001", data=corpus)
    end = _records(out, "end")[0]
    assert end["reason"] == "time budget" and end["step"] < 8
    assert os.path.isfile(out / "checkpoint" / "tensors.safetensors")
    assert "--resume continues" in capsys.readouterr().out
    _train(out, "--steps", "8", "--resume", data=corpus)
    assert _records(out, "end")[-1]["reason"] == "done"
    assert _records(out)[-1]["step"] == 8


def test_silu_baseline(tmp_path, capsys):
    out = tmp_path / "silu"
    _train(out, "--steps", "4", "--activation", "silu", data="synthetic")
    logs = _records(out)
    assert set(logs[-1]) == LOG_FIELDS
    assert logs[-1]["density"] == [] and logs[-1]["mean_density"] is None
    assert logs[-1]["l1_term"] is None and _records(out, "config")[0]["layers"] == []
    assert "dense MLPs" in capsys.readouterr().out.strip().splitlines()[-1]


def test_silent_layer_is_reported(tmp_path, capsys):
    """A layer whose units never fire (gate weights pushed far negative) is flagged."""
    import twell.torch as tt
    from twell.train import loop

    args = __import__("twell.train.cli", fromlist=["parser"]).parser().parse_args(
        ["--model", "tiny", "--data", "synthetic", "--device", "cpu", "--batch-size", "2",
         "--seq-len", "16", "--steps", "2", "--log-every", "1", "--eval-every", "0",
         "--no-progress", "--out", str(tmp_path / "silent")])
    trainer = loop.Trainer(args)
    name, mlp = tt.sparse_modules(trainer.model)[0]
    with torch.no_grad():
        mlp.gate_proj.weight.zero_()
    trainer.train_step()
    record = trainer.log()
    assert record["silent"] == [name] and record["density"][0] == 0.0
    val = trainer.evaluate()
    assert val[1]["density"][0] == 0.0 and val[1]["dead"][0] == 256
    assert val[1]["tokens"] == sum(b[:, 1:].size for b in trainer.val)
    record = trainer.log(val)
    warnings = report.layer_warnings(trainer.monitor.names, 256, record)
    assert len(warnings) == 1 and warnings[0].startswith(f"WARNING: {name} is silent")
    trainer.monitor.remove()


def test_nearly_all_dead_is_reported():
    names = ["a", "b"]
    record = {"step": 5, "density": [0.01, 0.2], "val_density": [0.01, 0.2],
              "val_dead": [240, 3], "val_tokens": 4096, "dead": [None, 250],
              "sparse_rows": [1.0, 0.5], "val_ran_dense": [0.0, 1.0]}
    warnings = report.layer_warnings(names, 256, record, dead_window=16384)
    assert warnings == [
        "WARNING: a: nearly all units dead: 240 of 256 units never active over the 4,096 "
        "validation tokens",
        "WARNING: b: nearly all units dead: 250 of 256 never active over 16,384 training tokens"]
    lines = report.layer_table(names, 256, record)
    assert lines[2].split() == ["a", "2.6/256", "1.00%", "240", "(93.8%)", "-", "100%", "-",
                                "sparse"]
    assert lines[3].split()[-1] == "dense"
    from twell.torch.tracker import HOT_FRACTIONS
    assert HOT_FRACTIONS[report.TOP10] == 0.1
    record["val_hot_share"] = [[0.05, 0.1, 0.3, 0.62, 0.8, 0.99], None]
    lines = report.layer_table(names, 256, record)
    assert lines[2].split()[-2] == "62%" and lines[3].split()[-2] == "-"
    record.update(density=[0.0, 0.2], val_density=None, val_dead=None)  # no validation yet
    warnings = report.layer_warnings(names, 256, record)
    assert warnings[0].startswith("WARNING: a is silent: no unit was active for any training")
    assert report.layer_table(names, 256, record)[2].split()[1:3] == ["0.0/256", "0.00%"]


def test_monitor_reads_the_saved_form_and_routed_rows():
    """sparse_rows: 1 where every row fits the tile capacity (16 of 256), 0 where every row
    overflows it (about half the units active); density is the modules' L0 / N."""
    import twell.torch as tt
    from twell.train.sparsity import LayerMonitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(tt.SparseGatedMLP(64, 256))
    mlp = model[0]
    monitor = LayerMonitor(model, window=0)
    x = torch.randn(48, 64).abs()
    with torch.no_grad():
        mlp.gate_proj.weight[8:] = -mlp.gate_proj.weight[8:].abs()  # at most 8 units fire
    model(x).sum().backward()
    active = (x @ mlp.gate_proj.weight.detach().t() > 0).sum(1).float()
    figures = monitor.collect()
    assert figures["sparse_form"] == [1.0] and figures["sparse_rows"] == [1.0]
    assert figures["density"][0] == pytest.approx(float(active.mean()) / 256, rel=1e-5)
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(torch.randn(256, 64))
    model(torch.randn(48, 64)).sum().backward()
    figures = monitor.collect()
    assert figures["sparse_form"] == [1.0] and figures["sparse_rows"] == [0.0]
    with torch.no_grad():  # inference forwards do not count
        model(x)
    assert monitor.collect()["sparse_form"] == [None]
    monitor.remove()


def test_no_reinit_in_the_last_steps(tmp_path):
    """Dead units are re-initialised at most every --reinit-dead-every steps, and never within
    that many steps of --steps: the final model keeps no unit that had no time to settle."""
    import twell.torch as tt
    from twell.train import loop

    args = __import__("twell.train.cli", fromlist=["parser"]).parser().parse_args(
        ["--model", "tiny", "--data", "synthetic", "--device", "cpu", "--batch-size", "2",
         "--seq-len", "16", "--steps", "7", "--log-every", "1", "--eval-every", "0",
         "--dead-window", "30", "--reinit-dead-every", "2", "--no-progress",
         "--out", str(tmp_path / "reinit")])
    trainer = loop.Trainer(args)
    mlps = [m for _, m in tt.sparse_modules(trainer.model)]
    reinit_at = []
    for _ in range(args.steps):
        with torch.no_grad():  # every unit dead in every window
            for mlp in mlps:
                mlp.gate_proj.weight.zero_()
        trainer.train_step()
        record = trainer.log()
        if record["reinit"]:
            assert all(c == 256 for c in record["reinit"].values()), record["reinit"]
            reinit_at.append(trainer.step)
    assert reinit_at == [2, 4]  # steps 6 and 7: fewer than 2 steps before the end


def test_relu_torch_baseline_runs_no_twell(tmp_path):
    """--activation relu-torch: transformers' own MLPs with ReLU, no twell module, no L1 term."""
    import torch
    from twell.train import cli, loop
    args = cli.parser().parse_args(["--model", "tiny", "--data", "synthetic", "--device", "cpu",
                                    "--steps", "1", "--activation", "relu-torch", "--no-progress",
                                    "--out", str(tmp_path / "r")])
    trainer = loop.Trainer(args)
    assert not trainer.sparse
    acts = [m.act_fn for n, m in trainer.model.named_modules() if n.endswith(".mlp")]
    assert acts and all(isinstance(a, torch.nn.ReLU) for a in acts)
    trainer.monitor.remove()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_hot_units_train_the_same_model_and_resume(corpus, tmp_path, precision):
    """--hot-units: the hot units re-chosen at each closed window run dense; the losses are the
    unsplit run's (rounding only), the weights a permutation of its weights, and a resumed run
    continues the split exactly."""
    common = ["--steps", "12", "--deterministic", "--precision", precision]
    plain, hot, split = tmp_path / "plain", tmp_path / "hot", tmp_path / "split"
    _train(plain, *common, data=corpus)
    _train(hot, *common, "--hot-units", "40", data=corpus)
    a, b = _records(plain), _records(hot)
    for ra, rb in zip(a, b):
        assert rb["train_ce"] == pytest.approx(ra["train_ce"], rel=2e-3), ra["step"]
        assert rb["density"] == pytest.approx(ra["density"], rel=2e-2, abs=1e-3), ra["step"]
    _train(split, *common, "--hot-units", "40", "--stop-at", "6", data=corpus)
    _train(split, *common, "--hot-units", "40", "--resume", data=corpus)
    for rh, rs in zip(b, _records(split)):
        assert rs["train_ce"] == pytest.approx(rh["train_ce"], rel=1e-5, abs=1e-7), rh["step"]
    from twell.train.state_files import read
    state = read(str(hot / "checkpoint"), "checkpoint")
    assert state["monitor"]["hot_units"] == [40, 40]
    order = state["monitor"]["unit_order"]["model.layers.0.mlp"]
    assert sorted(order.tolist()) == list(range(256)) and order.tolist() != list(range(256))
    from twell.train.sparsity import LayerMonitor
    model = nn.Sequential(tt.SparseGatedMLP(8, 256), tt.SparseGatedMLP(8, 256))
    monitor = LayerMonitor(model, 512)
    monitor.load_state_dict({**state["monitor"], "tracker": None, "unit_order": {
        "0": order, "1": None}, "hot_units": [40, 0]})
    assert (model[0].hot_units, model[1].hot_units) == (40, 0)
    assert torch.equal(model[0].unit_order, order)
    for bad in ({"hot_units": [256, 0]}, {"hot_units": [1]}, {"hot_units": [12, 0]},
                {"unit_order": {"0": torch.zeros(256, dtype=torch.int64), "1": None}}):
        with pytest.raises(InputError, match="monitor"):
            monitor.load_state_dict({**state["monitor"], "tracker": None, "unit_order": {},
                                     **bad})


def test_hot_units_refused_where_they_cannot_run(corpus, tmp_path):
    for extra in (["--hot-units", "-1"], ["--hot-units", "8", "--no-dead-tracking"],
                  ["--hot-units", "8", "--activation", "silu"], ["--hot-units", "256"],
                  ["--hot-units", "12"]):
        with pytest.raises(SystemExit) as e:
            _train(tmp_path / "x", "--steps", "2", *extra, data=corpus)
        assert e.value.code != 0, extra
