"""Activation capture: the MLP input of every decoder layer of a trained model, with the layer's
weights, as NumPy .npy files for twell's C++ tools and benchmarks.

    python -m twell.capture CHECKPOINT --out DIR [--tokens 16384] [--dtype D]
                            [--data SPEC | --text FILE] [--tokenizer T] [--device auto]

CHECKPOINT: a checkpoint folder written by `python -m twell.train` (OUT/checkpoint, or its run
folder OUT), or a Hugging Face model folder (config.json and model.safetensors). No file is
unpickled: an older twell's checkpoint.pt and a folder with only pytorch_model.bin are refused,
and every file is checked (regular, bounded, its contents) before use. The text: by default
the validation split of the checkpoint's own --data (the same loading as twell.train: a token
folder such as .carry/corpus, a folder of text files, hf:NAME, synthetic); --data SPEC another
one; --text FILE the whole of one plain-text file, tokenized with the checkpoint's tokenizer (or
--tokenizer). Windows of the checkpoint's seq_len (--seq-len), in order, batch by batch, until
--tokens tokens are seen.

Written to DIR, per decoder layer i (MLP modules in model order), all C-contiguous:
  layer{i}.x.npy     [M, K]  the MLP's input (first M tokens, windows in order, row-major)
  layer{i}.gate.npy  [N, K]  gate_proj.weight (absent for a plain FFN)
  layer{i}.up.npy    [N, K]  up_proj.weight
  layer{i}.down.npy  [N, K]  down_proj.weight.T (neuron-major)
dtype: float32 '<f4', float16 '<f2', bfloat16 as its raw bits, '<u2' (uint16); all files of a
capture share one dtype (--dtype, default the model's). manifest.json, written last:
  {"format": "twell-capture-1", "layers": L, "kind": "gated"|"plain", "hidden": K,
   "intermediate": N, "dtype": "bfloat16"|"float16"|"float32", "tokens": M, "checkpoint": path,
   "l1_coef": float or null, "train_log": the checkpoint's log.jsonl or null, "source_text": str,
   "activation", "seq_len", "modules", "max_row_active": [per layer: the most active units
   (gate > 0) of one captured token, from the model's own gate GEMM], ...}
"""
import argparse
import contextlib
import glob
import json
import math
import os
import sys

import numpy as np

from twell.train import files
from twell.train.files import InputError

FORMAT = "twell-capture-1"
DTYPES = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2"}


# ---- models -----------------------------------------------------------------------------------

def _torch_dtype(name):
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _dtype_name(dtype):
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {name}")
    return name


def resolve_checkpoint(path):
    """("twell.train", checkpoint folder) or ("hf", folder) for a checkpoint path (a twell.train
    checkpoint folder or run folder, or a Hugging Face model folder); InputError otherwise (a
    pickle checkpoint.pt is named as such, never read)."""
    from twell.train import checkpoint, state_files

    path = os.fspath(path)
    what = f"checkpoint {path}"
    if not os.path.exists(path):
        raise InputError(what, "a checkpoint or model folder", "no such file or folder")
    if os.path.isdir(path):
        if state_files.is_state_folder(path):
            return "twell.train", path
        found = checkpoint.find(path)  # a run folder; refuses a lone pickle checkpoint.pt
        if found is not None:
            return "twell.train", found
        if os.path.lexists(os.path.join(path, "config.json")):
            return "hf", path
        raise InputError(what, "a twell.train run or checkpoint folder (checkpoint/state.json)"
                         " or a Hugging Face model folder (config.json)", "a folder with neither")
    if state_files.looks_like_pickle(path):
        raise checkpoint.pickle_error(path)
    raise InputError(what, "a twell.train run or checkpoint folder, or a Hugging Face model "
                     "folder", files.kind_of(os.stat(path).st_mode))


def _last_l1_coef(log_path):
    """The l1_coef of the last "log" record of a twell.train log.jsonl (None: none there, or no
    readable log)."""
    try:
        text = files.read_text(log_path, log_path)
    except InputError:
        return None
    coef = None
    for rec in files.json_records(text):
        if rec.get("kind") == "log" and type(
                rec.get("l1_coef")) in (int, float) and math.isfinite(rec["l1_coef"]):
            coef = rec["l1_coef"]
    return coef


