"""twell.capture on the CPU: a tiny model (2 layers, hidden 64, intermediate 128) from a
twell.train checkpoint and from a Hugging Face folder; the files' shapes, dtypes and manifest;
x against the MLP inputs recorded without hooks; bfloat16 as '<u2' bits; bad inputs."""
import json
import os
import random

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import twell.torch as tt  # noqa: E402
from twell import capture as cap  # noqa: E402
from twell.train.cli import main as train_main  # noqa: E402

K, N = 64, 128
WORDS = "the of a to in is was for on that with water light house river stone".split()


def _text(rng, sentences):
    return " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize()
                    + "." for _ in range(sentences))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A twell.train run folder: tiny model, intermediate 128, bytes, 3 steps on a text folder."""
    root = tmp_path_factory.mktemp("capture")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(3)
    for i in range(12):
        (corpus / f"doc{i:02d}.txt").write_text(_text(rng, 40) + "\n")
    out = root / "run"
    train_main(["--model", "tiny", "--intermediate", str(N), "--data", str(corpus), "--device",
                "cpu", "--batch-size", "2", "--seq-len", "32", "--steps", "3", "--l1", "1e-3",
                "--eval-batches", "1", "--dead-window", "256", "--no-progress", "--out",
                str(out)])
    text = root / "text.txt"
    text.write_text(_text(rng, 60) + "\n")
    return {"dir": out, "text": text}


class Recorder(torch.nn.Module):
    """Stands in for an MLP (no hook): keeps a copy of every input, then runs the MLP."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def forward(self, x):
        self.seen.append(x.detach().reshape(-1, x.shape[-1]).clone())
        return self.inner(x)


def _recompute(model, batches, tokens):
    """Each layer's MLP inputs over `batches`, first `tokens` rows, recorded by module swap."""
    layers = model.model.layers
    recs = [Recorder(layer.mlp) for layer in layers]
    for layer, rec in zip(layers, recs):
        layer.mlp = rec
    try:
        with torch.no_grad():
            for b in batches:
                model(input_ids=torch.as_tensor(b)[:, :-1], use_cache=False)
    finally:
        for layer, rec in zip(layers, recs):
            layer.mlp = rec.inner
    return [torch.cat(r.seen)[:tokens] for r in recs]


def _header(path):
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}[version]
        return read(f)  # (shape, fortran_order, dtype)


def _manifest(out):
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("mlp", ["dense", "twell"])
def test_capture_twell_train_checkpoint(run, tmp_path, mlp):
    out = tmp_path / "cap"
    tokens = 150
    rc = cap.main([str(run["dir"]), "--out", str(out), "--tokens", str(tokens), "--device",
                   "cpu", "--batch-size", "2", "--mlp", mlp, "--no-progress"])
    assert rc == 0
    m = _manifest(out)
    assert m["format"] == "twell-capture-1"
    assert (m["layers"], m["kind"], m["hidden"], m["intermediate"]) == (2, "gated", K, N)
    assert (m["dtype"], m["tokens"], m["seq_len"], m["mlp"]) == ("float32", tokens, 32, mlp)
    assert m["checkpoint"] == str(run["dir"] / "checkpoint")
    assert m["l1_coef"] == pytest.approx(1e-3) and m["activation"] == "relu" and m["step"] == 3
    assert m["source_text"].endswith("corpus (validation split)")
    assert m["modules"] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert m["train_log"] == str(run["dir"] / "log.jsonl")
    names = sorted(os.listdir(out))
    assert names == sorted(["manifest.json"] + [f"layer{i}.{n}.npy" for i in range(2)
                                                for n in ("x", "gate", "up", "down")])
    for i in range(2):
        for name, shape in (("x", (tokens, K)), ("gate", (N, K)), ("up", (N, K)),
                            ("down", (N, K))):
            assert _header(out / f"layer{i}.{name}.npy") == (shape, False, np.dtype("<f4"))

    # x is what each MLP received: recorded again, without hooks, on the same windows.
    model, info = cap.load_model(run["dir"], "cpu", mlp="dense")
    ids, _ = cap.validation_ids(info)
    batches, available = cap.windows(ids, 32, 2, tokens)
    assert available == tokens
    want = _recompute(model, batches, tokens)
    mlps = cap.find_mlps(model)
    for i, (_, mod, _) in enumerate(mlps):
        x = np.load(out / f"layer{i}.x.npy")
        if mlp == "dense":
            np.testing.assert_array_equal(x, want[i].numpy())
        else:  # layer 1's input went through twell's layer 0: rounding only
            np.testing.assert_allclose(x, want[i].numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.load(out / f"layer{i}.gate.npy"),
                                      mod.gate_proj.weight.detach().numpy())
        # The densest token's active units, from the captured x and gate (a gate value within
        # fp32 rounding of 0 may count on one side only).
        active = int(((x @ np.load(out / f"layer{i}.gate.npy").T) > 0).sum(axis=1).max())
        assert abs(m["max_row_active"][i] - active) <= 1, (m["max_row_active"], i, active)
        np.testing.assert_array_equal(np.load(out / f"layer{i}.up.npy"),
                                      mod.up_proj.weight.detach().numpy())
        np.testing.assert_array_equal(np.load(out / f"layer{i}.down.npy"),
                                      mod.down_proj.weight.detach().t().numpy())


