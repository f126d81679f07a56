#include "training.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <sstream>

namespace twell::bench {

using testing::Pattern;
using testing::ProblemSpec;

namespace {

constexpr double kL1Coef = 2e-5;  // the paper's order of magnitude; TrainingOptions.l1_coef

// Where twell and the dense baseline must agree (max relative Frobenius difference over y, dx and
// the weight gradients): both round to the dtype at different points (the dense layer stores
// G, U, h, dh, dg, du in it; twell keeps dh and h in fp32): 16-bit types differ by rounding only.
double grad_tolerance(DType t) { return t == DType::f32 ? 1e-4 : 2e-2; }

// ||a - b|| / ||b|| over n elements (b: the dense baseline); NaN stays NaN (a poisoned output).
double rel_diff(const void* a, const void* b, DType t, size_t n) {
  double num = 0, den = 0;
#pragma omp parallel for schedule(static) reduction(+ : num, den)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const double x = load_float(a, t, i), y = load_float(b, t, i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double rel_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType t) {
  if (a.size() != b.size()) throw Error("bench training", "outputs", "equal sizes", "different sizes");
  return rel_diff(a.data(), b.data(), t, a.size() / dtype_size(t));
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) throw Error("bench training", "gradients", "equal sizes", "different sizes");
  return rel_diff(a.data(), b.data(), DType::f32, a.size());
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A row as JSON (a NaN difference, an output left unwritten, is null).
testing::Json row_json(const TrainingRow& r) {
  using testing::Json;
  Json j = problem_json(r.suite, r.device, r.backend, r.spec);
  j.set("density", Json::number(r.density, "%.5f")).set("l0", Json::number(r.l0, "%.3f"));
  j.set("l1", Json::number(r.l1, "%.5g")).set("l1_coef", Json::number(r.l1_coef, "%.3g"));
  j.set("dense_ms", timing_json(r.dense)).set("twell_ms", timing_json(r.twell));
  j.set("speedup", Json::number(r.speedup, "%.3f"));
  j.set("saved_bytes_dense", r.dense_mem.saved).set("saved_bytes_twell", r.twell_mem.saved);
  j.set("saved_ratio", Json::number(r.saved_ratio, "%.3f"));
  j.set("peak_bytes_dense", r.dense_mem.peak).set("peak_bytes_twell", r.twell_mem.peak);
  j.set("peak_ratio", Json::number(r.peak_ratio, "%.3f")).set("routed_rows", r.routed_rows).set("path", r.path);
  Json diff = Json::object();
  diff.set("y", Json::number(r.diff_y, "%.3e")).set("dx", Json::number(r.diff_dx, "%.3e"));
  diff.set("dgate", Json::number(r.diff_dgate, "%.3e")).set("dup", Json::number(r.diff_dup, "%.3e"));
  diff.set("ddown", Json::number(r.diff_ddown, "%.3e"));
  j.set("rel_diff", diff).set("grad_rel_diff", Json::number(r.grad_rel_diff, "%.3e"));
  j.set("grad_tolerance", Json::number(r.grad_tolerance, "%.3e"));
  j.set("dense_tflops", Json::number(r.dense_tflops, "%.2f")).set("twell_tflops", Json::number(r.twell_tflops, "%.2f"));
  j.set("source", r.source);
  add_members(j, r.model);
  return j;
}

}  // namespace

size_t training_common_bytes(const ProblemSpec& s) {
  const size_t m = size_t(s.m), k = size_t(s.k), n = size_t(s.n), es = dtype_size(s.dtype);
  return 4 * m * k * es          // x, dy, y, dx
         + 3 * n * k * es        // Wg, Wu (one [2N, K] buffer), Wd
         + 3 * n * k * sizeof(float)  // dWg, dWu, dWd
         + 2 * sizeof(float);    // stats
}

TrainingMemory dense_training_memory(const ProblemSpec& s, size_t blas_workspace) {
  const size_t mn = size_t(s.m) * size_t(s.n), es = dtype_size(s.dtype);
  TrainingMemory mem;
  mem.saved = 2 * mn * es;  // [relu(G) | U]; h is recomputed in backward
  mem.peak = training_common_bytes(s) + mem.saved + 2 * mn * es /* [dg | du] */ + mn * es /* h */ +
             blas_workspace;
  return mem;
}

TrainingMemory twell_training_memory(const ProblemSpec& s, size_t saved, size_t workspace) {
  return {saved, training_common_bytes(s) + saved + workspace};
}

std::vector<ProblemSpec> training_cases(bool cuda) {
  std::vector<ProblemSpec> out;
  auto add = [&](int64_t m, DType dt, Pattern p, double d) {
    ProblemSpec s;
    s.kind = FfnKind::gated, s.m = m, s.k = 2048, s.n = 5632, s.dtype = dt, s.pattern = p, s.density = d;
    s.seed = 4321 + out.size();
    out.push_back(s);
  };
  if (cuda) {
    const DType t = DType::bf16;
    for (double d : {0.005, 0.01, 0.02, 0.05, 0.16}) add(16384, t, Pattern::uniform, d);
    for (double d : {0.005, 0.01, 0.02}) add(16384, t, Pattern::heavy_tailed, d);
    for (double d : {0.005, 0.01}) add(16384, t, Pattern::trained_like, d);
    for (int64_t m : {65536, 131072, 262144}) add(m, t, Pattern::uniform, 0.005);
  } else {  // a small check of the same code path: the CPU plan against a CBLAS dense step
    for (Pattern p : {Pattern::uniform, Pattern::heavy_tailed}) add(256, DType::f32, p, 0.005);
  }
  return out;
}

std::vector<uint8_t> make_upstream_gradient(const ProblemSpec& s) {
  // As tests/cuda_training_step.hpp does: the x of a second, unrelated problem.
  ProblemSpec g;
  g.kind = s.kind, g.m = s.m, g.k = s.k, g.n = 1, g.dtype = s.dtype, g.pattern = Pattern::uniform;
  g.density = 0.5, g.hot_tile = 64, g.seed = s.seed + 1;
  return testing::make_problem(g).x;
}

namespace {

// One case: load, both steps once and compared, warm-up, interleaved timed reps, memory.
TrainingRow run_case(TrainingRunner& runner, testing::Problem p, const Options& o, int warmup, int reps) {
  const ProblemSpec s = p.spec;
  TrainingRow r;
  r.suite = o.suite;
  r.device = runner.device();
  r.backend = runner.backend();
  r.spec = s;
  r.l1_coef = kL1Coef;
  // A capture holds no gradients: dy is random for captured layers too (the backward's work
  // follows the saved activations, not dy's values).
  runner.load(p, make_upstream_gradient(s), kL1Coef);
  p = testing::Problem();  // the host copies go once uploaded
  // Warm-up first: under automatic dispatch the runner takes the saved form the plan asks for
  // once a forward has measured the density, and the checked and timed steps run that form.
  const TrainJob jobs[] = {TrainJob::dense, TrainJob::twell};
  for (int w = 0; w < std::max(warmup, 2); ++w)
    for (TrainJob j : jobs) runner.warm(j);
  const TrainingOutputs tw = runner.run_once(TrainJob::twell);  // in the form dispatch settled on
  const bool checked_dense = runner.twell_dense();
  r.l0 = tw.stats[0];
  r.l1 = tw.stats[1];
  r.density = s.n ? r.l0 / double(s.n) : 0;
  r.routed_rows = tw.routed_rows;
  if (o.check) {
    const TrainingOutputs de = runner.run_once(TrainJob::dense);
    r.diff_y = rel_diff(tw.y, de.y, s.dtype);
    r.diff_dx = rel_diff(tw.dx, de.dx, s.dtype);
    r.diff_dgate = rel_diff(tw.dgate, de.dgate);
    r.diff_dup = rel_diff(tw.dup, de.dup);
    r.diff_ddown = rel_diff(tw.ddown, de.ddown);
    r.grad_rel_diff = 0;
    for (double d : {r.diff_y, r.diff_dx, r.diff_dgate, r.diff_dup, r.diff_ddown})
      r.grad_rel_diff = std::isnan(d) || std::isnan(r.grad_rel_diff) ? NAN : std::max(r.grad_rel_diff, d);
    r.grad_tolerance = grad_tolerance(s.dtype);
  }
  std::vector<double> ms[2];
  for (int rep = 0; rep < reps; ++rep)
    for (TrainJob j : jobs) ms[int(j)].push_back(runner.time_once(j));
  r.dense = summarize(ms[int(TrainJob::dense)]);
  r.twell = summarize(ms[int(TrainJob::twell)]);
  // The form of the checked and timed steps ("mixed" if dispatch changed it during the reps).
  r.path = runner.twell_dense() != checked_dense ? "mixed" : checked_dense ? "dense" : "sparse";
  r.speedup = r.dense.median / r.twell.median;
  r.dense_mem = runner.memory(TrainJob::dense);
  r.twell_mem = runner.memory(TrainJob::twell);
  r.saved_ratio = double(r.dense_mem.saved) / double(r.twell_mem.saved);
  r.peak_ratio = double(r.dense_mem.peak) / double(r.twell_mem.peak);
  const double flop = 18.0 * double(s.m) * double(s.k) * double(s.n);
  r.dense_tflops = flop / (r.dense.median * 1e-3) / 1e12;
  r.twell_tflops = flop / (r.twell.median * 1e-3) / 1e12;
  if (s.pattern == Pattern::captured) r.spec.density = r.density;  // what the model's activations gave
  return r;
}

}  // namespace

std::vector<TrainingRow> run_training(const Options& o, std::ostream& progress,
                                      std::vector<std::string>* errors) {
  const bool cuda = use_cuda(o);
  std::unique_ptr<TrainingRunner> runner = cuda ? make_cuda_training_runner() : make_cpu_training_runner();
  runner->configure(o.dispatch);
  std::vector<ProblemSpec> specs = training_cases(cuda);
  if (o.one_case) {
    ProblemSpec c = o.custom;
    c.seed = 4321;
    specs = {c};
  }
  const Cases cases(o, std::move(specs));
  const int warmup = o.warmup_runs(), reps = o.timed_reps();
  std::vector<TrainingRow> rows;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases.name(i);
    progress << "[" << i + 1 << "/" << cases.size() << "] training " << name << " ..." << std::flush;
    TrainingRow r;
    try {
      r = run_case(*runner, cases.load(i), o, warmup, reps);
      r.source = cases.source(i);
      r.model = cases.model(i);
      runner->release();  // each case's buffers go before the next one's
    } catch (const SkipCase& e) {
      runner->release();
      progress << " skipped: " << e.what() << "\n";
      continue;
    } catch (const std::exception& e) {
      runner->release();
      if (!errors) throw;
      errors->push_back(name + ": " + e.what());
      progress << " FAILED: " << e.what() << "\n";
      continue;
    }
    char line[512];
    std::snprintf(line, sizeof line,
                  " dense %.3f ms, twell %.3f ms, %.2fx, density %.3f%%, routed %lld, saved %.1f/%.1f MB "
                  "(%.2fx), peak %.2f/%.2f GB (%.2fx), grad diff %.2e, %s%s\n",
                  r.dense.median, r.twell.median, r.speedup, 100 * r.density, (long long)r.routed_rows,
                  r.dense_mem.saved / 1e6, r.twell_mem.saved / 1e6, r.saved_ratio, r.dense_mem.peak / 1e9,
                  r.twell_mem.peak / 1e9, r.peak_ratio, r.grad_rel_diff, r.path.c_str(),
                  o.check && !r.ok() ? "  TWELL AND DENSE DISAGREE" : "");
    progress << line;
    rows.push_back(r);
  }
  return rows;
}

