"""DDP and FSDP2 over twell modules (2 processes, gloo on the CPU; DDP over NCCL on 2 GPUs where
there are two) give the gradients of single-process training on the whole batch."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import dist_worker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(mode, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py"), str(r), mode,
                               str(tmp_path / "init"), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(dist_worker.WORLD)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], "\n".join(outputs)


def check_grads(tmp_path, want=None, rtol=1e-5, atol=1e-6):
    want = dist_worker.reference_grads() if want is None else want
    for r in range(dist_worker.WORLD):
        got = torch.load(tmp_path / f"rank{r}.pt")
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=rtol, atol=atol, msg=name)


def test_ddp_gradients_equal_single_process(tmp_path):
    codes, log = run_ranks("ddp", tmp_path)
    assert codes == [0, 0], log
    check_grads(tmp_path)


def test_fsdp2_gradients_equal_single_process(tmp_path):
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip("this PyTorch has no torch.distributed.fsdp.fully_shard (FSDP2)")
    codes, log = run_ranks("fsdp", tmp_path)
    assert codes == [0, 0], log
    check_grads(tmp_path)


def test_ddp_nccl_gradients_equal_single_process(tmp_path):
    if torch.cuda.device_count() < dist_worker.WORLD or not dist.is_nccl_available():
        pytest.skip(f"DDP over NCCL needs {dist_worker.WORLD} CUDA devices and NCCL")
    codes, log = run_ranks("ddp_nccl", tmp_path)
    assert codes == [0, 0], log
    # bfloat16 gradients: the all-reduce (sum of two half-batch means) and the one-process mean
    # round differently, by a few bf16 units in the last place.
    check_grads(tmp_path, dist_worker.reference_grads("cuda", torch.bfloat16), rtol=3e-2, atol=3e-3)
