"""Model presets for twell.train: Hugging Face LlamaForCausalLM shapes, built from a config
(nothing is downloaded). Parameter counts below are at a vocabulary of 8192 (untied embeddings).

  tiny        hidden   64, intermediate   256,  2 layers,  4 heads (2 KV)   ~1.2M   tests, CPU
  s30m        hidden  512, intermediate  1408,  8 layers,  8 heads          ~34M
  s60m        hidden  640, intermediate  1792, 10 layers, 10 heads          ~61M
  s100m       hidden  768, intermediate  2048, 12 layers, 12 heads          ~97M
  paper-0.5b  hidden 2048, intermediate 5632,  8 layers, 32 heads          ~445M  the paper's FFN
                                                                                  shape
"""
from twell.train.files import InputError

PRESETS = {
    "tiny": {"hidden": 64, "intermediate": 256, "layers": 2, "heads": 4, "kv_heads": 2},
    "s30m": {"hidden": 512, "intermediate": 1408, "layers": 8, "heads": 8, "kv_heads": 8},
    "s60m": {"hidden": 640, "intermediate": 1792, "layers": 10, "heads": 10, "kv_heads": 10},
    "s100m": {"hidden": 768, "intermediate": 2048, "layers": 12, "heads": 12, "kv_heads": 12},
    "paper-0.5b": {"hidden": 2048, "intermediate": 5632, "layers": 8, "heads": 32,
                   "kv_heads": 32},
}


def shape(preset, **overrides):
    """The preset's shape with the given (non-None) overrides; InputError naming the argument
    where it is not a Llama shape (sizes >= 1, hidden a multiple of heads with an even head
    size for the rotary embedding, heads a multiple of kv_heads)."""
    if preset not in PRESETS:
        raise InputError("--model", f"one of {', '.join(PRESETS)}", repr(preset))
    out = dict(PRESETS[preset])
    out.update({k: v for k, v in overrides.items() if v is not None})
    for k in ("hidden", "intermediate", "layers", "heads", "kv_heads"):
        if type(out[k]) is not int or out[k] < 1:
            raise InputError(f"--{k.replace('_', '-')}", "an integer >= 1", repr(out[k]))
    if out["hidden"] % out["heads"] or (out["hidden"] // out["heads"]) % 2:
        raise InputError("--heads", f"a divisor of --hidden {out['hidden']} leaving an even head "
                         f"size", out["heads"])
    if out["heads"] % out["kv_heads"]:
        raise InputError("--kv-heads", f"a divisor of --heads {out['heads']}", out["kv_heads"])
    return out


def build(preset, vocab_size, seq_len, device=None, hidden_act="silu", **overrides):
    """(LlamaForCausalLM with `hidden_act` MLPs (transformers' own), its shape dict) in float32 on
    the CPU, or on `device` ("meta": no memory, for sizes)."""
    import contextlib

    import torch
    import transformers

    s = shape(preset, **overrides)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], max_position_embeddings=seq_len, hidden_act=hidden_act,
        tie_word_embeddings=False, rms_norm_eps=1e-5)
    with torch.device(device) if device else contextlib.nullcontext():
        model = transformers.LlamaForCausalLM(config)
    return model, s


def count_params(model):
    """(all parameters, non-embedding parameters)."""
    import torch

    total = sum(p.numel() for p in model.parameters())
    emb = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    head = model.get_output_embeddings()
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        emb += head.weight.numel()
    return total, total - emb