def _hf_model(folder, dtype):
    """A Hugging Face model folder's model: config.json checked, weights from safetensors only
    (never a pickle), no code of the folder run, nothing downloaded."""
    import transformers

    files.read_json(os.path.join(folder, "config.json"), f"checkpoint {folder}/config.json")
    if not glob.glob(os.path.join(folder, "*.safetensors")):
        raise InputError(f"checkpoint {folder}", "a Hugging Face model folder with safetensors "
                         "weights (model.safetensors)", "none: pickled weights such as "
                         "pytorch_model.bin are not read, unpickling can run code")
    kwargs = dict(use_safetensors=True, local_files_only=True, trust_remote_code=False)
    try:
        try:
            return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or "auto",
                                                                     **kwargs)
        except TypeError:  # older transformers
            return transformers.AutoModelForCausalLM.from_pretrained(
                folder, torch_dtype=dtype or "auto", **kwargs)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 (any error of transformers or safetensors reading the
        # folder's files: a truncated safetensors file, a config its classes refuse, ...)
        raise InputError(f"checkpoint {folder}", "a Hugging Face causal LM folder it can load",
                         f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}") from None


def _can_run_twell(device):
    import twell
    return device.type == "cpu" or (device.type == "cuda" and twell.cuda_compiled())


def load_model(path, device="cpu", dtype=None, mlp="auto"):
    """(model in eval mode on `device`, info dict) from a twell.train checkpoint (file or run
    folder) or a Hugging Face model folder. dtype: a torch dtype, or None for the checkpoint's.
    mlp: "twell" (MLPs patched to twell's modules), "dense" (the model's own MLPs; a twell.train
    ReLU model gets ReLU Llama MLPs) or "auto" (twell where it can run: ReLU MLPs, and the CPU or
    a CUDA build). info: kind, checkpoint, args (twell.train's command line, or None), l1_coef,
    activation, dtype, seq_len, mlp."""
    import torch

    import twell.torch as tt

    if mlp not in ("auto", "twell", "dense"):
        raise ValueError(f"mlp: expected auto, twell or dense, got {mlp!r}")
    device = torch.device(device)
    kind, file = resolve_checkpoint(path)
    info = {"kind": kind, "checkpoint": os.path.abspath(file), "args": None, "l1_coef": None,
            "train_log": None}
    if kind == "twell.train":
        from twell.train import checkpoint, models
        state = checkpoint.read(file)
        args, weights = state["args"], state["model"]
        a = vars(args)
        emb = weights.get("model.embed_tokens.weight")
        if emb is None or emb.dim() != 2 or emb.shape[0] < 1:
            raise InputError(f"checkpoint {file}: model", "a model.embed_tokens.weight [vocab, "
                             "hidden]", "none" if emb is None else list(emb.shape))
        shape = dict(hidden=args.hidden, intermediate=args.intermediate, layers=args.layers,
                     heads=args.heads, kv_heads=args.kv_heads)
        sizes, _ = models.build(args.model, emb.shape[0], args.seq_len, device="meta", **shape)
        checkpoint.check_tensors(weights, sizes.state_dict(), f"checkpoint {file}: model",
                                 same_dtype=False)
        model, _ = models.build(args.model, emb.shape[0], args.seq_len, **shape)
        activation = args.activation
        relu = activation == "relu"
        log = os.path.join(os.path.dirname(file), "log.jsonl")
        info["train_log"] = log if os.path.isfile(log) else None
        if relu:
            info["l1_coef"] = _last_l1_coef(log)
            if info["l1_coef"] is None:
                info["l1_coef"] = a.get("l1")
        if relu:  # the ReLU Llama MLPs twell.train trained (patched back below if dense is asked)
            tt.patch_model(model, activation="relu")
            tt.unpatch_model(model)
        model.load_state_dict(weights)
        info.update(args=a, activation=activation, seq_len=args.seq_len, step=state["step"],
                    model_dtype=_dtype_name(emb.dtype))
        model.to(dtype=dtype or emb.dtype)
    else:
        model = _hf_model(file, dtype)
        cfg = model.config
        activation = getattr(cfg, "hidden_act", None) or "unknown"
        relu = activation == "relu"
        info.update(activation=activation,
                    seq_len=min(2048, getattr(cfg, "max_position_embeddings", 2048) or 2048),
                    model_dtype=_dtype_name(next(model.parameters()).dtype))
    use_twell = mlp == "twell" or (mlp == "auto" and relu and _can_run_twell(device))
    if use_twell:
        if not relu:
            raise ValueError(f"checkpoint {file}: its activation is {activation}, not ReLU; "
                             f"twell's modules run ReLU FFNs only (use --mlp dense)")
        tt.patch_model(model, l1_coef=info["l1_coef"] or 0.0)
    info["mlp"] = "twell" if use_twell else "dense"
    model.to(device).eval()
    info["dtype"] = _dtype_name(next(model.parameters()).dtype)
    return model, info


def find_mlps(model):
    """[(name, module, gated)] of every FFN in `model`, in module order: twell modules, and
    modules with up_proj and down_proj nn.Linear (gate_proj too for a gated one) and an act_fn
    (Llama, Qwen2, Mistral MLPs). ValueError where there is none, they differ in shape or kind,
    or one has a bias."""
    from torch import nn

    from twell.torch.modules import _SparseFFN

    found = []
    for name, m in model.named_modules():
        lin = lambda n: isinstance(getattr(m, n, None), nn.Linear)  # noqa: E731
        if isinstance(m, _SparseFFN):
            found.append((name, m, m.gated))
        elif lin("up_proj") and lin("down_proj") and hasattr(m, "act_fn"):
            found.append((name, m, lin("gate_proj")))
    if not found:
        raise ValueError("capture: no MLP found in this model (expected twell FFN modules or "
                         "modules with gate_proj/up_proj/down_proj nn.Linear and an act_fn, as in "
                         "Llama, Qwen2, Mistral)")
    shapes = {(m.up_proj.in_features, m.up_proj.out_features, g) for _, m, g in found}
    if len(shapes) != 1:
        raise ValueError(f"capture: the MLPs differ in [hidden, intermediate, gated]: "
                         f"{sorted(shapes)}; the capture format has one shape")
    for name, m, g in found:
        biased = [n for n in (("gate_proj",) if g else ()) + ("up_proj", "down_proj")
                  if getattr(m, n).bias is not None]
        if biased:
            raise ValueError(f"capture: {name}: {', '.join(biased)} has a bias; the capture "
                             f"format (and twell) has none")
    return found


# ---- text -------------------------------------------------------------------------------------

def _encoder(spec, info, data_spec):
    """The tokenizer for a text file: --tokenizer, else the checkpoint's (twell.train: its token
    folder's tokenizer.json, its --tokenizer, or bytes; Hugging Face: the model folder's)."""
    from twell.train import data as data_mod

    if spec is not None:
        if spec == "bytes":
            return data_mod.ByteEncoder()
        if spec.isdigit():
            raise InputError("--tokenizer", "a tokenizer.json (or a folder with one) or bytes "
                             "with --text (a BPE vocabulary size would train a new tokenizer on "
                             "nothing)", spec)
        try:
            return data_mod.make_encoder(spec)
        except InputError as e:
            raise e.within("--tokenizer") from None
    if info["kind"] == "hf":
        folder = info["checkpoint"]
        if os.path.lexists(os.path.join(folder, "tokenizer.json")):
            return data_mod.make_encoder(folder)
        try:
            import transformers
            return data_mod.CallableEncoder(transformers.AutoTokenizer.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False))
        except Exception as e:  # transformers' loaders raise many kinds
            raise InputError("--text", f"a tokenizer in {folder}, or --tokenizer (a "
                             f"tokenizer.json or bytes)",
                             f"none it can load ({type(e).__name__})") from None
    a = info["args"] or {}
    spec = data_spec or a.get("data")
    if spec == "synthetic":
        raise ValueError("--text: the checkpoint was trained on synthetic data, which has no "
                         "tokenizer; pass --tokenizer")
    if spec and data_mod.is_token_folder(spec):
        path = os.path.join(spec, "tokenizer.json")
        if not os.path.lexists(path):
            raise ValueError(f"--text: the token folder {spec} has no tokenizer.json; pass "
                             f"--tokenizer")
        return data_mod.make_encoder(path)
    tok = a.get("tokenizer")
    if tok is None or tok == "bytes":
        return data_mod.ByteEncoder()
    if isinstance(tok, int) or (isinstance(tok, str) and tok.isdigit()):
        # A BPE trained on the training documents: train it again the same way.
        return _load_data(spec, a).tokenizer
    return data_mod.make_encoder(tok)


