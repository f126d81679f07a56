#include "harness.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <sys/stat.h>
#include <utility>

#include "capture.hpp"
#include "check.hpp"
#include "twell/info.hpp"

#ifndef TWELL_SOURCE_DIR
#define TWELL_SOURCE_DIR "."
#endif

namespace twell::bench {

using testing::Pattern;
using testing::ProblemSpec;

Timing summarize(std::vector<double> ms) {
  Timing t;
  if (ms.empty()) return t;
  std::sort(ms.begin(), ms.end());
  auto q = [&](double f) { return ms[size_t(std::lround(f * double(ms.size() - 1)))]; };
  t.median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  t.p20 = q(0.2);
  t.p80 = q(0.8);
  return t;
}

std::vector<ProblemSpec> suite_cases(const std::string& suite, bool cuda, const ProblemSpec& custom) {
  std::vector<ProblemSpec> out;
  auto add = [&](int64_t m, int64_t k, int64_t n, DType dt, Pattern p, double d) {
    ProblemSpec s;
    s.kind = FfnKind::gated, s.m = m, s.k = k, s.n = n, s.dtype = dt, s.pattern = p, s.density = d;
    s.seed = 1234 + out.size();
    out.push_back(s);
  };
  const DType half = DType::bf16;
  if (suite == "custom") {
    out.push_back(custom);
  } else if (suite == "default") {  // the paper's layer at a realistic, heavy-tailed 99.5% sparsity
    if (cuda) add(16384, 2048, 5632, half, Pattern::heavy_tailed, 0.005);
    for (int64_t m : {1, 256})
      if (!cuda) add(m, 2048, 5632, DType::f32, Pattern::heavy_tailed, 0.005);
  } else if (suite == "cpu") {
    for (int64_t m : {1, 256})
      for (DType dt : {DType::f32, DType::bf16})
        for (Pattern p : {Pattern::uniform, Pattern::heavy_tailed}) add(m, 2048, 5632, dt, p, 0.005);
    for (double d : {0.01, 0.02, 0.05, 0.1}) add(256, 2048, 5632, DType::f32, Pattern::uniform, d);
  } else if (suite == "inference") {
    for (double d : {0.005, 0.01, 0.02, 0.05, 0.1, 0.2}) add(16384, 2048, 5632, half, Pattern::uniform, d);
    for (double d : {0.005, 0.01, 0.02}) add(16384, 2048, 5632, half, Pattern::heavy_tailed, d);
    add(16384, 4096, 11008, half, Pattern::uniform, 0.005);
    add(16384, 4096, 11008, half, Pattern::heavy_tailed, 0.005);
    add(65536, 2048, 5632, half, Pattern::uniform, 0.005);
    add(4096, 2048, 5632, half, Pattern::uniform, 0.005);
    add(16384, 2048, 5632, DType::f16, Pattern::uniform, 0.005);
  } else if (suite == "decode") {  // tokens per call from one decoding step to a prefill chunk
    for (Pattern p : {Pattern::uniform, Pattern::heavy_tailed, Pattern::trained_like})
      for (double d : {0.005, 0.01, 0.02})
        for (int64_t m : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096}) add(m, 2048, 5632, half, p, d);
    add(1, 4096, 11008, half, Pattern::uniform, 0.005);
    add(16, 4096, 11008, half, Pattern::uniform, 0.005);
  } else if (suite == "training") {  // its own cases and runner: bench/training.hpp
    throw Error("bench::run", "suite", "an inference suite (training runs through run_training)", suite);
  } else {
    throw Error("bench", "suite", "default, cpu, inference, decode, training or custom", suite);
  }
  return out;
}

std::string device_slug(const std::string& device) {
  std::string lower;
  for (char c : device) lower += char(std::tolower(static_cast<unsigned char>(c)));
  for (const char* chip : {"h100", "h200", "a100", "h800", "l40s", "l4", "a10"})
    if (lower.find(chip) != std::string::npos) return chip;
  if (lower.rfind("cpu", 0) == 0) return "cpu";
  std::string slug;
  for (char c : lower) slug += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return slug;
}

bool use_cuda(const Options& o) {
  if (o.backend == "cuda") return true;
  if (o.backend == "cpu") return false;
  if (o.backend != "auto") throw Error("bench", "backend", "auto, cpu or cuda", o.backend);
  return cuda_device_count() > 0;
}

namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

}  // namespace

