// The twell command line: bench | check | info.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "harness.hpp"
#include "training.hpp"
#include "twell/twell.hpp"

namespace {

const char* kHelp = R"(twell - exact activation-sparse FFN layers (TwELL format)

usage: twell <command> [options]

commands:
  bench   time dense (BLAS/cuBLAS) vs twell on a suite of FFN problems; writes JSON + CSV
          (--suite training: one forward + backward, time and memory, dense vs twell)
  check   quick conformance run of every pattern and dtype against the fp64 oracle
  info    build, backends and devices

bench options:
  --suite NAME      default | cpu | inference | training | custom   (default: default)
                    training: gated bf16 M = 16384..262144, K = 2048, N = 5632 on CUDA (a small
                    float32 case on CPU); dense = cuBLAS GEMMs + elementwise kernels; reports
                    step time, bytes saved for backward, peak bytes, twell vs dense difference
  --backend NAME    auto | cpu | cuda   (auto: CUDA when a GPU is present)   (default: auto)
  --m M --k K --n N shape of a custom case (implies --suite custom; with --suite training:
                    one training case of these parameters, gated, instead of the suite's)
  --density D       mean fraction of active neurons of a custom case (default 0.005)
  --pattern P       uniform | heavy_tailed | edge_rows | all_zero | all_dense (default heavy_tailed)
  --dtype T         float32 | bfloat16 | float16   (default: float32 on CPU, bfloat16 on CUDA)
  --kind K          gated | plain   (default gated)
  --gate G          auto | portable: the CUDA gate GEMM + pack (default auto: fused on sm_90a)
  --dispatch D      auto | sparse | dense: the twell job's path (default auto: twell's own
                    dispatch; sparse / dense force one, e.g. to time the path dispatch avoids)
  --reps R          timed repetitions per measurement, median reported (default 10)
  --warmup W        untimed runs first (default 4: automatic dispatch times each path twice)
  --out DIR         results folder (default bench/results/<device>)
  --no-check        skip the comparison with the fp64 oracle (training: with the dense step)
  --no-write        print only

examples:
  twell bench                                   # hidden 2048, intermediate 5632, 99.5% sparse
  twell bench --suite cpu --backend cpu         # the CPU target table
  twell bench --suite training --out DIR        # DIR/training.json, .csv
  twell bench --m 1 --k 4096 --n 11008 --density 0.01 --pattern uniform
  twell check --backend cpu
  twell info
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "twell: " << msg << "\n(see twell --help)\n";
  std::exit(2);
}

twell::DType parse_dtype(const std::string& s) {
  for (twell::DType t : {twell::DType::f32, twell::DType::bf16, twell::DType::f16})
    if (s == twell::dtype_name(t)) return t;
  usage_error("unknown dtype '" + s + "' (float32, bfloat16 or float16)");
}

int cmd_info() {
  std::cout << "twell " << twell::version() << "\n"
            << "CPU backend: " << twell::cpu_description() << "\n"
            << "CUDA backend: " << (twell::cuda_compiled() ? "compiled" : "not compiled") << "\n";
  const auto devs = twell::cuda_devices();
  if (devs.empty()) std::cout << "CUDA devices: none\n";
  for (size_t i = 0; i < devs.size(); ++i) std::cout << "cuda:" << i << ": " << devs[i] << "\n";
  return 0;
}

