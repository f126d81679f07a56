"""Model presets for twell.train: Hugging Face LlamaForCausalLM shapes, built from a config
(nothing is downloaded). Parameter counts below are at a vocabulary of 8192 (untied embeddings).

  tiny        hidden   64, intermediate   256,  2 layers,  4 heads (2 KV)   ~1.2M   tests, CPU
  s30m        hidden  512, intermediate  1408,  8 layers,  8 heads          ~34M
  s60m        hidden  640, intermediate  1792, 10 layers, 10 heads          ~61M
  s100m       hidden  768, intermediate  2048, 12 layers, 12 heads          ~97M
  paper-0.5b  hidden 2048, intermediate 5632,  8 layers, 32 heads          ~445M  the paper's FFN
                                                                                  shape
"""
PRESETS = {
    "tiny": {"hidden": 64, "intermediate": 256, "layers": 2, "heads": 4, "kv_heads": 2},
    "s30m": {"hidden": 512, "intermediate": 1408, "layers": 8, "heads": 8, "kv_heads": 8},
    "s60m": {"hidden": 640, "intermediate": 1792, "layers": 10, "heads": 10, "kv_heads": 10},
    "s100m": {"hidden": 768, "intermediate": 2048, "layers": 12, "heads": 12, "kv_heads": 12},
    "paper-0.5b": {"hidden": 2048, "intermediate": 5632, "layers": 8, "heads": 32,
                   "kv_heads": 32},
}


def shape(preset, **overrides):
    """The preset's shape with the given (non-None) overrides."""
    if preset not in PRESETS:
        raise ValueError(f"--model: expected one of {', '.join(PRESETS)}, got {preset!r}")
    out = dict(PRESETS[preset])
    out.update({k: v for k, v in overrides.items() if v is not None})
    if out["hidden"] % out["heads"] or out["heads"] % out["kv_heads"]:
        raise ValueError(f"model shape: hidden ({out['hidden']}) must be a multiple of heads "
                         f"({out['heads']}), heads a multiple of kv_heads ({out['kv_heads']})")
    return out


def build(preset, vocab_size, seq_len, **overrides):
    """(LlamaForCausalLM with SiLU MLPs, its shape dict) in float32 on the CPU."""
    import transformers

    s = shape(preset, **overrides)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], max_position_embeddings=seq_len, hidden_act="silu",
        tie_word_embeddings=False, rms_norm_eps=1e-5)
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
