"""Files handed to twell.train and twell.capture: checkpoints are safetensors + JSON, and a pickle
(a malicious one included) is refused without being unpickled; every checkpoint part, token
folder, tokenizer, text file and capture file is checked before use (regular files only, so a
FIFO never blocks; sizes bounded; contents validated), with an error naming the file."""
import json
import os
import pickle
import shutil

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
safetensors_torch = pytest.importorskip("safetensors.torch",
                                        reason="safetensors is not installed")

from twell import capture as cap  # noqa: E402
from twell.train import data as td  # noqa: E402
from twell.train.cli import main as train_main  # noqa: E402

fifo_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")

TRAIN = ["--model", "tiny", "--data", "synthetic", "--device", "cpu", "--batch-size", "2",
         "--seq-len", "16", "--eval-batches", "1", "--no-progress", "--steps", "4"]


class Marker:
    """Unpickling this creates the file `path`: what a malicious pickle could do, harmlessly."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _payload(tmp_path):
    """(a marker path, an object whose unpickling creates it); checks the payload works."""
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Marker(probe)))
    assert probe.exists()  # unpickling does run it
    return tmp_path / "marker", Marker(tmp_path / "marker")


def _fails(main, argv, capsys):
    """(exit status, the stderr lines) of a command that must fail cleanly."""
    capsys.readouterr()  # what came before
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A twell.train run folder stopped at step 2 of 4 (a checkpoint to resume)."""
    out = tmp_path_factory.mktemp("untrusted") / "run"
    train_main([*TRAIN, "--stop-at", "2", "--out", str(out)])
    return out


# ---- pickles ------------------------------------------------------------------------------------

