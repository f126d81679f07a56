"""python -m twell.train under torchrun (--dist ddp / fsdp2, twell.train.distributed).

On the CPU (gloo, 2 processes, the tiny model in fp32, gradient accumulation, an L1 strong enough
that units die and are re-initialised): DDP and FSDP2 give one process's losses, validation CE,
densities, dead units and re-initialisations step for step; a run stopped and resumed continues
exactly, on 2 processes or on 1 (a checkpoint holds the global state). The argument checks (exit
2, one line). Over NCCL on 2 GPUs, where there are (scripts/gpu-check's dist part runs them): DDP
and FSDP2 track one process within bf16's tolerance, and an FSDP2 checkpoint (bf16 weights, fp32
master weights, as one process's) resumes under DDP.
"""
import json
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import twell  # noqa: E402
from twell.train import data as td  # noqa: E402
from twell.train.cli import main  # noqa: E402

# 8 sequences of 32 tokens a step (2 micro-batches of 4), windows of 512 tokens closing every 2
# steps (mid-window at step 5), re-initialisation at step 8; 3 validation windows one at a time
# (rank 0 runs 2 batches, rank 1 one: under FSDP2 it repeats one, uncounted).
ARGS = ["--model", "tiny", "--data", "synthetic", "--steps", "10", "--batch-size", "4",
        "--seq-len", "32", "--grad-accum", "2", "--log-every", "1", "--eval-every", "5",
        "--eval-batches", "3", "--eval-batch-size", "1", "--dead-window", "512",
        "--reinit-dead-every", "2", "--lr", "1e-2", "--l1", "0.3", "--no-progress"]
CPU = ["--device", "cpu"]
LAUNCH_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": "29500"}