void write_training_results(const std::vector<TrainingRow>& rows, const std::string& dir,
                            const std::string& name) {
  make_dirs(dir);
  std::ofstream js(dir + "/" + name + ".json"), csv(dir + "/" + name + ".csv");
  if (!js || !csv) throw Error("bench", "out dir", "a writable folder", dir);
  csv << "suite,device,backend,kind,dtype,M,K,N,pattern,target_density,density,l0,l1,l1_coef,"
         "dense_ms,dense_p20,dense_p80,twell_ms,twell_p20,twell_p80,speedup,saved_bytes_dense,"
         "saved_bytes_twell,saved_ratio,peak_bytes_dense,peak_bytes_twell,peak_ratio,routed_rows,path,"
         "diff_y,diff_dx,diff_dgate,diff_dup,diff_ddown,grad_rel_diff,grad_tolerance,dense_tflops,"
         "twell_tflops,source\n";
  std::vector<testing::Json> json;
  for (const TrainingRow& r : rows) {
    const ProblemSpec& s = r.spec;
    const auto bytes = [](size_t b) { return std::to_string(b); };
    std::ostringstream c;
    c << r.suite << "," << csv_field(r.device) << "," << r.backend << "," << ffn_kind_name(s.kind) << ","
      << dtype_name(s.dtype) << "," << s.m << "," << s.k << "," << s.n << "," << testing::pattern_name(s.pattern)
      << "," << fmt("%.5f", s.density) << "," << fmt("%.5f", r.density) << "," << fmt("%.3f", r.l0) << ","
      << fmt("%.5g", r.l1) << "," << fmt("%.3g", r.l1_coef) << "," << fmt("%.4f", r.dense.median) << "," << fmt("%.4f", r.dense.p20)
      << "," << fmt("%.4f", r.dense.p80) << "," << fmt("%.4f", r.twell.median) << ","
      << fmt("%.4f", r.twell.p20) << "," << fmt("%.4f", r.twell.p80) << "," << fmt("%.3f", r.speedup) << ","
      << bytes(r.dense_mem.saved) << "," << bytes(r.twell_mem.saved) << "," << fmt("%.3f", r.saved_ratio)
      << "," << bytes(r.dense_mem.peak) << "," << bytes(r.twell_mem.peak) << "," << fmt("%.3f", r.peak_ratio)
      << "," << r.routed_rows << "," << r.path << "," << fmt("%.3e", r.diff_y) << "," << fmt("%.3e", r.diff_dx) << ","
      << fmt("%.3e", r.diff_dgate) << "," << fmt("%.3e", r.diff_dup) << "," << fmt("%.3e", r.diff_ddown)
      << "," << fmt("%.3e", r.grad_rel_diff) << "," << fmt("%.3e", r.grad_tolerance) << ","
      << fmt("%.2f", r.dense_tflops) << "," << fmt("%.2f", r.twell_tflops) << "," << csv_field(r.source) << "\n";
    csv << c.str();
    json.push_back(row_json(r));
  }
  js << json_rows(json);
  if (!js || !csv) throw Error("bench", "out dir", "a complete write of the results", dir);
}