def _load_data(spec, a):
    from twell.train import data as data_mod

    tok = a.get("tokenizer")
    if isinstance(tok, str) and tok.isdigit():
        tok = int(tok)
    try:
        return data_mod.load(spec, tok, text_field=a.get("text_field", "text"),
                             val_permille=a.get("val_permille", 20), max_docs=a.get("max_docs"))
    except InputError as e:
        raise e.within("--data") from None
    except (ImportError, ValueError, OSError) as e:
        raise InputError(f"--data: {e}") from None


def validation_ids(info, data=None, text=None, tokenizer=None):
    """(1-D token ids, a description of the text): the whole of file `text`, else the validation
    split of `data` (default: the twell.train checkpoint's --data)."""
    from twell.train import data as data_mod

    if text is not None:
        content = files.read_text(text, f"--text {text}")
        enc = _encoder(tokenizer, info, data)
        return data_mod._ids(enc, [content]), os.path.abspath(text)
    spec = data or (info["args"] or {}).get("data")
    if spec is None:
        raise ValueError("no text: pass --data (a token folder, a text folder, hf:NAME) or "
                         "--text FILE (a Hugging Face model has no training data of its own)")
    if spec not in ("synthetic",) and not spec.startswith("hf:") and not os.path.exists(spec):
        raise ValueError(f"--data {spec}: no such folder (the checkpoint's data is relative to "
                         f"where it was trained; pass --data, e.g. .carry/corpus from "
                         f"scripts/prepare-corpus)")
    a = dict(info["args"] or {})
    if tokenizer is not None:
        a["tokenizer"] = None if tokenizer == "bytes" else tokenizer
    d = _load_data(spec, a)
    desc = spec if spec == "synthetic" or spec.startswith("hf:") else os.path.abspath(spec)
    return np.asarray(d.val), f"{desc} (validation split)"


