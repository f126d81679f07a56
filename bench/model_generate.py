"""bench/model.py's generate mode: Hugging Face generate() of the benchmark's model, greedy, a fixed
number of new tokens, with twell's MLPs against its own. model.py times it (the same warm-ups,
alternating reps, peak memory and energy loop as its other modes); this module makes the prompts,
the generate() call, the agreement (identical generated ids, or where they first differ) and the
density over the tokens the FFNs saw, and the row's printed line.
"""
import torch
import transformers

import twell.torch as tt


def prompts(ids, batch, prompt_len):
    """[batch, prompt_len]: the first prompt_len tokens of the input's rows, rows repeated (or
    trimmed) to the batch."""
    rows = torch.arange(batch, device=ids.device) % ids.shape[0]
    return ids[rows, :prompt_len].contiguous()


def generate_kwargs(new_tokens, cache):
    """generate()'s arguments: greedy, exactly new_tokens new tokens (no EOS: nothing stops a row
    early; a pad id so that none is guessed), the cache asked for: static and dynamic eager (no
    auto-compile of the static cache's forward, where this transformers has that option),
    compiled the static cache with that auto-compile."""
    kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False,
          "eos_token_id": None, "pad_token_id": 0}
    if cache in ("static", "compiled"):
        kw["cache_implementation"] = "static"
    if hasattr(transformers.GenerationConfig(), "disable_compile"):
        # compiled: transformers' own torch.compile of the decoding forward over the static
        # cache (CUDA graphs, "reduce-overhead"); otherwise eager.
        kw["disable_compile"] = cache != "compiled"
    return kw


class Generate:
    """step(which) for model.py: one generate() of `prompt`, returning the new tokens' ids
    [batch, new_tokens]. `cache` is the cache used: where the first call's static cache is
    rejected, it and every later call use the dynamic one, saying so."""

    def __init__(self, model, prompt, new_tokens, cache, say=print):
        self.model, self.prompt, self.new_tokens = model, prompt, new_tokens
        self.mask = torch.ones_like(prompt)
        self.cache, self.say = cache, say
        self.kwargs = generate_kwargs(new_tokens, cache)
        self.ran = False

    def __call__(self, which=None):
        try:
            out = self._generate()
        except (ValueError, TypeError, NotImplementedError) as e:
            if self.ran or self.cache != "static":
                raise
            why = (str(e).splitlines() or [type(e).__name__])[0][:160]
            self.say(f"model bench: generate: transformers {transformers.__version__} rejects "
                     f"cache_implementation='static' ({why}); the dynamic cache instead")
            self.cache = "dynamic"
            self.kwargs = generate_kwargs(self.new_tokens, self.cache)
            out = self._generate()
        self.ran = True
        return out

    def _generate(self):
        out = self.model.generate(self.prompt, attention_mask=self.mask, **self.kwargs)
        new = out[:, self.prompt.shape[1]:]
        if new.shape[1] != self.new_tokens:
            raise RuntimeError(f"generate() gave {new.shape[1]} new tokens, not {self.new_tokens}")
        return new


def first_divergence(got, ref):
    """None where the two [batch, new_tokens] id tensors are equal, else {"row", "position"} of
    their first difference: the earliest new-token position where any row differs, and the
    first row differing there."""
    diff = (got != ref).cpu()
    if not bool(diff.any()):
        return None
    position = int(diff.any(dim=0).nonzero()[0, 0])
    return {"row": int(diff[:, position].nonzero()[0, 0]), "position": position}


def mean_l0(model, fn):
    """(fn(), [mean active units per token of each twell FFN over every token it saw during
    fn()]): generate() runs the FFNs once on the prompt and once per further token, and
    l0_per_layer would keep only the last."""
    sums = {}

    def hook(name):
        def record(module, inputs, output):
            n = inputs[0].numel() // module.hidden_size
            s = sums.setdefault(name, [0.0, 0])
            s[0], s[1] = s[0] + module.l0 * n, s[1] + n
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in tt.sparse_modules(model)]
    try:
        out = fn()
    finally:
        for h in handles:
            h.remove()
    return out, [float(s) / n for s, n in sums.values() if n]


