"""bench/distributed.py (suite "distributed"): its cases, commands and derived fields, without
running them (a run of the harness on the CPU: its docstring's second command)."""
import bench_scripts

bench = bench_scripts.load("distributed")


def test_cases_and_commands():
    args = bench.parse_args(["--gpus", "2,4", "--device", "cuda", "--out", "x"])
    todo = bench.cases(args)
    assert todo[:3] == [("dense", None, 1, "none"), ("twell", "init", 1, "none"),
                        ("twell", "sparse", 1, "none")]
    assert len(todo) == 3 + 2 * 2 * 3 and todo[3] == ("dense", None, 2, "ddp")
    cmd = bench.command(args, ("twell", "sparse", 4, "fsdp2"), "run")
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    assert cmd[6].endswith("bench/distributed.py")
    assert cmd[7:10] == ["--worker", "0.005", "--"]
    flags = dict(zip(cmd, cmd[1:]))
    assert flags["--batch-size"] == "64" and flags["--dist"] == "fsdp2"
    assert flags["--lr"] == "1e-06" and flags["--activation"] == "relu"
    assert "--no-checkpoint" in cmd and "--no-dead-tracking" in cmd
    one = bench.command(args, ("dense", None, 1, "none"), "run")
    assert one[1:3] == ["-m", "twell.train"] and "--dist" not in one
    assert dict(zip(one, one[1:]))["--activation"] == "relu-torch"


def test_derived_fields():
    def row(mlp, regime, gpus, engine, tps):
        return {"mlp": mlp, "regime": regime, "gpus": gpus, "engine": engine,
                "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / gpus}
    rows = bench.derive([row("dense", None, 1, "none", 100.0), row("twell", "init", 1, "none", 98.0),
                         row("dense", None, 2, "ddp", 190.0), row("twell", "init", 2, "ddp", 180.0)])
    assert rows[1]["speedup"] == 0.98 and rows[0]["speedup"] is None
    assert rows[2]["scaling_efficiency"] == 0.95
    assert rows[3]["scaling_efficiency"] == 90 / 98 and rows[3]["speedup"] == 180 / 190
    assert bench.slug("NVIDIA H200") == "h200" and bench.slug("Intel(R) Xeon(R)") == "cpu"