def windows(ids, seq_len, batch_size, tokens):
    """Batches (int64 [b, seq_len + 1]) of consecutive non-overlapping windows of `ids`, enough
    for `tokens` input tokens (or all there are); and the number of input tokens they hold."""
    from twell.train import data as data_mod

    if len(ids) < 2:
        raise ValueError(f"the text has {len(ids)} tokens; at least 2 are needed")
    seq_len = min(seq_len, len(ids) - 1)
    need = math.ceil(tokens / (batch_size * seq_len))
    batches = data_mod.eval_windows(ids, batch_size, seq_len, max_batches=need)
    return batches, min(tokens, sum(b.shape[0] for b in batches) * seq_len)


# ---- capture ----------------------------------------------------------------------------------

def to_numpy(t, dtype_name):
    """A torch tensor as a C-contiguous numpy array of the capture dtype (bfloat16: its bits as
    uint16)."""
    import torch

    t = t.detach().to(_torch_dtype(dtype_name)).cpu().contiguous()
    if dtype_name == "bfloat16":
        return t.view(torch.int16).numpy().view("<u2")
    return t.numpy().astype(DTYPES[dtype_name], copy=False)


def capture(model, batches, out, tokens, dtype=None, *, manifest=None, progress=True):
    """Runs `model` on `batches` (int64 arrays or tensors [b, s + 1]; inputs [:, :-1]) under
    no_grad, saving each MLP's first `tokens` input rows and its weights to folder `out` (see the
    module's docstring). dtype: "float32", "float16", "bfloat16" or None (the model's). Returns
    the manifest (extra keys from `manifest`)."""
    import torch

    if not (isinstance(tokens, int) and tokens >= 1):
        raise ValueError(f"tokens: expected an integer >= 1, got {tokens!r}")
    mlps = find_mlps(model)
    _, first, gated = mlps[0]
    K, N = first.up_proj.in_features, first.up_proj.out_features
    dtype = dtype or _dtype_name(first.up_proj.weight.dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    device = first.up_proj.weight.device
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "manifest.json")):
        os.remove(os.path.join(out, "manifest.json"))  # written again last: a complete capture
    for f in glob.glob(os.path.join(out, "layer*.npy")):
        os.remove(f)  # an older capture's files (another model may have more layers)

    xs = [np.lib.format.open_memmap(os.path.join(out, f"layer{i}.x.npy"), mode="w+",
                                    dtype=DTYPES[dtype], shape=(tokens, K))
          for i in range(len(mlps))]
    filled = [0] * len(mlps)
    max_active = [0] * len(mlps)  # per layer: the most active units of one captured token
    first_weights = [(m.gate_proj if g else m.up_proj).weight for _, m, g in mlps]

    def make_hook(i):
        def hook(module, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            if x.shape[-1] != K:
                raise ValueError(f"capture: {mlps[i][0]} received x of shape {tuple(x.shape)}, "
                                 f"expected [..., {K}]")
            take = min(tokens - filled[i], x.numel() // K)
            if take > 0:
                rows = x.reshape(-1, K)[:take]
                xs[i][filled[i]:filled[i] + take] = to_numpy(rows, dtype)
                filled[i] += take
                w = first_weights[i]
                active = int(((rows.to(w.dtype) @ w.t()) > 0).sum(dim=1).max())
                max_active[i] = max(max_active[i], active)
        return hook

    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=tokens, unit="tok", desc="capture", file=sys.stderr)
        except ImportError:
            bar = None
    handles = [m.register_forward_pre_hook(make_hook(i), with_kwargs=True)
               for i, (_, m, _) in enumerate(mlps)]
    # As twell.train evaluates: bf16 autocast for a bf16 model on CUDA.
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                if device.type == "cuda" and first.up_proj.weight.dtype == torch.bfloat16
                else contextlib.nullcontext())
    try:
        with torch.no_grad(), autocast:
            for batch in batches:
                if min(filled) >= tokens:
                    break
                ids = torch.as_tensor(batch, device=device)[:, :-1]
                before = filled[0]
                try:
                    model(input_ids=ids, use_cache=False, logits_to_keep=1)
                except TypeError:  # a model without logits_to_keep
                    model(input_ids=ids, use_cache=False)
                if bar is not None:
                    bar.update(filled[0] - before)
                elif progress:
                    print(f"capture: {filled[0]}/{tokens} tokens", file=sys.stderr, flush=True)
    finally:
        for h in handles:
            h.remove()
        if bar is not None:
            bar.close()
    if min(filled) < tokens:
        raise ValueError(f"capture: the text gave {min(filled)} tokens, fewer than {tokens}")
    for x in xs:
        x.flush()
    xs.clear()  # releases the memmaps (the removed hooks close over this list)
    for i, (_, m, g) in enumerate(mlps):
        weights = {"up": m.up_proj.weight, "down": m.down_proj.weight.t()}
        if g:
            weights["gate"] = m.gate_proj.weight
        for name, w in weights.items():
            a = to_numpy(w, dtype)
            assert a.shape == (N, K) and a.flags.c_contiguous
            np.save(os.path.join(out, f"layer{i}.{name}.npy"), a)
    doc = {"format": FORMAT, "layers": len(mlps), "kind": "gated" if gated else "plain",
           "hidden": K, "intermediate": N, "dtype": dtype, "tokens": tokens,
           "checkpoint": None, "l1_coef": None, "source_text": None}
    doc.update(manifest or {})
    doc["modules"] = [n for n, _, _ in mlps]
    doc["max_row_active"] = max_active
    tmp = os.path.join(out, "manifest.json.tmp")
    with open(tmp, "w") as f:
        # A NaN or inf (an l1_coef from a diverged checkpoint, a caller's manifest entry) is null.
        json.dump(files.finite_json(doc), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "manifest.json"))
    return doc