namespace {

// One row: the problem run once and checked against the oracle, then the three jobs timed,
// interleaved rep by rep. The caller has set r.suite, device, backend and spec.
void run_case(Runner& runner, testing::Problem& p, const Options& o, int warmup, int reps, Row& r,
              std::ostream& progress) {
  runner.load(p);
  std::vector<uint8_t> y;
  const RunInfo info = runner.run_once(o.dispatch, y);
  r.density = r.spec.m ? double(info.active) / double(r.spec.m * r.spec.n) : 0;
  r.routed_rows = info.routed_rows;
  if (o.check) {
    const testing::ForwardCheck c = testing::check_forward(p, y.data(), 128);
    r.error = c.error;
    r.tolerance = c.ok() ? c.tolerance : -c.tolerance;  // negative tolerance marks a failed check
  } else {
    r.error = r.tolerance = -1;
  }
  const Job jobs[] = {Job::dense, Job::gate, Job::twell};
  for (int w = 0; w < warmup; ++w)
    for (Job j : jobs) runner.warm(j);
  std::vector<double> ms[3];
  for (int rep = 0; rep < reps; ++rep)
    for (Job j : jobs) ms[int(j)].push_back(runner.time_once(j));
  r.dense = summarize(ms[int(Job::dense)]);
  r.gate = summarize(ms[int(Job::gate)]);
  r.twell = summarize(ms[int(Job::twell)]);
  r.ran_dense = runner.last_run(o.dispatch).ran_dense;
  r.speedup = r.dense.median / r.twell.median;
  const double m = double(r.spec.m), k = double(r.spec.k), n = double(r.spec.n);
  const double es = double(dtype_size(r.spec.dtype));
  r.tflops = 6 * m * k * n / (r.twell.median * 1e-3) / 1e12;
  r.gbps = (2 * m * k + 3 * n * k) * es / (r.twell.median * 1e-3) / 1e9;
  progress << fmt(" dense %.3f ms, gate %.3f ms, twell %.3f ms, %.2fx", r.dense.median, r.gate.median,
                  r.twell.median, r.speedup)
           << fmt(", density %.3f%%, routed %.0f, error %.2e", 100 * r.density, double(r.routed_rows), r.error)
           << (r.tolerance < 0 && o.check ? "  ERROR ABOVE TOLERANCE" : "") << "\n";
}

}  // namespace

Cases::Cases(const Options& o, std::vector<ProblemSpec> specs) : o_(o), specs_(std::move(specs)) {
  if (!captured()) {
    count_ = specs_.size();
    return;
  }
  testing::CaptureFolder folder = testing::read_capture(o.from_dir);  // the manifest, parsed once
  count_ = size_t(folder.layers);
  manifest_ = std::move(folder.manifest);
}

testing::Problem Cases::load(size_t i) const {
  return captured() ? testing::load_captured_layer(o_.from_dir, int(i), o_.from_rows)
                    : testing::make_problem(specs_[i]);
}

std::string Cases::source(size_t i) const {
  return captured() ? o_.from_dir + " layer " + std::to_string(i) : std::string();
}

testing::Json Cases::model(size_t i) const {
  return captured() ? testing::capture_model(manifest_, int(i)) : testing::Json::object();
}

std::string Cases::name(size_t i) const { return captured() ? source(i) : specs_[i].describe(); }

std::vector<Row> run(const Options& o, std::ostream& progress) {
  const bool cuda = use_cuda(o);
  std::unique_ptr<Runner> runner = cuda ? testing::make_cuda_runner() : testing::make_cpu_runner();
  runner->configure(o.plan, o.dispatch);
  runner->replay_graphs(o.suite == "decode");
  const int warmup = o.warmup_runs(), reps = o.timed_reps();
  std::vector<ProblemSpec> specs;
  if (o.from_dir.empty()) specs = o.one_case ? std::vector<ProblemSpec>{o.custom} : suite_cases(o.suite, cuda, o.custom);
  const Cases cases(o, std::move(specs));
  std::vector<Row> rows;
  for (size_t i = 0; i < cases.size(); ++i) {
    testing::Problem p = cases.load(i);
    Row r;
    r.suite = o.suite;
    r.device = runner->device();
    r.backend = runner->backend();
    r.spec = p.spec;
    r.source = cases.source(i);
    r.model = cases.model(i);
    progress << "[" << i + 1 << "/" << cases.size() << "] "
             << (cases.captured() ? r.source + ": " : std::string()) << r.spec.describe() << " ..."
             << std::flush;
    run_case(*runner, p, o, warmup, reps, r, progress);
    if (cases.captured()) r.spec.density = r.density;  // what the model's activations gave
    rows.push_back(r);
  }
  return rows;
}

void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0755);
}