def test_bfloat16_as_u2_bits(run, tmp_path):
    out = tmp_path / "bf16"
    assert cap.main([str(run["dir"]), "--out", str(out), "--tokens", "64", "--device", "cpu",
                     "--dtype", "bfloat16", "--mlp", "dense", "--text", str(run["text"]),
                     "--no-progress"]) == 0
    m = _manifest(out)
    assert m["dtype"] == "bfloat16" and m["source_text"] == str(run["text"])
    for name, rows in (("x", 64), ("gate", N), ("up", N), ("down", N)):
        assert _header(out / f"layer0.{name}.npy") == ((rows, K), False, np.dtype("<u2"))
    model, info = cap.load_model(run["dir"], "cpu", mlp="dense")
    ids, _ = cap.validation_ids(info, text=str(run["text"]))
    batches, _ = cap.windows(ids, 32, 8, 64)
    want = _recompute(model, batches, 64)
    mod = cap.find_mlps(model)[1][1]
    got = cap.read_layer(out, 1, "x")
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), want[1].to(torch.bfloat16).view(torch.int16))
    bits = np.load(out / "layer1.down.npy")
    ref = mod.down_proj.weight.detach().t().contiguous().to(torch.bfloat16)
    np.testing.assert_array_equal(bits, ref.view(torch.int16).numpy().view(np.uint16))


def _hf_model(vocab=300, dtype=torch.float32):
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=K, intermediate_size=N, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        hidden_act="relu", tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype)


def test_hugging_face_folder_and_text(run, tmp_path):
    folder = tmp_path / "hf"
    _hf_model().save_pretrained(folder)
    out = tmp_path / "cap"
    assert cap.main([str(folder), "--out", str(out), "--text", str(run["text"]), "--tokenizer",
                     "bytes", "--tokens", "100", "--seq-len", "16", "--dtype", "float16",
                     "--device", "cpu", "--no-progress"]) == 0
    m = _manifest(out)
    assert (m["layers"], m["kind"], m["dtype"], m["tokens"], m["seq_len"]) == (
        2, "gated", "float16", 100, 16)
    assert m["l1_coef"] is None and m["checkpoint"] == str(folder)
    assert _header(out / "layer1.x.npy") == ((100, K), False, np.dtype("<f2"))
    assert _header(out / "layer1.down.npy") == ((N, K), False, np.dtype("<f2"))


def test_model_dtype_is_the_default(tmp_path):
    model = _hf_model(dtype=torch.bfloat16)
    batches = [np.arange(2 * 17).reshape(2, 17) % 300]
    doc = cap.capture(model, batches, str(tmp_path), 20, progress=False)
    assert doc["dtype"] == "bfloat16"
    assert _header(tmp_path / "layer0.x.npy") == ((20, K), False, np.dtype("<u2"))


