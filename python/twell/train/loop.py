"""The training loop of twell.train: a LlamaForCausalLM with twell ReLU FFNs (or its SiLU
baseline), next-token cross-entropy plus twell's L1 term, AdamW with warm-up and cosine decay,
gradient accumulation, periodic validation, checkpoints that resume exactly, a JSONL log and a
time budget. `run(args)` takes the parsed command line of twell.train.cli.

Precision: float32 on the CPU; on CUDA, bfloat16 parameters (the twell CUDA kernels run bf16)
under bf16 autocast, with float32 master weights in the optimizer (gradients accumulate there in
float32, the updated weights are copied back to the bf16 parameters in place, so twell's plans
stay valid).

Several processes (--dist ddp|fsdp2 under torchrun, twell.train.distributed): each rank takes its
slice of every global batch; DDP averages gradients in backward (every micro-batch where fp32
master weights take them, else on the last one: no_sync before), FSDP2 shards parameters,
gradients and AdamW state (its fp32 shards are the master weights: bf16 compute, fp32 gradient
reduction); the log, validation and sparsity figures are reduced over ranks and rank 0 writes
them and the checkpoints.
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
from twell.torch.tracker import HOT_FRACTIONS
from twell.train import checkpoint, distributed, files, models, report, units
from twell.train import data as data_mod
from twell.train.files import InputError
from twell.train.progress import Progress
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
    def __init__(self, args, start_time=None, prepare=None):
        """prepare: called with the trainer once its model is built, patched and on its device
        in its dtype, before FSDP2 shards or DDP wraps it (bench/distributed.py calibrates the
        gates there)."""
        self.args = a = args
        self.start_time = start_time or time.monotonic()
        self.deadline = (self.start_time + a.max_minutes * 60) if a.max_minutes else None
        self.dist, self.device = distributed.setup(a, resolve_device)
        self.fsdp = self.dist.mode == "fsdp2"
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
        if prepare is not None:
            prepare(self)
        # bf16 weights beside fp32 master weights: the optimizer's copies (one process, DDP), or
        # FSDP2's fp32 shards gathered as bf16 for compute (from the same bf16-rounded start).
        self.keeps_master = self.dtype != torch.float32
        if self.fsdp:
            if self.keeps_master:
                with torch.no_grad():
                    for p in self.model.parameters():
                        p.data = p.data.float()
            distributed.shard_model(self.model, self.dist, self.dtype)

        params = [p for p in self.model.parameters() if p.requires_grad]
        self.params = params
        self.master = ([p.detach().float().clone() for p in params]
                       if self.keeps_master and not self.fsdp else None)
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
        self.engine = self.model  # what training forwards run through
        if self.dist.mode == "ddp":
            self.engine = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if cuda else None,
                broadcast_buffers=False)

        # Rank r of n: its rows of every global batch, its share of the validation windows.
        part, parts = self.dist.rank, self.dist.world
        eval_batch = a.eval_batch_size or a.batch_size
        self.sampler = self.data.sampler(a.batch_size, a.seq_len, seed=a.seed, part=part,
                                         parts=parts)
        self.val = self.data.val_batches(eval_batch, a.seq_len, max_batches=a.eval_batches,
                                         part=part, parts=parts)
        self.val_sources = self.data.val_source_ids(eval_batch, a.seq_len,
                                                    max_batches=a.eval_batches, part=part,
                                                    parts=parts)
        # FSDP2 gathers weights in every forward: every rank runs as many validation forwards
        # (a rank with fewer windows repeats one, uncounted).
        self.val_rounds = max(len(self.data.val_starts(eval_batch, a.seq_len,
                                                       max_batches=a.eval_batches, part=p,
                                                       parts=parts))
                              for p in range(parts)) if self.fsdp else len(self.val)
        if a.hot_units >= self.shape["intermediate"]:
            raise InputError("--hot-units", f"fewer than the model's {self.shape['intermediate']} "
                             "units a layer (at least one stays sparse)", a.hot_units)
        self.monitor = LayerMonitor(self.model, a.dead_window, track_dead=not a.no_dead_tracking,
                                    group=self.dist)
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
        if a.dist == "fsdp2":
            weights //= self.dist.world  # sharded (a lower bound still)
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
        for micro in range(a.grad_accum):
            batch = torch.from_numpy(next(self.sampler)).to(self.device, non_blocking=True)
            inputs, targets = batch[:, :-1], batch[:, 1:]
            with self._gradient_sync(micro == a.grad_accum - 1):
                with self.autocast:
                    logits = self.engine(input_ids=inputs, use_cache=False).logits
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
            norm = distributed.full(torch.nn.utils.clip_grad_norm_(self.opt_params, a.clip))
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
            units.close_window(self)

    def _gradient_sync(self, last):
        """The context of a micro-batch's forward and backward: gradients reduced over ranks on
        the last micro-batch of a step only (DDP's no_sync before; FSDP2's
        set_requires_gradient_sync), except under DDP with master weights, which take each
        micro-batch's reduced gradients (the accumulation stays in fp32, as in one process)."""
        if self.dist.mode == "ddp" and not last and self.master is None:
            return self.engine.no_sync()
        if self.fsdp and self.args.grad_accum > 1:
            self.engine.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    @torch.no_grad()
    def evaluate(self):
        t = time.monotonic()
        self.model.eval()  # through the model itself: no DDP hook (ranks may run fewer batches)
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
        for _ in range(self.val_rounds - len(self.val)):  # FSDP2: as many forwards as rank 0
            spare = self.val[0] if self.val else self.data.val_batches(
                1, self.args.seq_len, max_batches=1)[0]
            with self.monitor.muted(), self.autocast:
                self.model(input_ids=torch.from_numpy(spare[:, :-1]).to(self.device),
                           use_cache=False)
        figures = self.monitor.collect("eval")
        self.monitor.set_training(True)
        self.model.train()
        self.dist.sum_(total)
        self.dist.sum_(count)
        totals, counts = total.tolist(), count.tolist()
        val_ce = sum(totals) / sum(counts)
        figures["ce_sources"] = {n: t / c for n, t, c in zip(names, totals, counts) if c}
        self.eval_time = time.monotonic() - t
        self.paused_s += self.eval_time
        return val_ce, figures

    # ---- log -------------------------------------------------------------------------------

    def _write(self, record):
        if not self.dist.main:
            return
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
        micro = max(acc["micro"], 1) * self.dist.world  # the mean over ranks too
        coef = self.coef
        ce, l1 = self.dist.sum_(torch.stack([acc["ce"].float(), acc["l1"].float()])).tolist()
        l1_term = l1 / micro if acc["micro"] else None
        silent = [n for n, d in zip(self.monitor.names, density) if d == 0.0]
        record = {
            "kind": "log",
            "step": self.step,
            "tokens": self.tokens,
            "lr": self.scheduler.get_last_lr()[0],
            "l1_coef": coef if self.sparse else None,
            "train_ce": ce / micro if acc["micro"] else None,
            "l1_term": l1_term if self.sparse else None,
            "l1_value": l1_term / coef if self.sparse and coef and l1_term is not None else None,
            "val_ce": val[0] if val else None,
            "val_ce_sources": val[1]["ce_sources"] or None if val else None,
            "val_density": val[1]["density"] if val else None,
            "val_dead": val[1]["dead"] if val else None,
            "val_hot_share": val[1]["hot_share"] if val else None,
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
            "hot_share": list(self.monitor.hot_share),
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
        would not end before the deadline (rank 0's clock decides for every rank)."""
        if self.deadline is None:
            return False
        return self.dist.decide(self._out_of_time(eval_next))

    def _out_of_time(self, eval_next):
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
            "hot_fractions": list(HOT_FRACTIONS),
            "device": dev, "precision": self.precision,
            "dist": {"mode": self.dist.mode, "world_size": self.dist.world,
                     "backend": self.dist.backend},
            "tokens_per_step": self.tokens_per_step,
            "data": meta,
            "train_tokens": len(self.data.train), "val_tokens": len(self.data.val),
            "versions": {"twell": twell.version(), "torch": torch.__version__,
                         "transformers": __import__("transformers").__version__},
        }


class Diverged(RuntimeError):
    """The loss or the gradient norm of a step is not finite."""


def peak_bytes(trainer):
    """torch.cuda.max_memory_allocated of every rank (CUDA), else None."""
    if trainer.device.type != "cuda":
        return None
    return trainer.dist.gather(torch.cuda.max_memory_allocated(trainer.device))


def run(args, start_time=None, prepare=None):
    """Trains as the parsed command line says; returns the last log record (on every rank;
    ranks other than 0 write and print nothing). prepare: see Trainer."""
    ok = False
    try:
        trainer = Trainer(args, start_time, prepare)
        try:
            record = _run(trainer, args)
            ok = True
        except Diverged:
            ok = True  # every rank saw the same record
            raise
        finally:
            trainer.monitor.remove()
    finally:
        distributed.shutdown(ok)
    return record


def _run(trainer, args):
    main = trainer.dist.main
    bar = Progress(args.steps, enabled=not args.no_progress and main)
    say = bar.write if main else (lambda text: None)
    out = print if main else (lambda *a, **k: None)
    try:
        resume = args.resume and checkpoint.find(trainer.out) is not None
    except InputError as e:
        raise e.within("--resume") from None
    if resume:
        checkpoint.load(trainer, say)
        trainer._write({"kind": "resume", "step": trainer.step, "tokens": trainer.tokens})
        say(f"twell.train: resumed {trainer.ckpt_path} at step {trainer.step}")
    else:
        if main and os.path.exists(trainer.log_path):
            os.remove(trainer.log_path)
        trainer._write(trainer.config_record())
    ranks = trainer.dist
    out(f"twell.train: {trainer.data.describe()}; {args.model} "
          f"{trainer.params_total / 1e6:.1f}M parameters ({trainer.params_body / 1e6:.1f}M "
          f"non-embedding), {args.activation}"
          + (f" (twell, L1 {args.l1:g})" if trainer.sparse else " (unpatched)")
          + f", {trainer.device.type} {trainer.precision}, {trainer.tokens_per_step:,} tokens "
          f"per step" + (f" ({ranks.mode} over {ranks.world} ranks, {ranks.backend})"
                         if ranks.mode != "none" else "") + f", out {args.out}", flush=True)
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
                for line in report.layer_report(trainer, record):
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
        if (args.ckpt_every and trainer.step % args.ckpt_every == 0 and not last
                and not args.no_checkpoint):
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
    # A diverged model keeps the last checkpoint.
    if reason not in ("already done", "diverged") and not args.no_checkpoint:
        checkpoint.save(trainer)
    trainer._write({"kind": "end", "step": trainer.step, "tokens": trainer.tokens,
                    "reason": reason, "elapsed_s": round(time.monotonic() - trainer.start_time, 3),
                    "peak_bytes": peak_bytes(trainer)})
    if reason == "diverged":
        raise Diverged(f"twell.train: training diverged: the loss or gradient norm is not finite "
                       f"at step {trainer.step} (see {trainer.log_path}); expected a run with "
                       f"finite values: lower --lr (now {args.lr:g}) or --l1 (now {args.l1:g}), "
                       f"or check the data")
    if reason in ("time budget", "stop-at") and not args.no_checkpoint:
        out(f"twell.train: stopped at step {trainer.step} of {args.steps} ({reason}); the "
              f"checkpoint is {trainer.ckpt_path}: the same command with --resume continues",
              flush=True)
    if record is None and main:
        record = report.last_record(trainer.log_path)
        val_ce = record.get("val_ce") if record else None
    if record is not None:
        for line in report.layer_report(trainer, record):
            out(line, flush=True)
        out(report.summary_line(trainer, record, val_ce), flush=True)
    return record
