"""The training loop of twell.train: a LlamaForCausalLM with twell ReLU FFNs (or its SiLU
baseline), next-token cross-entropy plus twell's L1 term, AdamW with warm-up and cosine decay,
gradient accumulation, periodic validation, checkpoints that resume exactly, a JSONL log and a
time budget. `run(args)` takes the parsed command line of twell.train.cli.

Precision: float32 on the CPU; on CUDA, bfloat16 parameters (the twell CUDA kernels run bf16)
under bf16 autocast, with float32 master weights in the optimizer (gradients accumulate there in
float32, the updated weights are copied back to the bf16 parameters in place, so twell's plans
stay valid).
"""
import contextlib
import json
import math
import os
import time

import torch
import torch.nn.functional as F

import twell
import twell.torch as tt
from twell.train import checkpoint, files, models
from twell.train import data as data_mod
from twell.train.files import InputError
from twell.train.progress import Progress
from twell.train.report import layer_table, layer_warnings
from twell.train.sparsity import LayerMonitor

DEVICES = "auto, cpu, cuda or cuda:N"


def resolve_device(name, what="--device"):
    """The torch device of a --device value (auto: CUDA when available), or InputError where it
    is not one this machine has."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise InputError(what, DEVICES, repr(name)) from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise InputError(what, DEVICES, repr(name))
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise InputError(what, "auto or cpu (PyTorch sees no CUDA device here)", repr(name))
    if (device.index or 0) >= count:
        raise InputError(what, f"cuda:N with N below {count} (the CUDA devices here)", repr(name))
    return device


def _memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _schedule(warmup, total, min_ratio):
    def factor(step):  # step: optimizer steps taken so far
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


class Trainer:
    def __init__(self, args, start_time=None):
        self.args = a = args
        self.start_time = start_time or time.monotonic()
        self.deadline = (self.start_time + a.max_minutes * 60) if a.max_minutes else None
        self.device = resolve_device(a.device)
        if self.device.type == "cuda" and a.activation == "relu" and not twell.cuda_compiled():
            raise InputError("--device", "cpu, or a twell built with CUDA (its ReLU FFNs run on "
                             "twell)", repr(a.device))
        self.out = files.output_folder(a.out)
        self.ckpt_path = checkpoint.path(self.out)
        if os.path.lexists(self.ckpt_path) and not os.path.isdir(self.ckpt_path):
            raise InputError("--out", f"a run folder whose {checkpoint.FOLDER} is a folder",
                             f"{self.ckpt_path}, which is not")
        if a.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        cuda = self.device.type == "cuda"
        self.precision = a.precision or ("bf16" if cuda else "fp32")
        self.dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                         if cuda and self.precision == "bf16" else contextlib.nullcontext())

        tokenizer = a.tokenizer
        if isinstance(tokenizer, str):  # a tokenizer.json (or a folder with one): read it first
            try:
                tokenizer = data_mod.make_encoder(tokenizer)
            except InputError as e:
                raise e.within("--tokenizer") from None
        try:
            self.data = data_mod.load(a.data, tokenizer, text_field=a.text_field,
                                      val_permille=a.val_permille, max_docs=a.max_docs)
        except InputError as e:
            raise e.within("--data") from None
        except (ImportError, ValueError, OSError) as e:
            raise InputError(f"--data: {e}") from None
        self._check_sizes()
        torch.manual_seed(a.seed)
        self.model, self.shape = models.build(
            a.model, self.data.vocab_size, a.seq_len,
            hidden_act="relu" if a.activation == "relu-torch" else "silu", hidden=a.hidden,
            intermediate=a.intermediate, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads)
        self.params_total, self.params_body = models.count_params(self.model)
        if a.activation == "relu":
            tt.patch_model(self.model, activation="relu", l1_coef=a.l1, dispatch=a.dispatch)
        self.model.to(self.device, self.dtype).train()
        self.sparse = [m for _, m in tt.sparse_modules(self.model)]

        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params
        self.master = ([p.detach().float().clone() for p in params]
                       if self.dtype != torch.float32 else None)
        opt_params = self.master or params
        decay = [q for p, q in zip(params, opt_params) if p.ndim >= 2]
        no_decay = [q for p, q in zip(params, opt_params) if p.ndim < 2]
        self.opt_params = opt_params
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": a.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8, fused=cuda)
        warmup = a.warmup if a.warmup is not None else max(1, min(200, a.steps // 20))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _schedule(warmup, a.steps, a.min_lr_ratio))

        self.sampler = self.data.sampler(a.batch_size, a.seq_len, seed=a.seed)
        self.val = self.data.val_batches(a.eval_batch_size or a.batch_size, a.seq_len,
                                         max_batches=a.eval_batches)
        self.val_sources = self.data.val_source_ids(a.eval_batch_size or a.batch_size,
                                                    a.seq_len, max_batches=a.eval_batches)
        self.monitor = LayerMonitor(self.model, a.dead_window, track_dead=not a.no_dead_tracking)
        self.tokens_per_step = a.batch_size * a.seq_len * a.grad_accum
        self.step, self.tokens, self.last_reinit = 0, 0, 0
        self.coef = a.l1
        self.log_path = os.path.join(self.out, "log.jsonl")
        if os.path.lexists(self.log_path):  # appended to on resume, replaced otherwise
            files.check_regular(self.log_path, f"--out {self.out}: log.jsonl")
        self._reset_interval()
        self.step_time = None  # seconds per optimizer step (measured)
        self.eval_time = None
        self.ckpt_time = None

    def _check_sizes(self):
        """InputError where the data is too short for one window, or where the model's weights
        and AdamW state or one micro-batch's logits alone exceed the device's memory (a lower
        bound on what training needs: a run refused here could not have run)."""
        a, data = self.args, self.data
        for name, ids in (("training", data.train), ("validation", data.val)):
            if len(ids) < a.seq_len + 1:
                raise InputError("--seq-len", f"at most {len(ids) - 1}: the {name} split of "
                                 f"--data {a.data} holds {len(ids)} tokens", a.seq_len)
        meta, _ = models.build(a.model, data.vocab_size, a.seq_len, device="meta",
                               hidden=a.hidden, intermediate=a.intermediate, layers=a.layers,
                               heads=a.heads, kv_heads=a.kv_heads)
        params = sum(p.numel() for p in meta.parameters())
        bf16 = (a.precision or ("bf16" if self.device.type == "cuda" else "fp32")) == "bf16"
        weights = params * (20 if bf16 else 16)  # weight, gradient, AdamW moments, fp32 master
        batch = max(a.batch_size, a.eval_batch_size or 0)
        logits = batch * a.seq_len * data.vocab_size * 12  # fp32 logits, their log-softmax, grad
        memory = _memory_bytes(self.device)
        gib = 1 << 30
        if weights > memory:
            raise InputError("--model", f"a model whose weights and AdamW state fit in the "
                             f"{memory / gib:.1f} GiB of {self.device}",
                             f"{params:,} parameters needing {weights / gib:.1f} GiB")
        if weights + logits > memory:
            raise InputError("--eval-batch-size" if (a.eval_batch_size or 0) > a.batch_size
                             else "--batch-size", f"micro-batches whose logits fit in the "
                             f"{(memory - weights) / gib:.1f} GiB of {self.device} the model "
                             f"leaves", f"{batch} x --seq-len {a.seq_len} x vocabulary "
                             f"{data.vocab_size} needing {logits / gib:.1f} GiB")

    # ---- steps -----------------------------------------------------------------------------

    def _reset_interval(self):
        z = torch.zeros((), device=self.device)
        self.acc = {"ce": z.clone(), "l1": z.clone(), "micro": 0, "steps": 0, "tokens": 0,
                    "grad_norm": z.clone(), "train_s": 0.0, "reinit": {}}
        self.interval_start = time.monotonic()
        self.paused_s = 0.0

    def l1_coef(self):
        a = self.args
        if a.l1_warmup and self.step < a.l1_warmup:
            return a.l1 * (self.step + 1) / a.l1_warmup
        return a.l1

    def train_step(self):
        a = self.args
        coef = self.coef = self.l1_coef()
        for m in self.sparse:
            m.l1_coef = coef
        for _ in range(a.grad_accum):
            batch = torch.from_numpy(next(self.sampler)).to(self.device, non_blocking=True)
            inputs, targets = batch[:, :-1], batch[:, 1:]
            with self.autocast:
                logits = self.model(input_ids=inputs, use_cache=False).logits
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                 targets.reshape(-1))
            l1 = tt.l1_loss(self.model)
            ((ce + l1) / a.grad_accum).backward()
            if self.master is not None:
                for p, m in zip(self.params, self.master):
                    if p.grad is not None:
                        g = p.grad.float()
                        m.grad = g if m.grad is None else m.grad.add_(g)
                        p.grad = None
            self.acc["ce"] += ce.detach()
            if torch.is_tensor(l1):
                self.acc["l1"] += l1.detach().float()
            self.acc["micro"] += 1
        if a.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.opt_params, a.clip)
            self.acc["grad_norm"] = torch.maximum(self.acc["grad_norm"], norm.float())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if self.master is not None:
            with torch.no_grad():
                for p, m in zip(self.params, self.master):
                    p.copy_(m)
        self.step += 1
        self.tokens += self.tokens_per_step
        self.acc["steps"] += 1
        self.acc["tokens"] += self.tokens_per_step
        if self.monitor.window_full():
            self._close_dead_window()

    def _close_dead_window(self):
        a = self.args
        # No re-initialisation in the run's last reinit_dead_every steps: re-initialised units fire
        # densely at first, and the final model would keep what had no time to settle.
        reinit = (bool(a.reinit_dead_every) and self.step - self.last_reinit >= a.reinit_dead_every
                  and self.step + a.reinit_dead_every <= a.steps)
        masks = self.monitor.close_window(reinit=reinit)
        if not reinit:
            return
        self.last_reinit = self.step
        counts = {n: int(mask.sum()) for n, mask in masks.items()}
        self.acc["reinit"] = {n: self.acc["reinit"].get(n, 0) + c for n, c in counts.items()}
        # The new gate rows must reach the optimizer's weights, and the rows' AdamW moments
        # (built while the units were dead) start again from zero.
        index = {id(p): i for i, p in enumerate(self.params)}
        with torch.no_grad():
            for (name, module), mask in zip(tt.sparse_modules(self.model), masks.values()):
                if not counts[name]:
                    continue
                w = module.first_weight
                target = self.opt_params[index[id(w)]]
                if target is not w:
                    target[mask] = w[mask].float()
                for key in ("exp_avg", "exp_avg_sq"):
                    state = self.optimizer.state.get(target, {})
                    if key in state:
                        state[key][mask] = 0

    @torch.no_grad()
    def evaluate(self):
        t = time.monotonic()
        self.model.eval()
        self.monitor.set_training(False)
        names = [n for n, _, _ in self.data.val_sources] if self.val_sources else []
        # Summed losses and target counts per source (one slot when the ids hold one source).
        total = torch.zeros(max(len(names), 1), device=self.device, dtype=torch.float64)
        count = torch.zeros_like(total)
        for i, batch in enumerate(self.val):
            batch = torch.from_numpy(batch).to(self.device)
            with self.autocast:
                logits = self.model(input_ids=batch[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   batch[:, 1:].reshape(-1), reduction="none").double()
            where = (torch.from_numpy(self.val_sources[i]).to(self.device).reshape(-1)
                     if names else torch.zeros_like(loss, dtype=torch.int64))
            total.index_add_(0, where, loss)
            count.index_add_(0, where, torch.ones_like(loss))
        figures = self.monitor.collect("eval")
        self.monitor.set_training(True)
        self.model.train()
        totals, counts = total.tolist(), count.tolist()
        val_ce = sum(totals) / sum(counts)
        figures["ce_sources"] = {n: t / c for n, t, c in zip(names, totals, counts) if c}
        self.eval_time = time.monotonic() - t
        self.paused_s += self.eval_time
        return val_ce, figures

    # ---- log -------------------------------------------------------------------------------

    def _write(self, record):
        with open(self.log_path, "a") as f:
            f.write(json.dumps(files.finite_json(record), allow_nan=False) + "\n")

    def log(self, val=None):
        acc = self.acc
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.monotonic() - self.interval_start - self.paused_s
        if acc["steps"]:
            self.step_time = wall / acc["steps"]
        figures = self.monitor.collect("train")
        density = figures["density"]
        known = [d for d in density if d is not None]
        mean_density = sum(known) / len(known) if known else None
        micro = max(acc["micro"], 1)
        coef = self.coef
        l1_term = float(acc["l1"]) / micro if acc["micro"] else None
        silent = [n for n, d in zip(self.monitor.names, density) if d == 0.0]
        record = {
            "kind": "log",
            "step": self.step,
            "tokens": self.tokens,
            "lr": self.scheduler.get_last_lr()[0],
            "l1_coef": coef if self.sparse else None,
            "train_ce": float(acc["ce"]) / micro if acc["micro"] else None,
            "l1_term": l1_term if self.sparse else None,
            "l1_value": l1_term / coef if self.sparse and coef and l1_term is not None else None,
            "val_ce": val[0] if val else None,
            "val_ce_sources": val[1]["ce_sources"] or None if val else None,
            "val_density": val[1]["density"] if val else None,
            "val_dead": val[1]["dead"] if val else None,
            "val_ran_dense": val[1]["ran_dense"] if val else None,
            "val_tokens": val[1]["tokens"] if val else None,
            "grad_norm": float(acc["grad_norm"]) if self.args.clip > 0 else None,
            "tokens_per_s": acc["tokens"] / wall if wall > 0 and acc["tokens"] else None,
            "elapsed_s": round(time.monotonic() - self.start_time, 3),
            "mean_density": mean_density,
            "sparsity": 1 - mean_density if mean_density is not None else None,
            "density": density,
            "l0": [None if d is None else d * m.intermediate_size
                   for d, m in zip(density, self.sparse)],
            "dead": list(self.monitor.dead),
            "dead_fraction": self.monitor.dead_fraction(),
            "dead_windows": self.monitor.dead_windows,
            "silent": silent,
            "sparse_form": figures["sparse_form"],
            "sparse_rows": figures["sparse_rows"],
            "reinit": acc["reinit"] or None,
        }
        self._write(record)
        self._reset_interval()
        return record

    # ---- budget ----------------------------------------------------------------------------

    def out_of_time(self, eval_next):
        """True when the next step (and an evaluation due after it), a checkpoint and a margin
        would not end before the deadline."""
        if self.deadline is None:
            return False
        step = self.step_time if self.step_time is not None else 0.0
        if self.ckpt_time is None:  # not measured yet: the checkpoint's bytes at 200 MB/s
            n = sum(p.numel() for p in self.params)
            ckpt = 1.0 + n * (self.dtype.itemsize + (4 if self.master else 0) + 8) / 2e8
        else:
            ckpt = self.ckpt_time
        margin = max(3.0, 0.02 * self.args.max_minutes * 60)  # the log, exit, interpreter end
        need = 1.5 * step + (self.eval_time or 0.0) * eval_next + ckpt + margin
        return time.monotonic() + need > self.deadline

    def config_record(self):
        dev = (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
               else twell.cpu_description())
        meta = {k: v for k, v in self.data.meta.items() if k not in ("files",)}
        return {
            "kind": "config",
            "args": {k: checkpoint._jsonable(v) for k, v in vars(self.args).items()},
            "model": self.shape, "params": self.params_total,
            "non_embedding_params": self.params_body,
            "vocab_size": self.data.vocab_size,
            "layers": self.monitor.names,
            "device": dev, "precision": self.precision,
            "tokens_per_step": self.tokens_per_step,
            "data": meta,
            "train_tokens": len(self.data.train), "val_tokens": len(self.data.val),
            "versions": {"twell": twell.version(), "torch": torch.__version__,
                         "transformers": __import__("transformers").__version__},
        }


def _summary(trainer, record, val_ce):
    n = trainer.shape["intermediate"]
    parts = [f"final: loss {record['train_ce']:.4f}" if record["train_ce"] is not None
             else "final: loss n/a"]
    if val_ce is not None:
        parts.append(f"val CE {val_ce:.4f}")
    if trainer.sparse:
        parts.append("L0 per layer " + ", ".join(
            "n/a" if v is None else f"{v:.1f}" for v in record["l0"]) + f" of {n} in training"
            + (f" (mean density {100 * record['mean_density']:.2f}%)"
               if record["mean_density"] is not None else ""))
        parts.append("dead units per layer " + (
            "n/a (no window closed)" if record["dead"][0] is None else
            ", ".join(str(d) for d in record["dead"])
            + f" (over {trainer.args.dead_window:,} training tokens)"))
        if any(r is not None for r in record["sparse_rows"]):
            parts.append("twell ran sparse for " + ", ".join(
                "n/a" if r is None else f"{100 * r:.0f}%" for r in record["sparse_rows"])
                + " of training rows")
        if any(r is not None for r in record.get("val_ran_dense") or []):
            parts.append("inference ran " + ", ".join(
                "n/a" if r is None else "sparse" if r == 0 else "dense" if r == 1 else "mixed"
                for r in record["val_ran_dense"]))
    else:
        parts.append(f"L0 per layer n/a ({trainer.args.activation}, dense MLPs)")
    if record["silent"]:
        parts.append("SILENT layers (density 0): " + ", ".join(record["silent"]))
    rate = record["tokens_per_s"]
    parts.append(f"{rate:,.0f} tokens/s" if rate else "n/a tokens/s")
    return ", ".join(parts)


def _layer_report(trainer, record):
    """The per-layer table and warnings of a record (twell.train.report); [] without twell
    layers."""
    if not trainer.sparse:
        return []
    names, n = trainer.monitor.names, trainer.shape["intermediate"]
    window = trainer.args.dead_window if trainer.monitor.tracker is not None else None
    return layer_table(names, n, record) + layer_warnings(names, n, record, window)


class Diverged(RuntimeError):
    """The loss or the gradient norm of a step is not finite."""


def run(args, start_time=None):
    """Trains as the parsed command line says; returns the last log record."""
    trainer = Trainer(args, start_time)
    bar = Progress(args.steps, enabled=not args.no_progress)
    say = bar.write
    try:
        resume = args.resume and checkpoint.find(trainer.out) is not None
    except InputError as e:
        raise e.within("--resume") from None
    if resume:
        checkpoint.load(trainer, say)
        trainer._write({"kind": "resume", "step": trainer.step, "tokens": trainer.tokens})
        say(f"twell.train: resumed {trainer.ckpt_path} at step {trainer.step}")
    else:
        if os.path.exists(trainer.log_path):
            os.remove(trainer.log_path)
        trainer._write(trainer.config_record())
    print(f"twell.train: {trainer.data.describe()}; {args.model} "
          f"{trainer.params_total / 1e6:.1f}M parameters ({trainer.params_body / 1e6:.1f}M "
          f"non-embedding), {args.activation}"
          + (f" (twell, L1 {args.l1:g})" if trainer.sparse else " (unpatched)")
          + f", {trainer.device.type} {trainer.precision}, {trainer.tokens_per_step:,} tokens "
          f"per step, out {args.out}", flush=True)
    bar.start(trainer.step)
    record, val_ce, reason = None, None, "done"
    if trainer.step >= args.steps:
        say(f"twell.train: already at step {trainer.step} of {args.steps}")
        reason = "already done"
    trainer._reset_interval()
    first, warned_window = True, 0
    while trainer.step < args.steps:
        eval_next = args.eval_every and (trainer.step + 1) % args.eval_every == 0
        if trainer.out_of_time(eval_next):
            reason = "time budget"
            break
        if args.stop_at is not None and trainer.step >= args.stop_at:
            reason = "stop-at"
            break
        trainer.train_step()
        if first:  # a first estimate for the budget (includes plan creation: generous)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize(trainer.device)
            trainer.step_time = time.monotonic() - trainer.interval_start
            first = False
        val = None
        last = trainer.step == args.steps
        if (args.eval_every and trainer.step % args.eval_every == 0) or last:
            val = trainer.evaluate()
            val_ce = val[0]
        if trainer.step % args.log_every == 0 or val is not None or last:
            record = trainer.log(val)
            bar.update(trainer.step, record)
            if not all(math.isfinite(record[k]) for k in ("train_ce", "grad_norm")
                       if record[k] is not None):
                reason = "diverged"
                break
            if val is not None and not last:
                for line in _layer_report(trainer, record):
                    say(line)
            if record["silent"] and val is None:  # else the table's warnings say it
                say(f"WARNING: step {trainer.step}: silent layers (density 0, no unit active "
                    f"for any token): {', '.join(record['silent'])}")
            if record["reinit"] is None and trainer.monitor.dead_windows > warned_window:
                warned_window = trainer.monitor.dead_windows
                mostly = [f"{n} {100 * f:.0f}%" for n, f in zip(trainer.monitor.names,
                                                                 record["dead_fraction"])
                          if f is not None and f > 0.5]
                if mostly:
                    say(f"WARNING: step {trainer.step}: over half the units dead (over "
                        f"{args.dead_window} tokens): {', '.join(mostly)}")
        else:
            bar.update(trainer.step, None)
        if args.ckpt_every and trainer.step % args.ckpt_every == 0 and not last:
            checkpoint.save(trainer)
    if trainer.acc["steps"] and reason != "diverged":  # a partial interval before a stop
        val = None
        if reason == "time budget" and trainer.eval_time is not None and not trainer.out_of_time(
                True):
            val = trainer.evaluate()
            val_ce = val[0]
        record = trainer.log(val)
        bar.update(trainer.step, record)
    bar.close()
    if reason not in ("already done", "diverged"):  # a diverged model keeps the last checkpoint
        checkpoint.save(trainer)
    trainer._write({"kind": "end", "step": trainer.step, "tokens": trainer.tokens,
                    "reason": reason, "elapsed_s": round(time.monotonic() - trainer.start_time, 3)})
    if reason == "diverged":
        trainer.monitor.remove()
        raise Diverged(f"twell.train: training diverged: the loss or gradient norm is not finite "
                       f"at step {trainer.step} (see {trainer.log_path}); expected a run with "
                       f"finite values: lower --lr (now {args.lr:g}) or --l1 (now {args.l1:g}), "
                       f"or check the data")
    if reason in ("time budget", "stop-at"):
        print(f"twell.train: stopped at step {trainer.step} of {args.steps} ({reason}); the "
              f"checkpoint is {trainer.ckpt_path}: the same command with --resume continues",
              flush=True)
    if record is None:
        record = _last_record(trainer.log_path)
        val_ce = record.get("val_ce") if record else None
    if record is not None:
        for line in _layer_report(trainer, record):
            print(line, flush=True)
        print(_summary(trainer, record, val_ce), flush=True)
    trainer.monitor.remove()
    return record


def _last_record(path):
    rec = None
    for r in files.json_records(files.read_text(path, f"--out {path}")):
        if r.get("kind") == "log":
            rec = r
    return rec