void print_training_table(const std::vector<TrainingRow>& rows, std::ostream& out) {
  out << "device   | M x K x N              | dtype    | pattern      | density | dense ms | twell ms "
         "| speedup | saved MB dense/twell   | peak GB dense/twell | routed | grad diff\n";
  for (const TrainingRow& r : rows) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "%-8s | %6lld x %5lld x %6lld | %-8s | %-12s | %6.3f%% | %8.3f | %8.3f | %6.2fx | "
                  "%7.1f/%6.1f (%5.2fx) | %5.2f/%5.2f (%4.2fx) | %6lld | %.2e%s\n",
                  device_slug(r.device).c_str(), (long long)r.spec.m, (long long)r.spec.k,
                  (long long)r.spec.n, dtype_name(r.spec.dtype), testing::pattern_name(r.spec.pattern),
                  100 * r.density, r.dense.median, r.twell.median, r.speedup, r.dense_mem.saved / 1e6,
                  r.twell_mem.saved / 1e6, r.saved_ratio, r.dense_mem.peak / 1e9, r.twell_mem.peak / 1e9,
                  r.peak_ratio, (long long)r.routed_rows, r.grad_rel_diff, r.ok() ? "" : " (disagree)");
    out << line;
  }
}

}  // namespace twell::bench
