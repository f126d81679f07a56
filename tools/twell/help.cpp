#include "help.hpp"

namespace twell::cli {

const char* const kGlobalHelp = R"(twell - exact activation-sparse FFN layers (TwELL format)

usage: twell <command> [options]
       twell <command> --help        that command's options

commands:
  bench   time dense (BLAS/cuBLAS) vs twell on a suite of FFN problems; writes JSON + CSV
  check   quick conformance run of every pattern and dtype against the fp64 oracle
  info    build, backends and devices

Arguments and input files are checked before any work: a bad one exits with status 2 and one
line on stderr naming it and what it expects.
)";

const char* const kBenchHelp = R"(usage: twell bench [options]

Times dense (BLAS/cuBLAS) vs twell on a suite of FFN problems and writes OUT/NAME.json and
OUT/NAME.csv: NAME is the suite's name, or for a custom case the suite and the case's parameters
(e.g. custom-gated-bfloat16-m256-k2048-n5632-heavy_tailed-d0.005), so that no case overwrites
another's results.

options:
  --suite NAME      default | cpu | inference | decode | training | custom | real
                    (default: default; real: the layers of --from)
                    decode: M = 1..4096 at K = 2048, N = 5632, 0.5-2%; each sample replays a
                    CUDA graph of 8 calls on 8 weight copies (a decoding step) and counts per call
                    training: gated bf16 M = 16384..262144, K = 2048, N = 5632 on CUDA (a small
                    float32 case on CPU); dense = cuBLAS GEMMs + elementwise kernels; reports
                    step time, bytes saved for backward, peak bytes, twell vs dense difference
  --backend NAME    auto | cpu | cuda   (auto: CUDA when a GPU is present)   (default: auto)
  --from DIR        the real suite: each layer of a capture folder (`python -m twell.capture`:
                    layer<i>.x/gate/up/down.npy) with the model's own weights and activations;
                    inference rows (real.json) and training steps (real_training.json, dy random);
                    every layer's files are checked before the first one runs
  --rows N          --from: the first N rows of each layer's x (default: all)
  --m M --k K --n N shape of a custom case (implies --suite custom; with --suite training or
                    decode: one case of these parameters, timed as that suite times its own)
  --density D       mean fraction of active neurons of a custom case (default 0.005)
  --pattern P       uniform | heavy_tailed | trained_like | edge_rows | all_zero | all_dense
                    (default heavy_tailed)
  --dtype T         float32 | bfloat16 | float16   (default: float32 on CPU, bfloat16 on CUDA)
  --kind K          gated | plain   (default gated)
  --gate G          auto | portable: the CUDA gate GEMM + pack (default auto: fused on sm_90a)
  --dispatch D      auto | sparse | dense: the twell job's path (default auto: twell's own
                    dispatch; sparse / dense force one, e.g. to time the path dispatch avoids)
  --reps R          timed repetitions per measurement, median reported (default 10)
  --warmup W        untimed runs first, each after an L2 flush (default 6: automatic dispatch
                    times each path three times)
  --out DIR         results folder, created if needed (default: BUILD/bench-results/<device>,
                    BUILD the build folder this twell runs from, ./bench-results/<device> if
                    installed; the committed results change only with --out bench/results/<device>)
  --no-check        skip the comparison with the fp64 oracle (training: with the dense step)
  --no-write        print only

examples:
  twell bench                                   # hidden 2048, intermediate 5632, 99.5% sparse
  twell bench --suite cpu --backend cpu         # the CPU target table
  twell bench --suite training --out DIR        # DIR/training.json, .csv
  twell bench --m 1 --k 4096 --n 11008 --density 0.01 --pattern uniform
  twell bench --from captures/s30m --rows 16384  # real.json, real_training.json: a row per layer
)";

const char* const kCheckHelp = R"(usage: twell check [--backend NAME]

Runs every FFN kind (gated, plain), dtype (bfloat16, float16; float32 on the CPU), activation
pattern (uniform, heavy_tailed, trained_like, edge_rows, all_zero, all_dense) and dispatch
(sparse, auto) on M = 257, K = 256, N = 1000..1016 and compares twell's output with the fp64
oracle: a line per case, then a summary. Exit status 1 when a case fails.

options:
  --backend NAME    auto | cpu | cuda   (auto: CUDA when a GPU is present)   (default: auto)
)";

const char* const kInfoHelp = R"(usage: twell info

Prints twell's version, the CPU backend (model, threads, BLAS), whether this build has the CUDA
backend, and the CUDA devices it sees. Takes no arguments.
)";

}  // namespace twell::cli