def agreement(model, swap, step):
    """(twell's l0 per layer, row fields): one generate of each model, dense first. A compiled
    generate's modules record l0 inside its CUDA graphs, which later replays overwrite: its density
    comes from one more twell generate on the same static cache, eager."""
    swap.use("dense")
    ref = step("dense")
    swap.use("twell")
    if step.cache == "compiled":
        got = step("twell")
        eager = Generate(step.model, step.prompt, step.new_tokens, "static", say=step.say)
        _, l0 = mean_l0(model, eager)
    else:
        got, l0 = mean_l0(model, lambda: step("twell"))
    where = first_divergence(got, ref)
    if where is not None:
        where.update(divergence_margin(swap, step, got, ref, where))
        where["split_divergence"] = split_divergence(swap, step, ref)
        swap.use("twell")
    return l0, {"identical_tokens": where is None, "first_divergence": where}


def divergence_margin(swap, step, got, ref, where):
    """Whether the first divergence is a rounding tie: one forward of the shared prefix (the row's
    prompt and the new tokens both models gave before it) with the dense, twell and split MLPs
    (split: exact, rounded differently). `margin`: the dense logit of dense's token minus that of
    twell's token; `twell_shift` / `split_shift`: the largest logit change of twell / split from
    dense there. `rounding`: the margin is within what the exact split model moves (a tie that
    rounding alone can flip), or negative by no more than the larger shift: dense's own forward of
    the prefix ranks twell's token above the token dense's generate() chose, so dense's two
    computations of the same prefix (its decoding steps, whose cache each step rounded, and one
    forward) already disagree there, by as much as rounding moves a logit."""
    r, p = where["row"], where["position"]
    ids = torch.cat([step.prompt[r], ref[r, :p]]).unsqueeze(0)
    logits = {}
    with torch.no_grad():
        for which in ("dense", "twell", "split"):
            swap.use(which)
            logits[which] = swap.model(ids).logits[0, -1].float()
    dense = logits["dense"]
    margin = float(dense[ref[r, p]] - dense[got[r, p]])
    shift = {w: float((logits[w] - dense).abs().max()) for w in ("twell", "split")}
    return {"margin": margin, "twell_shift": shift["twell"], "split_shift": shift["split"],
            "rounding": (margin <= shift["split"] if margin >= 0
                         else -margin <= max(shift.values()))}


def split_divergence(swap, step, ref):
    """Where one generate() with the split MLPs (exact, rounded differently) first leaves dense's
    tokens, {"row", "position"} or None: how far rounding alone carries this model's decoding on
    the same cache and compilation, where divergence_margin looks at one eager forward."""
    swap.use("split")
    return first_divergence(step("split"), ref)


def tie_note(where):
    """", logit margin M (split model moves S: a rounding tie)" where the margin was measured,
    and where the split model's own generate first differs from dense's."""
    if "margin" not in where:
        return ""
    kind = "a rounding tie" if where["rounding"] else "beyond rounding"
    if where["margin"] <= 0:
        kind += " (dense's own forward of the prefix ranks twell's token first)"
    note = f", logit margin {where['margin']:.3g}, split moves {where['split_shift']:.3g}: {kind}"
    if "split_divergence" in where:
        split = where["split_divergence"]
        note += ("; split generate identical to dense" if split is None else
                 f"; split generate differs from row {split['row']}, new token {split['position']}")
    return note


def line_parts(row):
    """(the case, the agreement) of a generate row's printed line."""
    where = row["first_divergence"]
    same = "yes" if row["identical_tokens"] else \
        f"no (first at row {where['row']}, new token {where['position']}{tie_note(where)})"
    return (f"batch {row['batch']} prompt {row['prompt_len']} new {row['new_tokens']} "
            f"({row['gen_cache']} cache)",
            f"{row['dense_tokens_per_s']:.1f} / {row['twell_tokens_per_s']:.1f} tokens/s; "
            f"identical tokens {same}")
