"""Train a tiny Llama with twell's sparse FFNs: patch it to ReLU, add the L1 term, watch L0 fall.

Builds the model from a LlamaConfig (nothing is downloaded) and trains it on random token
sequences with a learnable pattern (each token is the previous one plus one, modulo the vocabulary).

    python examples/train_sparse_llama.py --device cpu --steps 30
"""
import argparse
import time

import torch
import transformers

import twell.torch as tt


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--l1", type=float, default=0.02, help="L1 coefficient")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def progress(steps):
    try:
        from tqdm import tqdm
        return tqdm(range(steps), unit="step")
    except ImportError:
        return range(steps)


def report(bar, step, text):
    if hasattr(bar, "set_postfix_str"):
        bar.set_postfix_str(text)
    else:
        print(f"step {step + 1}: {text}", flush=True)


def batch(args, vocab, generator):
    start = torch.randint(0, vocab, (args.batch, 1), generator=generator)
    return (start + torch.arange(args.seq)) % vocab


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    # The CUDA backend runs bfloat16 weights; the CPU backend float32 (float16/bfloat16 too).
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=args.seq, hidden_act="silu")
    model = transformers.LlamaForCausalLM(config).to(args.device, dtype).train()
    replaced = tt.patch_model(model, activation="relu", l1_coef=args.l1)
    print(f"patched {replaced} MLPs to twell SparseGatedMLP (ReLU), L1 coefficient {args.l1}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)

    bar = progress(args.steps)
    tokens, start = 0, time.perf_counter()
    for step in bar:
        ids = batch(args, config.vocab_size, generator).to(args.device)
        loss = model(ids, labels=ids).loss
        l1 = tt.l1_loss(model)
        (loss + l1).backward()
        l1 = l1.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += ids.numel()
        l0 = tt.l0_per_layer(model)
        mean_l0 = sum(l0.values()) / len(l0)
        rate = tokens / (time.perf_counter() - start)
        report(bar, step, f"loss {loss.item():.3f} l1 {l1.item():.3f} "
                          f"L0 {mean_l0:.1f}/{args.intermediate} {rate:,.0f} tok/s")
    print(f"final: loss {loss.item():.4f}, L0 per layer "
          + ", ".join(f"{v:.1f}" for v in l0.values())
          + f" of {args.intermediate}, {rate:,.0f} tokens/s")


if __name__ == "__main__":
    main()