def read_layer(folder, i, name):
    """One capture file as a torch tensor of the manifest's dtype (bfloat16 from its bits);
    InputError where the manifest or the file is not a capture's (nothing is unpickled)."""
    import torch

    where = os.path.join(folder, "manifest.json")
    doc = files.read_json(where, where)
    dtype = doc.get("dtype") if isinstance(doc, dict) else None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if dtype not in DTYPES or type(layers) is not int:
        raise InputError(where, f"a capture manifest (dtype one of {', '.join(DTYPES)}, layers)",
                         f"dtype {dtype!r}, layers {layers!r}"[:80])
    if type(i) is not int or not 0 <= i < layers:
        raise InputError("layer", f"an index below the manifest's {layers} layers", repr(i))
    if name not in ("x", "gate", "up", "down"):
        raise InputError("name", "x, gate, up or down", repr(name))
    path = os.path.join(folder, f"layer{i}.{name}.npy")
    files.check_regular(path, path)
    try:
        a = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InputError(path, "a .npy array", f"{type(e).__name__}: {e}") from None
    if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype != np.dtype(DTYPES[dtype]):
        raise InputError(path, f"a 2-D {DTYPES[dtype]} array (the manifest's {dtype})",
                         f"{getattr(a, 'ndim', '?')}-D {getattr(a, 'dtype', type(a).__name__)}")
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