def test_resume_refuses_a_pickle_checkpoint_without_unpickling(tmp_path, capsys):
    marker, payload = _payload(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"format": "twell.train-1", "step": 1, "payload": payload}, out / "checkpoint.pt")
    rc, err = _fails(train_main, [*TRAIN, "--resume", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("twell.train: --resume: ") and "pickle" in err[0], err
    assert not marker.exists()
    assert not (out / "log.jsonl").exists()  # nothing started over the old run


@pytest.mark.parametrize("where", ["file", "run folder"])
def test_capture_refuses_a_pickle_without_unpickling(tmp_path, capsys, where):
    marker, payload = _payload(tmp_path)
    folder = tmp_path / "old"
    folder.mkdir()
    torch.save({"format": "twell.train-1", "payload": payload}, folder / "checkpoint.pt")
    target = folder / "checkpoint.pt" if where == "file" else folder
    rc, err = _fails(cap.main, [str(target), "--out", str(tmp_path / "cap")], capsys)
    assert rc == 2 and len(err) == 1 and "pickle" in err[0], err
    with pytest.raises(ValueError, match="twell no longer loads"):
        cap.load_model(target)
    assert not marker.exists()


def _hf_folder(folder, vocab=300):
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        hidden_act="relu", tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_capture_reads_no_pickled_hugging_face_weights(tmp_path, capsys):
    marker, payload = _payload(tmp_path)
    folder = _hf_folder(tmp_path / "hf")
    os.remove(folder / "model.safetensors")
    torch.save({"payload": payload}, folder / "pytorch_model.bin")
    rc, err = _fails(cap.main, [str(folder), "--out", str(tmp_path / "cap"), "--text",
                                str(folder / "config.json"), "--tokenizer", "bytes", "--device",
                                "cpu"], capsys)
    assert rc == 2 and len(err) == 1 and "safetensors" in err[0], err
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated weights", "negative hidden size"])
def test_capture_refuses_a_broken_hugging_face_folder(tmp_path, capsys, damage):
    folder = _hf_folder(tmp_path / "hf")
    if damage == "truncated weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[:100])
    else:
        config = json.loads((folder / "config.json").read_text())
        config["hidden_size"] = -5
        (folder / "config.json").write_text(json.dumps(config))
    rc, err = _fails(cap.main, [str(folder), "--out", str(tmp_path / "cap"), "--text",
                                str(folder / "config.json"), "--tokenizer", "bytes", "--device",
                                "cpu"], capsys)
    assert rc == 2 and len(err) == 1 and "Hugging Face" in err[0], err


def test_read_layer_refuses_pickled_arrays_and_bad_manifests(tmp_path):
    marker, payload = _payload(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"dtype": "float32", "layers": 1}))
    np.save(tmp_path / "layer0.x.npy", np.array([payload, 1], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"layer0\.x\.npy: expected a \.npy array"):
        cap.read_layer(tmp_path, 0, "x")
    assert not marker.exists()
    np.save(tmp_path / "layer0.x.npy", np.zeros((2, 3), np.float16))
    with pytest.raises(ValueError, match=r"expected a 2-D <f4 array"):
        cap.read_layer(tmp_path, 0, "x")
    with pytest.raises(ValueError, match="an index below the manifest's 1 layers"):
        cap.read_layer(tmp_path, 1, "x")
    os.remove(tmp_path / "manifest.json")
    os.mkdir(tmp_path / "manifest.json")
    with pytest.raises(ValueError, match="manifest.json: expected a regular file, got a dir"):
        cap.read_layer(tmp_path, 0, "x")


# ---- the checkpoint format ----------------------------------------------------------------------

def test_state_files_round_trip_and_interrupted_writes(tmp_path):
    from twell.train import state_files

    state = {"a": [1, 2.5, None, True, "s"], "t": torch.arange(6, dtype=torch.int64),
             "nested": {"bf16": torch.ones(2, 3, dtype=torch.bfloat16), "scalar": torch.tensor(3.0),
                        "bytes": torch.zeros(7, dtype=torch.uint8), "tuple": (1, 2)}}
    folder = str(tmp_path / "ck")
    state_files.write(folder, state)
    assert sorted(os.listdir(folder)) == ["state.json", "tensors.safetensors"]
    back = state_files.read(folder, "ck")
    assert back["a"] == state["a"] and back["nested"]["tuple"] == [1, 2]
    for key in ("bf16", "scalar", "bytes"):
        assert torch.equal(back["nested"][key], state["nested"][key])
    assert torch.equal(back["t"], state["t"])
    assert state_files.read(folder, "ck", keys=("a",)) == {"a": state["a"]}
    # A writer stopped between its two renames leaves FOLDER.old: read, then replaced.
    os.replace(folder, folder + ".old")
    assert state_files.locate(folder) == folder + ".old"
    state_files.write(folder, {"x": 1})
    assert state_files.locate(folder) == folder and not os.path.exists(folder + ".old")
    with pytest.raises(ValueError, match="finite"):
        state_files.write(folder, {"x": float("nan")})
    assert state_files.read(folder, "ck") == {"x": 1}  # a failed write leaves the last one


def _copy_run(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _edit_tensors(out, edit):
    path = str(out / "checkpoint" / "tensors.safetensors")
    tensors = safetensors_torch.load_file(path)
    edit(tensors)
    safetensors_torch.save_file(tensors, path)


def _edit_state(out, edit):
    path = out / "checkpoint" / "state.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _truncate(out):
    path = out / "checkpoint" / "tensors.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _replace_json(out, text):
    (out / "checkpoint" / "state.json").write_text(text)


def _fifo(out):
    os.remove(out / "checkpoint" / "state.json")
    os.mkfifo(out / "checkpoint" / "state.json")


def _huge(out):
    with open(out / "checkpoint" / "state.json", "r+b") as f:
        f.truncate(65 << 20)  # sparse: refused by its size before it is read


def _reshape(t):
    t["model/model.norm.weight"] = t["model/model.norm.weight"][:-1].clone()


CORRUPTIONS = {
    "truncated tensors": (_truncate, "a readable safetensors file"),
    "garbage tensors": (lambda o: (o / "checkpoint" / "tensors.safetensors").write_bytes(
        b"\x10" * 64), "a readable safetensors file"),
    "state not JSON": (lambda o: _replace_json(o, "{not json"), "invalid JSON"),
    "state NaN": (lambda o: _replace_json(o, '{"step": NaN}'), "invalid JSON"),
    "state a list": (lambda o: _replace_json(o, "[]"), "a JSON object"),
    "state a FIFO": (_fifo, "got a FIFO"),
    "state a directory": (lambda o: (os.remove(o / "checkpoint" / "state.json"),
                                     os.mkdir(o / "checkpoint" / "state.json")), "a directory"),
    "state too large": (_huge, "a file of at most"),
    "other format": (lambda o: _edit_state(o, lambda d: d.update(format="x")), "format"),
    "negative step": (lambda o: _edit_state(o, lambda d: d.update(step=-1)), "step"),
    "wrong shape": (lambda o: _edit_tensors(o, _reshape), "model.norm.weight"),
    "missing tensor": (lambda o: _edit_tensors(o, lambda t: t.pop("model/lm_head.weight")),
                       "a tensor 'model/lm_head.weight'"),
    "bad reference": (lambda o: _edit_state(o, lambda d: d["rng"].update(
        torch={"__tensor__": 5})), "tensor references"),
    "lr a string": (lambda o: _edit_state(o, lambda d: d["optimizer"]["param_groups"][0].update(
        lr="0.1")), "param_groups[0].lr"),
    "scheduler injection": (lambda o: _edit_state(o, lambda d: d["scheduler"].update(
        optimizer=None)), "scheduler"),
    "python rng": (lambda o: _edit_state(o, lambda d: d["rng"]["python"][1].pop()),
                   "rng.python/numpy"),
    "monitor": (lambda o: _edit_state(o, lambda d: d["monitor"]["dead"].append(3)),
                "monitor.dead"),
    "sampler": (lambda o: _edit_state(o, lambda d: d["sampler"].update(position=-4)),
                "sampler.position"),
    "changed shape argument": (lambda o: _edit_state(o, lambda d: d["args"].update(
        seq_len=32)), "--seq-len 16"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_resume_refuses_a_corrupted_checkpoint(run, tmp_path, capsys, name):
    corrupt, says = CORRUPTIONS[name]
    if "FIFO" in name and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    out = _copy_run(run, tmp_path)
    corrupt(out)
    rc, err = _fails(train_main, [*TRAIN, "--resume", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("twell.train: --resume") and says in err[0], err


def test_resume_after_an_interrupted_save(run, tmp_path):
    out = _copy_run(run, tmp_path)
    os.replace(out / "checkpoint", out / "checkpoint.old")
    record = train_main([*TRAIN, "--resume", "--out", str(out)])
    assert record["step"] == 4
    assert sorted(os.listdir(out / "checkpoint")) == ["state.json", "tensors.safetensors"]
    assert not os.path.exists(out / "checkpoint.old")


def test_capture_refuses_a_corrupted_checkpoint(run, tmp_path, capsys):
    out = _copy_run(run, tmp_path)
    _edit_state(out, lambda d: d["args"].update(seq_len=-3))
    rc, err = _fails(cap.main, [str(out), "--out", str(tmp_path / "cap")], capsys)
    assert rc == 2 and len(err) == 1 and "its arguments: --seq-len: expected" in err[0], err
    out = _copy_run(run, tmp_path / "b")
    _edit_tensors(out, _reshape)
    rc, err = _fails(cap.main, [str(out / "checkpoint"), "--out", str(tmp_path / "cap")], capsys)
    assert rc == 2 and len(err) == 1 and "model.norm.weight" in err[0], err


# ---- data files ---------------------------------------------------------------------------------

def _token_folder(folder, vocab=50):
    data = td.TokenData(np.arange(500) % vocab, np.arange(200) % vocab, vocab)
    return data.save(str(folder))


def _meta(folder, **changes):
    path = os.path.join(folder, "meta.json")
    with open(path) as f:
        meta = json.load(f)
    meta.update(changes)
    with open(path, "w") as f:
        json.dump(meta, f)


TOKEN_FOLDERS = {
    "meta not JSON": (lambda f: open(os.path.join(f, "meta.json"), "w").write("{"),
                      "meta.json: expected JSON"),
    "meta a FIFO": (lambda f: (os.remove(os.path.join(f, "meta.json")),
                               os.mkfifo(os.path.join(f, "meta.json"))), "got a FIFO"),
    "vocab a string": (lambda f: _meta(f, vocab_size="50"), "vocab_size: expected an integer"),
    "eos beyond": (lambda f: _meta(f, eos_id=50), "eos_id: expected null or an integer below"),
    "ids beyond": (lambda f: _meta(f, vocab_size=10), "token ids below the vocabulary size 10"),
    "counts differ": (lambda f: _meta(f, tokens={"train": 7, "val": 200}), "7 token ids"),
    "odd bytes": (lambda f: open(os.path.join(f, "train.bin"), "ab").write(b"\x01"),
                  "at least one whole uint16"),
    "empty": (lambda f: open(os.path.join(f, "val.bin"), "wb").close(), "got 0 bytes"),
    "val missing": (lambda f: os.remove(os.path.join(f, "val.bin")), "no such file"),
    "train a FIFO": (lambda f: (os.remove(os.path.join(f, "train.bin")),
                                os.mkfifo(os.path.join(f, "train.bin"))), "got a FIFO"),
}


@pytest.mark.parametrize("name", list(TOKEN_FOLDERS))
def test_token_folder_is_checked(tmp_path, name):
    corrupt, says = TOKEN_FOLDERS[name]
    if "FIFO" in name and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    folder = _token_folder(tmp_path / "tok")
    assert td.load_token_folder(folder).vocab_size == 50
    corrupt(folder)
    with pytest.raises(ValueError, match=says):
        td.load(folder)


@fifo_only
def test_text_and_tokenizer_files_are_checked(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text " * 50)
    os.mkfifo(corpus / "b.txt")
    with pytest.raises(ValueError, match="b.txt: expected a regular file, got a FIFO"):
        td.from_text_folder(str(corpus))
    os.remove(corpus / "b.txt")
    os.symlink("/dev/zero", corpus / "zero.txt")
    with pytest.raises(ValueError, match="zero.txt: expected a regular file, got a character"):
        td.from_text_folder(str(corpus))
    os.mkfifo(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json: expected a regular file, got a FIFO"):
        td.make_encoder(str(tmp_path))
    (tmp_path / "bad.json").write_text('{"version": "1.0", "model": 5}')
    with pytest.raises(ValueError, match="bad.json: expected a tokenizer.json of the tokenizers"):
        td.make_encoder(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="a BPE vocabulary size from 257"):
        td.make_encoder(10)


def _tiny(tmp_path, *extra):
    return ["--device", "cpu", "--data", "synthetic", "--model", "tiny", "--no-progress",
            "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
            "--out", str(tmp_path / "run"), *extra]


def _train(args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "twell.train"] + args, capture_output=True,
                          text=True, timeout=600)


def test_a_diverging_run_exits_non_zero_naming_the_cause(tmp_path):
    """Finite but absurd settings that make the loss NaN end the run with exit 1 and one line,
    keep the log valid JSON (no bare NaN) and write no checkpoint of the NaN model."""
    r = _train(_tiny(tmp_path, "--steps", "6", "--log-every", "1", "--l1", "1e300", "--lr", "5"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("twell.train: training diverged")
    log = (tmp_path / "run" / "log.jsonl").read_text()
    for line in log.splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in the log"))
    assert json.loads(log.splitlines()[-1])["reason"] == "diverged"
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_deeply_nested_log_lines_are_skipped(tmp_path):
    assert _train(_tiny(tmp_path, "--steps", "2")).returncode == 0
    with open(tmp_path / "run" / "log.jsonl", "a") as f:
        f.write("[" * 200000 + "]" * 200000 + "\n")
    r = _train(_tiny(tmp_path, "--steps", "3", "--resume"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    from twell import capture
    assert capture._last_l1_coef(str(tmp_path / "run" / "log.jsonl")) is not None


def test_a_log_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / "run" / "log.jsonl").mkdir(parents=True)
    r = _train(_tiny(tmp_path, "--steps", "1"))
    assert r.returncode == 2 and "log.jsonl" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_eval_batch_size_errors_name_it(tmp_path):
    r = _train(_tiny(tmp_path, "--steps", "1", "--eval-batch-size", "100000000"))
    assert r.returncode == 2 and "--eval-batch-size" in r.stderr, r.stderr


@pytest.mark.parametrize("flag, value", [("--lr", "1e38"), ("--lr", "11"),
                                         ("--weight-decay", "1e300")])
def test_absurd_optimiser_settings_are_refused(tmp_path, flag, value):
    r = _train(_tiny(tmp_path, "--steps", "1", flag, value))
    assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr


def test_meta_json_cannot_raise_the_decompression_bound(tmp_path, monkeypatch):
    """A token count in meta.json lowers the bound on an xz file's decompressed size, never
    raises it past data.XZ_LIMIT."""
    import lzma
    from twell.train import data
    folder = tmp_path / "bomb"
    folder.mkdir()
    monkeypatch.setattr(data, "XZ_LIMIT", 1 << 16)
    big = 1 << 17  # ids, 2 * 2^17 bytes of zeros > the (patched) bound
    with lzma.open(folder / "train.bin.xz", "wb") as f:
        f.write(b"\0" * 2 * big)
    with lzma.open(folder / "val.bin.xz", "wb") as f:
        f.write(b"\0" * 64)
    (folder / "meta.json").write_text(json.dumps({
        "format": "twell-tokens-1", "dtype": "uint16", "byteorder": "little", "vocab_size": 8,
        "eos_id": 0, "tokens": {"train": big, "val": 32}}))
    with pytest.raises(ValueError, match="once decompressed"):
        data.load(str(folder))


@pytest.mark.parametrize("depth", [900, 5000, 200000])
def test_a_deeply_nested_state_json_is_named(tmp_path, depth):
    """state.json nested deeper than any state is refused naming state.json (a nesting that
    json.loads took but rebuilding the state did not blamed tensors.safetensors)."""
    from twell.train import state_files
    from twell.train.files import InputError
    folder = tmp_path / "ck"
    state_files.write(str(folder), {"t": torch.zeros(2), "x": 1})
    (folder / "state.json").write_text(
        '{"t": {"__tensor__": "t"}, "deep": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(InputError) as e:
        state_files.read(str(folder), "ck")
    assert e.value.what == "ck/state.json", str(e.value)
    assert "deep" in str(e.value) and "Traceback" not in str(e.value), str(e.value)