class _PlainToy(torch.nn.Module):
    """Embedding and two residual plain twell FFNs; takes the model keyword arguments."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, K)
        self.layers = torch.nn.ModuleList(tt.SparseMLP(K, N) for _ in range(2))

    def forward(self, input_ids, **_):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer(h)
        return h


def test_plain_ffn_has_no_gate_file(tmp_path):
    torch.manual_seed(1)
    model = _PlainToy().eval()
    batches = [np.arange(3 * 9).reshape(3, 9) % 50]
    doc = cap.capture(model, batches, str(tmp_path), 24, progress=False)
    assert doc["kind"] == "plain" and doc["layers"] == 2 and doc["dtype"] == "float32"
    assert not os.path.exists(tmp_path / "layer0.gate.npy")
    with torch.no_grad():
        h = model.embed(torch.as_tensor(batches[0])[:, :-1])
        want0 = h.reshape(-1, K)[:24]
        want1 = (h + model.layers[0](h)).reshape(-1, K)[:24]
    np.testing.assert_array_equal(np.load(tmp_path / "layer0.x.npy"), want0.numpy())
    np.testing.assert_array_equal(np.load(tmp_path / "layer1.x.npy"), want1.numpy())
    np.testing.assert_array_equal(np.load(tmp_path / "layer1.down.npy"),
                                  model.layers[1].down_proj.weight.detach().t().numpy())


def test_stale_files_go_and_the_manifest_comes_last(tmp_path):
    (tmp_path / "layer7.x.npy").write_bytes(b"old")
    (tmp_path / "manifest.json").write_text("{}")
    model = _hf_model()
    cap.capture(model, [np.arange(2 * 17).reshape(2, 17)], str(tmp_path), 10, progress=False)
    assert not os.path.exists(tmp_path / "layer7.x.npy") and _manifest(tmp_path)["layers"] == 2


def test_manifest_is_strict_json(tmp_path):
    """A non-finite manifest value (an l1_coef of a diverged run) is written as null: the file
    parses as strict JSON."""
    model = _hf_model()
    cap.capture(model, [np.arange(2 * 17).reshape(2, 17)], str(tmp_path), 10, progress=False,
                manifest={"l1_coef": float("nan"), "note": [float("inf"), 1.5]})
    text = (tmp_path / "manifest.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"manifest holds {c}"))
    assert doc["l1_coef"] is None and doc["note"] == [None, 1.5]


def test_bad_inputs(run, tmp_path, capsys):
    with pytest.raises(ValueError, match="no such file or folder"):
        cap.load_model(tmp_path / "missing")
    assert cap.main([str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a folder with neither"):
        cap.load_model(tmp_path / "empty")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="a pickle .* twell no longer loads"):
        cap.load_model(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="expected a twell.train run or checkpoint folder"):
        cap.load_model(tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="no MLP found"):
        cap.capture(torch.nn.Sequential(torch.nn.Linear(4, 4)), [], str(tmp_path / "n"), 4)
    with pytest.raises(ValueError, match="tokens"):
        cap.capture(_hf_model(), [], str(tmp_path / "z"), 0)
    with pytest.raises(ValueError, match="fewer than"):
        cap.capture(_hf_model(), [np.zeros((1, 5), np.int64)], str(tmp_path / "f"), 10,
                    progress=False)
    with pytest.raises(ValueError, match="dtype"):
        cap.capture(_hf_model(), [], str(tmp_path / "d"), 4, dtype="int8")
    assert cap.main([str(run["dir"]), "--out", str(tmp_path / "t"), "--tokens", "0"]) == 2
    assert "--tokens" in capsys.readouterr().err
    assert cap.main([str(run["dir"]), "--out", str(tmp_path / "t"), "--text",
                     str(tmp_path / "nope.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    # token ids the model's vocabulary does not have (bytes of the euro sign, vocabulary 200)
    folder = tmp_path / "hf200"
    _hf_model(vocab=200).save_pretrained(folder)
    (tmp_path / "euro.txt").write_text("\u20ac" * 50)
    assert cap.main([str(folder), "--out", str(tmp_path / "e"), "--text",
                     str(tmp_path / "euro.txt"), "--tokenizer", "bytes", "--device", "cpu"]) == 2
    assert "vocabulary is 200" in capsys.readouterr().err
    # a Hugging Face model has no data of its own
    assert cap.main([str(folder), "--out", str(tmp_path / "e"), "--device", "cpu"]) == 2
    assert "--data" in capsys.readouterr().err
    # a plain MLP has no gate; a biased one is refused
    model = _hf_model()
    model.model.layers[0].mlp.up_proj.bias = torch.nn.Parameter(torch.zeros(N))
    with pytest.raises(ValueError, match="has a bias"):
        cap.find_mlps(model)