int cmd_bench(const std::vector<std::string>& a) {
  twell::bench::Options o;
  bool write = true, custom = false, dtype_set = false;
  o.custom.m = 256, o.custom.k = 2048, o.custom.n = 5632, o.custom.density = 0.005;
  o.custom.pattern = twell::testing::Pattern::heavy_tailed;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= a.size()) usage_error("option " + a[i] + " needs a value");
      return a[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end) usage_error("option " + a[i - 1] + ": not a number: " + v);
      return d;
    };
    const std::string& f = a[i];
    if (f == "--suite") o.suite = value();
    else if (f == "--backend") o.backend = value();
    else if (f == "--m") o.custom.m = int64_t(number()), custom = true;
    else if (f == "--k") o.custom.k = int64_t(number()), custom = true;
    else if (f == "--n") o.custom.n = int64_t(number()), custom = true;
    else if (f == "--density") o.custom.density = number(), custom = true;
    else if (f == "--pattern") o.custom.pattern = twell::testing::parse_pattern(value()), custom = true;
    else if (f == "--dtype") o.custom.dtype = parse_dtype(value()), dtype_set = custom = true;
    else if (f == "--kind") {
      const std::string k = value();
      if (k != "gated" && k != "plain") usage_error("--kind is gated or plain");
      o.custom.kind = k == "gated" ? twell::FfnKind::gated : twell::FfnKind::plain;
      custom = true;
    } else if (f == "--gate") {
      const std::string g = value();
      if (g != "auto" && g != "portable") usage_error("--gate is auto or portable");
      o.plan.gate = g == "auto" ? twell::GateKernel::automatic : twell::GateKernel::portable;
    } else if (f == "--dispatch") {
      const std::string d = value();
      if (d == "auto") o.dispatch = twell::Dispatch::automatic;
      else if (d == "sparse") o.dispatch = twell::Dispatch::force_sparse;
      else if (d == "dense") o.dispatch = twell::Dispatch::force_dense;
      else usage_error("--dispatch is auto, sparse or dense");
    } else if (f == "--reps") {
      o.reps = int(number());
      if (o.reps < 1) usage_error("--reps must be >= 1");
    } else if (f == "--warmup") {
      o.warmup = int(number());
      if (o.warmup < 0) usage_error("--warmup must be >= 0");
    }
    else if (f == "--out") o.out_dir = value();
    else if (f == "--no-check") o.check = false;
    else if (f == "--no-write") write = false;
    else usage_error("unknown bench option " + f);
  }
  if (custom && o.suite == "training") {
    if (o.custom.kind != twell::FfnKind::gated) usage_error("the training suite runs gated FFNs only");
    o.training_custom = true;  // one training case of these parameters instead of the suite
  } else if (custom) {
    o.suite = "custom";
  }
  const bool cuda = o.backend == "cuda" || (o.backend == "auto" && twell::cuda_device_count() > 0);
  if (!dtype_set) o.custom.dtype = cuda ? twell::DType::bf16 : twell::DType::f32;
  std::cerr << "twell bench: suite " << o.suite << " on " << (cuda ? "CUDA" : "CPU") << "\n";
  if (o.suite == "training") {
    std::vector<std::string> errors;  // failed cases: reported, the others still written
    const auto rows = twell::bench::run_training(o, std::cerr, &errors);
    twell::bench::print_training_table(rows, std::cout);
    if (write && !rows.empty()) {
      const std::string dir =
          o.out_dir.empty() ? "bench/results/" + twell::bench::device_slug(rows[0].device) : o.out_dir;
      twell::bench::write_training_results(rows, dir, o.suite);
      std::cout << "results: " << dir << "/" << o.suite << ".json, .csv\n";
    }
    for (const auto& e : errors) std::cerr << "twell: training case failed: " << e << "\n";
    for (const auto& r : rows)
      if (!r.ok()) return 1;
    return errors.empty() ? 0 : 1;
  }
  const auto rows = twell::bench::run(o, std::cerr);
  twell::bench::print_table(rows, std::cout);
  if (write && !rows.empty()) {
    const std::string dir =
        o.out_dir.empty() ? "bench/results/" + twell::bench::device_slug(rows[0].device) : o.out_dir;
    twell::bench::write_results(rows, dir, o.suite);
    std::cout << "results: " << dir << "/" << o.suite << ".json, .csv\n";
  }
  for (const auto& r : rows)
    if (o.check && r.tolerance < 0) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kHelp;
    return 0;
  }
  try {
    const std::string cmd = args[0];
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const auto& r : rest)
      if (r == "--help" || r == "-h") {
        std::cout << kHelp;
        return 0;
      }
    if (cmd == "info") return cmd_info();
    if (cmd == "bench") return cmd_bench(rest);
    if (cmd == "check") {
      std::string backend = "auto";
      for (size_t i = 0; i + 1 < rest.size(); ++i)
        if (rest[i] == "--backend") backend = rest[i + 1];
      return twell::cli::run_check(backend, std::cout) ? 1 : 0;
    }
    usage_error("unknown command '" + cmd + "'");
  } catch (const twell::Error& e) {
    std::cerr << "twell: " << e.what() << "\n";
    return 1;
  }
}