// A CSV field: quoted, with inner quotes doubled (device names hold commas).
std::string csv_field(const std::string& s) {
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

std::string json_rows(const std::vector<testing::Json>& rows) {
  std::string out = "[\n";
  for (size_t i = 0; i < rows.size(); ++i) out += "  " + rows[i].dump() + (i + 1 < rows.size() ? ",\n" : "\n");
  return out + "]\n";
}

testing::Json timing_json(const Timing& t) {
  testing::Json j = testing::Json::object();
  j.set("median", testing::Json::number(t.median, "%.4f"));
  j.set("p20", testing::Json::number(t.p20, "%.4f"));
  j.set("p80", testing::Json::number(t.p80, "%.4f"));
  return j;
}

testing::Json problem_json(const std::string& suite, const std::string& device, const std::string& backend,
                           const ProblemSpec& s) {
  testing::Json j = testing::Json::object();
  j.set("suite", suite).set("device", device).set("backend", backend).set("kind", ffn_kind_name(s.kind));
  j.set("dtype", dtype_name(s.dtype)).set("M", s.m).set("K", s.k).set("N", s.n);
  j.set("pattern", testing::pattern_name(s.pattern)).set("target_density", testing::Json::number(s.density, "%.5f"));
  return j;
}

void add_members(testing::Json& row, const testing::Json& more) {
  for (const auto& [key, value] : more.members()) row.set(key, value);
}

std::string result_name(const Options& o) {
  if (o.suite != "custom" && !o.one_case) return o.suite;
  const ProblemSpec& c = o.custom;
  char density[32];
  std::snprintf(density, sizeof density, "%g", c.density);
  return o.suite + "-" + ffn_kind_name(c.kind) + "-" + dtype_name(c.dtype) + "-m" + std::to_string(c.m) + "-k" +
         std::to_string(c.k) + "-n" + std::to_string(c.n) + "-" + testing::pattern_name(c.pattern) + "-d" + density;
}

namespace {

testing::Json row_json(const Row& r) {
  using testing::Json;
  Json j = problem_json(r.suite, r.device, r.backend, r.spec);
  j.set("density", Json::number(r.density, "%.5f"));
  j.set("dense_ms", timing_json(r.dense)).set("gate_ms", timing_json(r.gate)).set("twell_ms", timing_json(r.twell));
  j.set("speedup", Json::number(r.speedup, "%.3f")).set("routed_rows", r.routed_rows).set("ran_dense", r.ran_dense);
  j.set("rel_error", Json::number(r.error, "%.3e")).set("tolerance", Json::number(r.tolerance, "%.3e"));
  j.set("tflops", Json::number(r.tflops, "%.2f")).set("gbps", Json::number(r.gbps, "%.1f"));
  j.set("source", r.source);
  add_members(j, r.model);
  return j;
}

}  // namespace

void write_results(const std::vector<Row>& rows, const std::string& dir, const std::string& name) {
  make_dirs(dir);
  std::ofstream js(dir + "/" + name + ".json"), csv(dir + "/" + name + ".csv");
  if (!js || !csv) throw Error("bench", "out dir", "a writable folder", dir);
  csv << "suite,device,backend,kind,dtype,M,K,N,pattern,target_density,density,dense_ms,dense_p20,"
         "dense_p80,gate_ms,twell_ms,twell_p20,twell_p80,speedup,routed_rows,ran_dense,rel_error,"
         "tolerance,tflops,gbps,source\n";
  std::vector<testing::Json> json;
  for (const Row& r : rows) {
    const ProblemSpec& s = r.spec;
    char line[4096];
    std::snprintf(line, sizeof line,
                  "%s,%s,%s,%s,%s,%lld,%lld,%lld,%s,%.5f,%.5f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,"
                  "%.3f,%lld,%d,%.3e,%.3e,%.2f,%.1f,",
                  r.suite.c_str(), csv_field(r.device).c_str(), r.backend.c_str(), ffn_kind_name(s.kind),
                  dtype_name(s.dtype), (long long)s.m, (long long)s.k, (long long)s.n,
                  testing::pattern_name(s.pattern), s.density, r.density, r.dense.median, r.dense.p20,
                  r.dense.p80, r.gate.median, r.twell.median, r.twell.p20, r.twell.p80, r.speedup,
                  (long long)r.routed_rows, int(r.ran_dense), r.error, r.tolerance, r.tflops, r.gbps);
    csv << line << csv_field(r.source) << "\n";
    json.push_back(row_json(r));
  }
  js << json_rows(json);
  if (!js || !csv) throw Error("bench", "out dir", "a complete write of the results", dir);
}

void print_table(const std::vector<Row>& rows, std::ostream& out) {
  out << "device   | M x K x N              | dtype    | pattern      | density | dense ms | gate ms "
         "| twell ms | speedup | routed | rel error\n";
  for (const Row& r : rows) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "%-8s | %6lld x %5lld x %6lld | %-8s | %-12s | %6.3f%% | %8.3f | %7.3f | %8.3f | "
                  "%6.2fx | %6lld | %.2e%s\n",
                  device_slug(r.device).c_str(), (long long)r.spec.m, (long long)r.spec.k,
                  (long long)r.spec.n, dtype_name(r.spec.dtype), testing::pattern_name(r.spec.pattern),
                  100 * r.density, r.dense.median, r.gate.median, r.twell.median, r.speedup,
                  (long long)r.routed_rows, r.error, r.ran_dense ? " (dense)" : "");
    out << line;
  }
}

}  // namespace twell::bench