# ---- command line -----------------------------------------------------------------------------

def parser():
    from twell.train.cli import DefaultsHelpFormatter, OneLineParser

    p = OneLineParser(
        name="twell.capture", prog="python -m twell.capture",
        description="Save each decoder layer's MLP input (first --tokens tokens of validation "
                    "text) and weights of a trained model as .npy files plus manifest.json.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=DefaultsHelpFormatter)
    p.add_argument("checkpoint", help="a python -m twell.train checkpoint folder (or its run "
                                      "folder), or a Hugging Face model folder")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--tokens", type=int, default=16384, help="tokens M per layer (default 16384)")
    p.add_argument("--dtype", choices=list(DTYPES), help="file dtype (default: the model's)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--data", help="token folder, text folder, hf:NAME or synthetic: its "
                                  "validation split (default: the checkpoint's --data)")
    g.add_argument("--text", help="a plain-text file, all of it")
    p.add_argument("--tokenizer", help="for --text or a text --data: tokenizer.json (or a folder "
                                       "with one), a BPE vocabulary size, or bytes (default: the "
                                       "checkpoint's)")
    p.add_argument("--seq-len", type=int, help="tokens per window (default: the checkpoint's)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward (default 8)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda[:N]")
    p.add_argument("--mlp", choices=["auto", "twell", "dense"], default="auto",
                   help="run the MLPs on twell's modules or the model's own (default auto: twell "
                        "where it can run)")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        for name in ("tokens", "batch_size", "seq_len"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise InputError(f"--{name.replace('_', '-')}", "an integer >= 1", value)
        resolve_checkpoint(args.checkpoint)  # before loading a model: a quick, clear error
        from twell.train.loop import resolve_device
        device = resolve_device(args.device)
        files.output_folder(args.out)
        model, info = load_model(args.checkpoint, device, mlp=args.mlp)
        ids, source = validation_ids(info, args.data, args.text, args.tokenizer)
        vocab = model.get_input_embeddings().weight.shape[0]
        if len(ids) and int(np.max(ids)) >= vocab:
            raise ValueError(f"the text's token ids reach {int(np.max(ids))}, the model's "
                             f"vocabulary is {vocab}: another tokenizer (--tokenizer)?")
        seq_len = args.seq_len or info["seq_len"]
        batches, available = windows(ids, seq_len, args.batch_size, args.tokens)
        tokens = args.tokens
        if available < tokens:
            print(f"twell.capture: the text holds {available} tokens in windows of "
                  f"{min(seq_len, len(ids) - 1)}; capturing {available}, not {tokens}",
                  file=sys.stderr)
            tokens = available
        meta = {"checkpoint": info["checkpoint"], "l1_coef": info["l1_coef"],
                "train_log": info["train_log"],
                "source_text": source, "activation": info["activation"],
                "seq_len": int(batches[0].shape[1] - 1), "model_dtype": info["model_dtype"],
                "mlp": info["mlp"], "step": info.get("step")}
        doc = capture(model, batches, args.out, tokens, args.dtype, manifest=meta,
                      progress=not args.no_progress)
    except ValueError as e:
        return _fail(str(e))
    except OSError as e:  # writing the capture
        return _fail(f"--out {args.out}: expected a folder it can write, got "
                     f"{e.strerror or e} ({e.filename})")
    except (MemoryError, RuntimeError) as e:
        torch = sys.modules.get("torch")
        if not (isinstance(e, MemoryError) or (torch and isinstance(e, torch.OutOfMemoryError))):
            raise
        return _fail(f"out of memory: expected a model and --batch-size {args.batch_size} that "
                     f"fit on --device {args.device}, got {type(e).__name__}")
    print(f"twell.capture: {doc['layers']} layers ({doc['kind']}, K={doc['hidden']}, "
          f"N={doc['intermediate']}, {doc['dtype']}), {doc['tokens']} tokens -> {args.out}")
    return 0


def _fail(message):
    message = message.replace("\n", "\\n").replace("\r", "\\r")  # one line, whatever a path holds
    print(f"twell.capture: {message}", file=sys.stderr, flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