def _records(out, kind="log"):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def torchrun(out, *extra, args=ARGS + CPU, nproc=2, timeout=300):
    """python -m torch.distributed.run --standalone of twell.train; the log records."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(twell.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([package, os.environ.get("PYTHONPATH", "")]))
    for k in LAUNCH_ENV:
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), "-m", "twell.train", *args, "--out", str(out), *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}"
    return p


def same_run(a, b, rel=1e-4, figures_rel=1e-5):
    """Log records a and b (one per step) of one run: equal within `rel` (fp32 rounding of
    another reduction order, and of OpenBLAS's vector kernels, whose blocking follows each
    process's rows, grown over the steps), integer figures equal."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        where = f"step {ra['step']}"
        for key in ("train_ce", "val_ce", "l1_term", "grad_norm", "lr", "tokens", "val_tokens"):
            if ra[key] is None:
                assert rb[key] is None, (where, key)
            else:
                assert rb[key] == pytest.approx(ra[key], rel=rel, abs=1e-7), (where, key)
        for key in ("density", "val_density"):
            if ra[key] is None:
                assert rb[key] is None, (where, key)
            else:
                # a few activations may land on the other side of the ReLU's kink (rounding)
                assert rb[key] == pytest.approx(ra[key], rel=figures_rel, abs=1e-4), (where, key)
        for key in ("dead", "reinit", "val_dead", "dead_windows", "silent"):
            assert rb[key] == ra[key], (where, key)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: the same run in one process."""
    out = tmp_path_factory.mktemp("one") / "run"
    main(ARGS + CPU + ["--out", str(out)])
    logs = _records(out)
    # the case exercises what it should: units died and were re-initialised, validation ran
    assert any(r["reinit"] and any(r["reinit"].values()) for r in logs), logs
    assert [r["step"] for r in logs if r["val_ce"] is not None] == [5, 10]
    assert {r["val_tokens"] for r in logs if r["val_ce"] is not None} == {3 * 32}
    return logs


# ---- data ----------------------------------------------------------------------------------

def test_ranks_take_slices_of_one_process_batches():
    tokens = np.arange(20_000, dtype=np.uint16)
    whole = td.RandomWindows(tokens, 8, 16, seed=5)
    parts = [td.RandomWindows(tokens, 8, 16, seed=5, part=r, parts=4) for r in range(4)]
    for index in range(3):
        assert np.array_equal(np.concatenate([p.batch(index) for p in parts]),
                              whole.batch(index))
    assert parts[3].state_dict() == whole.state_dict()  # the position is global
    with pytest.raises(ValueError, match="dividing the batch size"):
        td.RandomWindows(tokens, 6, 16, part=0, parts=4)
    data = td.TokenData(tokens, tokens[:1000], 20_000)
    one = [s for b in data.val_starts(3, 16, max_batches=2) for s in b]
    for n in (2, 3, 4):
        dealt = [data.val_starts(3, 16, max_batches=2, part=r, parts=n) for r in range(n)]
        starts = [s for d in dealt for b in d for s in b]
        assert sorted(starts) == sorted(one)  # every window once, none twice
        assert all(len(b) <= -(-3 // n) for d in dealt for b in d)
        batches = data.val_batches(3, 16, max_batches=2, part=1, parts=n)
        assert [b[:, 0].tolist() for b in batches] == dealt[1]


# ---- argument checks -----------------------------------------------------------------------

def _exit_line(capsys, argv, env, monkeypatch):
    for k in LAUNCH_ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err


def test_dist_without_torchrun_exits_2(capsys, monkeypatch, tmp_path):
    err = _exit_line(capsys, ARGS + CPU + ["--dist", "ddp", "--out", str(tmp_path)], {},
                     monkeypatch)
    assert err.startswith("twell.train: --dist: expected a launch by torchrun") and \
        "got ddp with no RANK in the environment" in err


def test_batch_not_divisible_by_world_exits_2(capsys, monkeypatch, tmp_path):
    argv = ARGS + CPU + ["--dist", "fsdp2", "--batch-size", "3", "--out", str(tmp_path)]
    err = _exit_line(capsys, argv, LAUNCH_ENV, monkeypatch)
    assert err.startswith("twell.train: --batch-size: expected a multiple of the world size 2")
    assert err.rstrip().endswith("got 3")


def test_one_process_mode_under_a_launch_exits_2(capsys, monkeypatch, tmp_path):
    err = _exit_line(capsys, ARGS + CPU + ["--out", str(tmp_path)], LAUNCH_ENV, monkeypatch)
    assert err.startswith("twell.train: --dist: expected ddp or fsdp2 in a launch of WORLD_SIZE 2")


def test_dist_device_index_exits_2(capsys, monkeypatch, tmp_path):
    argv = ARGS + ["--device", "cuda:1", "--dist", "ddp", "--out", str(tmp_path)]
    err = _exit_line(capsys, argv, LAUNCH_ENV, monkeypatch)
    assert err.startswith("twell.train: --device: expected auto, cpu or cuda under --dist")


def test_checkpoint_older_than_dist_resumes_without_a_warning_for_it(tmp_path, capsys):
    out = tmp_path / "old"
    short = [a if a != "10" else "2" for a in ARGS] + CPU + ["--out", str(out)]
    main(short)
    path = out / "checkpoint" / "state.json"
    state = json.load(open(path))
    for k in ("dist", "no_checkpoint"):  # as a twell before --dist wrote it
        del state["args"][k]
    json.dump(state, open(path, "w"))
    capsys.readouterr()
    main(short[:short.index("--steps") + 1] + ["3"] + short[short.index("--steps") + 2:]
         + ["--resume"])
    err = capsys.readouterr().err
    assert "resuming with changed --steps 2 -> 3" in err and "--dist" not in err, err


# ---- gloo, 2 processes ---------------------------------------------------------------------

def test_ddp_matches_one_process(one_process, tmp_path):
    out = tmp_path / "ddp"
    p = torchrun(out, "--dist", "ddp")
    same_run(one_process, _records(out))
    config = _records(out, "config")[0]
    assert config["dist"] == {"mode": "ddp", "world_size": 2, "backend": "gloo"}
    assert config["tokens_per_step"] == 4 * 32 * 2
    # rank 0 alone prints: one summary line
    assert p.stdout.count("final: loss") == 1, p.stdout
    assert _records(out, "end")[0]["reason"] == "done"


def test_fsdp2_stops_and_resumes_as_one_process(one_process, tmp_path):
    pytest.importorskip("torch.distributed.fsdp", reason="no torch.distributed.fsdp")
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2)

    out = tmp_path / "fsdp2"
    torchrun(out, "--dist", "fsdp2", "--stop-at", "5")
    assert _records(out, "end")[0]["reason"] == "stop-at"
    # the checkpoint is one process's: whole tensors, the sampler's global position
    state = json.load(open(out / "checkpoint" / "state.json"))
    assert state["sampler"] == {"position": 10, "seed": 0, "rank": 0, "world_size": 1}
    assert state["monitor"]["tracker"]["tokens"] == {"model.layers.0.mlp": 256,
                                                     "model.layers.1.mlp": 256}
    torchrun(out, "--dist", "fsdp2", "--resume")
    same_run(one_process, _records(out))
    assert [r["step"] for r in _records(out, "resume")] == [5]


def test_ddp_checkpoint_resumes_on_one_process(one_process, tmp_path, capsys):
    out = tmp_path / "ddp-to-one"
    torchrun(out, "--dist", "ddp", "--stop-at", "5")
    main(ARGS + CPU + ["--out", str(out), "--resume"])
    assert "resuming with changed --dist 'ddp' -> 'none'" in capsys.readouterr().err
    same_run(one_process, _records(out))


def test_fsdp2_bf16_checkpoint_is_one_process_and_resumes_on_one(tmp_path):
    """bf16 on the CPU: FSDP2's fp32 shards (the master weights) gathered as bf16 for compute,
    gradients reduced in fp32; its checkpoint holds bf16 weights and fp32 master weights, as one
    process's, and resumes there; the losses track one process's within bf16's rounding."""
    pytest.importorskip("torch.distributed.fsdp", reason="no torch.distributed.fsdp")
    # Gentler than ARGS: bf16 rounding of another order (and of another thread count) must not
    # flip a unit's death and send the runs apart.
    gentle = {"--lr": "3e-3", "--l1": "1e-3", "--reinit-dead-every": "0"}
    bf16 = [gentle.get(prev, a) for prev, a in zip([None] + ARGS, ARGS)] + CPU + [
        "--precision", "bf16"]
    one = tmp_path / "one"
    main(bf16 + ["--out", str(one)])
    out = tmp_path / "fsdp2"
    torchrun(out, "--dist", "fsdp2", "--stop-at", "5", args=bf16)
    from safetensors import safe_open
    with safe_open(str(out / "checkpoint" / "tensors.safetensors"), "pt") as f:
        dtypes = {(k.split("/")[0], f.get_slice(k).get_dtype()) for k in f.keys()
                  if k.startswith(("model/", "master/"))}
    assert dtypes == {("model", "BF16"), ("master", "F32")}, dtypes
    main(bf16 + ["--out", str(out), "--resume"])
    a, b = _records(one), _records(out)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert b[0]["train_ce"] == pytest.approx(a[0]["train_ce"], rel=1e-4)  # the same bf16 weights
    for ra, rb in zip(a, b):
        for key in ("train_ce", "val_ce"):
            if ra[key] is not None:
                assert rb[key] == pytest.approx(ra[key], rel=2e-2), (ra["step"], key)


# ---- NCCL, 2 GPUs --------------------------------------------------------------------------

GPU_ARGS = ["--model", "tiny", "--hidden", "256", "--intermediate", "1024", "--data",
            "synthetic", "--steps", "6", "--batch-size", "8", "--seq-len", "64", "--log-every",
            "1", "--eval-every", "3", "--eval-batches", "2", "--dead-window", "4096", "--lr",
            "3e-3", "--l1", "1e-3", "--no-progress", "--device", "cuda"]


def _nccl_or_skip():
    if torch.cuda.device_count() < 2 or not dist.is_nccl_available():
        pytest.skip("NCCL tests need 2 CUDA devices and NCCL "
                    f"({torch.cuda.device_count()} devices here)")
    if not twell.cuda_compiled():
        pytest.skip("twell is built without CUDA")


def _close(a, b, rel):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("train_ce", "val_ce"):
            if ra[key] is not None:
                assert rb[key] == pytest.approx(ra[key], rel=rel), (ra["step"], key)
        assert rb["density"] == pytest.approx(ra["density"], abs=0.02), ra["step"]


def test_nccl_ddp_and_fsdp2_track_one_process(tmp_path):
    """bf16 (fp32 master weights; FSDP2: its fp32 shards, bf16 compute, fp32 reduction): the
    two-rank runs track one process within bf16's rounding, the checkpoint of an FSDP2 run is one
    process's (bf16 weights, fp32 master weights) and resumes under DDP."""
    _nccl_or_skip()
    package = os.path.dirname(os.path.dirname(os.path.abspath(twell.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package, os.environ.get("PYTHONPATH",
                                                                                "")]))
    one = tmp_path / "one"
    p = subprocess.run([sys.executable, "-m", "twell.train", *GPU_ARGS, "--out", str(one)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    ref = _records(one)
    ddp = tmp_path / "ddp"
    torchrun(ddp, "--dist", "ddp", args=GPU_ARGS)
    _close(ref, _records(ddp), rel=2e-2)
    assert _records(ddp, "config")[0]["dist"]["backend"] == "nccl"
    peaks = _records(ddp, "end")[0]["peak_bytes"]
    assert len(peaks) == 2 and all(b > 0 for b in peaks)

    fsdp = tmp_path / "fsdp2"
    torchrun(fsdp, "--dist", "fsdp2", "--stop-at", "3", args=GPU_ARGS)
    from safetensors import safe_open
    with safe_open(str(fsdp / "checkpoint" / "tensors.safetensors"), "pt") as f:
        dtypes = {k.split("/")[0]: f.get_slice(k).get_dtype() for k in f.keys()
                  if k.startswith(("model/", "master/"))}
    assert dtypes == {"model": "BF16", "master": "F32"}, dtypes
    torchrun(fsdp, "--dist", "ddp", "--resume", args=GPU_ARGS)
    _close(ref, _records(fsdp), rel=2e-2)
