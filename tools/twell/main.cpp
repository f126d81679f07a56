// The twell command line: bench | check | info. Every argument and input file is checked before
// any work: a bad one exits with status 2 and one line on stderr, "twell <command>: <argument>:
// expected <what>, got <value>".
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "capture.hpp"
#include "conformance.hpp"
#include "harness.hpp"
#include "help.hpp"
#include "training.hpp"
#include "twell/twell.hpp"

namespace {

// "twell <command>", the start of every error line.
std::string g_prefix = "twell";

// `s` on one line: control characters (a newline in a folder name) written as escapes.
std::string one_line(const std::string& s) {
  std::string o;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      o += buf;
    } else {
      o += c;
    }
  }
  return o;
}

// One line on stderr, then exit status `code`.
[[noreturn]] void fail(const std::string& msg, int code) {
  std::cerr << g_prefix << ": " << one_line(msg) << "\n";
  std::exit(code);
}

[[noreturn]] void usage_error(const std::string& msg) { fail(msg, 2); }

// A library Error about `flag`'s value: "<flag>: <argument>: expected ..., got ...".
[[noreturn]] void flag_error(const std::string& flag, const twell::Error& e) {
  usage_error(flag + ": " + e.argument() + ": expected " + e.expected() + ", got " + e.actual());
}

bool is_help(const std::string& a) { return a == "--help" || a == "-h"; }

// Largest custom case: M up to 2^24 rows, K and N up to 2^20 (beyond any transformer layer twell
// targets; their products stay far from int64 overflow). Reps and warm-up runs up to a million.
constexpr int64_t kMaxRows = int64_t(1) << 24;
constexpr int64_t kMaxWidth = int64_t(1) << 20;
constexpr int64_t kMaxRuns = 1000000;

// The whole of `v` as a decimal integer in [lo, hi], or a usage error naming the flag.
int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  const std::string want = "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0])))
    usage_error(flag + ": expected " + want + ", got '" + v + "'");
  errno = 0;
  char* end = nullptr;
  const long long r = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || r < lo || r > hi)
    usage_error(flag + ": expected " + want + ", got '" + v + "'");
  return r;
}

// The whole of `v` as a finite fraction in (0, 1], or a usage error naming the flag.
double parse_fraction(const std::string& flag, const std::string& v) {
  const std::string want = "a number in (0, 1]";
  if (v.empty() || std::isspace(static_cast<unsigned char>(v[0])))
    usage_error(flag + ": expected " + want + ", got '" + v + "'");
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (*end != '\0' || !std::isfinite(d) || !(d > 0.0 && d <= 1.0))
    usage_error(flag + ": expected " + want + ", got '" + v + "'");
  return d;
}

// `v` if it is one of `names`, else a usage error listing them.
std::string parse_choice(const std::string& flag, const std::string& v,
                         const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& n : names) {
    if (v == n) return v;
    list += (list.empty() ? "" : " | ") + n;
  }
  usage_error(flag + ": expected " + list + ", got '" + v + "'");
}

// Refuses a custom case whose inputs and outputs alone (x, y, three weights and the hidden matrix,
// counted at 4 bytes per element or more) would exceed this machine's memory, before anything is
// allocated.
void check_case_fits(const twell::testing::ProblemSpec& c) {
  const int64_t element = std::max<int64_t>(int64_t(twell::dtype_size(c.dtype)), 4);
  const int64_t bytes = (2 * c.m * c.k + 3 * c.n * c.k + c.m * c.n) * element;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double memory = double(pages) * double(page);
  if (double(bytes) > memory)
    usage_error("the case M=" + std::to_string(c.m) + " K=" + std::to_string(c.k) + " N=" +
                std::to_string(c.n) + " needs at least " + std::to_string(bytes >> 20) +
                " MiB, more than this machine's " + std::to_string(int64_t(memory) >> 20) + " MiB");
}

twell::DType parse_dtype(const std::string& flag, const std::string& s) {
  for (twell::DType t : {twell::DType::f32, twell::DType::bf16, twell::DType::f16})
    if (s == twell::dtype_name(t)) return t;
  usage_error(flag + ": expected float32 | bfloat16 | float16, got '" + s + "'");
}

int cmd_info(const std::vector<std::string>& a) {
  if (!a.empty()) usage_error("arguments: expected none (see twell info --help), got '" + a[0] + "'");
  std::cout << "twell " << twell::version() << "\n"
            << "CPU backend: " << twell::cpu_description() << "\n"
            << (twell::blas_core_advice().empty() ? "" : "CPU advice: " + twell::blas_core_advice() + "\n")
            << "CUDA backend: " << (twell::cuda_compiled() ? "compiled" : "not compiled") << "\n";
  const auto devs = twell::cuda_devices();
  if (devs.empty()) std::cout << "CUDA devices: none\n";
  for (size_t i = 0; i < devs.size(); ++i) std::cout << "cuda:" << i << ": " << devs[i] << "\n";
  return 0;
}

// --backend cuda where this twell cannot run CUDA: refused before any work.
void check_backend(const std::string& backend) {
  if (backend != "cuda") return;
  if (!twell::cuda_compiled())
    usage_error("--backend: expected auto | cpu (this twell was built without CUDA), got 'cuda'");
  if (twell::cuda_device_count() == 0)
    usage_error("--backend: expected auto | cpu (no CUDA device is visible), got 'cuda'");
}

// --out: a folder that exists (it is created) and can be written, before the run fills it.
void check_out_dir(const std::string& dir) {
  if (!dir.empty()) twell::bench::make_dirs(dir);
  struct stat st{};
  if (dir.empty() || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    usage_error("--out: expected a folder (created if missing), got '" + dir + "'");
  if (::access(dir.c_str(), W_OK) != 0) usage_error("--out: expected a writable folder, got '" + dir + "'");
}

// The results folder without --out. Never the committed bench/results/<device>: a first `twell
// bench` must not overwrite them. The build folder this binary runs from (BUILD/tools/twell/twell,
// BUILD holding CMakeCache.txt) gets BUILD/bench-results/<device>, whatever the working directory;
// an installed twell writes ./bench-results/<device>.
std::string default_out_dir(const std::string& device) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  const std::string tail = "/tools/twell/twell";
  if (n > 0) {
    const std::string path(exe, size_t(n));
    const size_t cut = path.size() - std::min(path.size(), tail.size());
    if (cut > 0 && path.compare(cut, std::string::npos, tail) == 0) {
      const std::string build = path.substr(0, cut);
      if (access((build + "/CMakeCache.txt").c_str(), F_OK) == 0)
        return build + "/bench-results/" + device;
    }
  }
  return "bench-results/" + device;
}

// `twell bench`'s arguments: the harness options, whether to write results, and whether --dtype
// was given (else the backend's default dtype).
struct BenchRequest {
  twell::bench::Options o;
  bool write = true, dtype_set = false;
};

// What the flags of `twell bench` decide together: a custom case's flags pick the custom suite (or
// one case of the training or decode suite), --from the real suite; contradictions are usage errors.
void resolve_bench_suite(twell::bench::Options& o, bool suite_set, const std::string& custom_flag) {
  if (!custom_flag.empty()) {
    if (suite_set && o.suite != "custom" && o.suite != "training" && o.suite != "decode")
      usage_error(custom_flag + " describes a custom case: use it with --suite custom, training or decode "
                  "(or without --suite), not with --suite " + o.suite);
    if (o.suite == "training" || o.suite == "decode") {
      if (o.suite == "training" && o.custom.kind != twell::FfnKind::gated)
        usage_error("the training suite runs gated FFNs only");
      o.one_case = true;  // one case of these parameters instead of the suite
    } else {
      o.suite = "custom";
    }
  }
  if (o.suite == "custom" || o.one_case) check_case_fits(o.custom);
  if (!o.from_dir.empty()) {
    if (suite_set && o.suite != "real") usage_error("--from runs the real suite: use it without --suite " + o.suite);
    if (!custom_flag.empty()) usage_error("--from takes its shapes from the capture: drop " + custom_flag);
    o.suite = "real";
  } else if (o.suite == "real") {
    usage_error("--suite real needs --from DIR (a folder of `python -m twell.capture`)");
  } else if (o.from_rows > 0) {
    usage_error("--rows applies to --from");
  }
  if (!o.from_dir.empty()) {  // every layer's files, before the first one runs
    try {
      twell::testing::captured_layers(o.from_dir);
    } catch (const twell::Error& e) {
      flag_error("--from", e);
    }
  }
}

BenchRequest parse_bench(const std::vector<std::string>& a) {
  BenchRequest r;
  twell::bench::Options& o = r.o;
  bool suite_set = false;
  std::string custom_flag;  // the first flag that describes a custom case
  o.custom.m = 256, o.custom.k = 2048, o.custom.n = 5632, o.custom.density = 0.005;
  o.custom.pattern = twell::testing::Pattern::heavy_tailed;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& f = a[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= a.size()) usage_error("option " + f + " needs a value");
      return a[++i];
    };
    auto custom = [&] {
      if (custom_flag.empty()) custom_flag = f;
    };
    if (f == "--suite") {
      o.suite = parse_choice(f, value(), {"default", "cpu", "inference", "decode", "training", "custom", "real"});
      suite_set = true;
    } else if (f == "--backend") {
      o.backend = parse_choice(f, value(), {"auto", "cpu", "cuda"});
    } else if (f == "--m") {
      o.custom.m = parse_int(f, value(), 1, kMaxRows), custom();
    } else if (f == "--k") {
      o.custom.k = parse_int(f, value(), 1, kMaxWidth), custom();
    } else if (f == "--n") {
      o.custom.n = parse_int(f, value(), 1, kMaxWidth), custom();
    } else if (f == "--density") {
      o.custom.density = parse_fraction(f, value()), custom();
    } else if (f == "--pattern") {
      const std::string p = value();
      try {
        o.custom.pattern = twell::testing::parse_pattern(p), custom();
      } catch (const twell::Error& e) {
        usage_error(f + ": expected " + e.expected() + ", got '" + p + "'");
      }
    } else if (f == "--dtype") {
      o.custom.dtype = parse_dtype(f, value()), r.dtype_set = true, custom();
    } else if (f == "--kind") {
      const std::string k = parse_choice(f, value(), {"gated", "plain"});
      o.custom.kind = k == "gated" ? twell::FfnKind::gated : twell::FfnKind::plain;
      custom();
    } else if (f == "--gate") {
      const std::string g = parse_choice(f, value(), {"auto", "portable"});
      o.plan.gate = g == "auto" ? twell::GateKernel::automatic : twell::GateKernel::portable;
    } else if (f == "--dispatch") {
      const std::string d = parse_choice(f, value(), {"auto", "sparse", "dense"});
      o.dispatch = d == "auto" ? twell::Dispatch::automatic
                   : d == "sparse" ? twell::Dispatch::force_sparse : twell::Dispatch::force_dense;
    } else if (f == "--reps") {
      o.reps = int(parse_int(f, value(), 1, kMaxRuns));
    } else if (f == "--warmup") {
      o.warmup = int(parse_int(f, value(), 0, kMaxRuns));
    } else if (f == "--from") {
      o.from_dir = value();
    } else if (f == "--rows") {
      o.from_rows = parse_int(f, value(), 1, kMaxRows);
    } else if (f == "--out") {
      o.out_dir = value();
    } else if (f == "--no-check") {
      o.check = false;
    } else if (f == "--no-write") {
      r.write = false;
    } else {
      usage_error("unknown bench option " + f);
    }
  }
  resolve_bench_suite(o, suite_set, custom_flag);
  check_backend(o.backend);
  if (r.write && !o.out_dir.empty()) check_out_dir(o.out_dir);
  return r;
}

// The results folder of a run on `device`: --out, or the default.
std::string out_dir_of(const twell::bench::Options& o, const std::string& device) {
  return o.out_dir.empty() ? default_out_dir(twell::bench::device_slug(device)) : o.out_dir;
}

int bench_training(const twell::bench::Options& o, bool write) {
  std::vector<std::string> errors;  // failed cases: reported, the others still written
  const auto rows = twell::bench::run_training(o, std::cerr, &errors);
  twell::bench::print_training_table(rows, std::cout);
  if (write && !rows.empty()) {
    const std::string dir = out_dir_of(o, rows[0].device), name = twell::bench::result_name(o);
    twell::bench::write_training_results(rows, dir, name);
    std::cout << "results: " << dir << "/" << name << ".json, .csv\n";
  }
  for (const auto& e : errors) std::cerr << g_prefix << ": training case failed: " << one_line(e) << "\n";
  for (const auto& r : rows)
    if (!r.ok()) return 1;
  return errors.empty() ? 0 : 1;
}

int bench_inference(const twell::bench::Options& o, bool write) {
  const auto rows = twell::bench::run(o, std::cerr);
  twell::bench::print_table(rows, std::cout);
  if (write && !rows.empty()) {
    const std::string dir = out_dir_of(o, rows[0].device), name = twell::bench::result_name(o);
    twell::bench::write_results(rows, dir, name);
    std::cout << "results: " << dir << "/" << name << ".json, .csv\n";
  }
  for (const auto& r : rows)
    if (o.check && r.tolerance < 0) return 1;
  return 0;
}

int cmd_bench(const std::vector<std::string>& a) {
  BenchRequest r = parse_bench(a);
  twell::bench::Options& o = r.o;
  const bool cuda = o.backend == "cuda" || (o.backend == "auto" && twell::cuda_device_count() > 0);
  if (!r.dtype_set) o.custom.dtype = cuda ? twell::DType::bf16 : twell::DType::f32;
  std::cerr << "twell bench: suite " << o.suite << " on " << (cuda ? "CUDA" : "CPU") << "\n";
  if (!cuda && !twell::blas_core_advice().empty()) std::cerr << "twell bench: " << twell::blas_core_advice() << "\n";
  if (o.suite == "real") {  // each captured layer: inference, then a training step
    const int inference = bench_inference(o, r.write);
    twell::bench::Options t = o;
    t.suite = "real_training";
    return std::max(inference, bench_training(t, r.write));
  }
  return o.suite == "training" ? bench_training(o, r.write) : bench_inference(o, r.write);
}

int cmd_check(const std::vector<std::string>& a) {
  std::string backend = "auto";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != "--backend") usage_error("unknown check option " + a[i] + " (see twell check --help)");
    if (i + 1 >= a.size()) usage_error("option --backend needs a value");
    backend = parse_choice(a[i], a[i + 1], {"auto", "cpu", "cuda"});
    ++i;
  }
  check_backend(backend);
  return twell::cli::run_check(backend, std::cout) ? 1 : 0;
}

struct Command {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* help;
};

const Command kCommands[] = {
    {"bench", cmd_bench, twell::cli::kBenchHelp},
    {"check", cmd_check, twell::cli::kCheckHelp},
    {"info", cmd_info, twell::cli::kInfoHelp},
};

}  // namespace

// OpenBLAS chose its kernels when it loaded, before main: where it took a set older than this
// CPU's vector units (a CPU its build does not know) and OPENBLAS_CORETYPE is unset, the command
// runs again with it set (importing twell does the same for Python).
void reexec_with_blas_core(char** argv) {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if ((set != nullptr && *set != '\0') || twell::blas_core_advice().empty()) return;
  // Started through the dynamic loader (ld.so twell ...), /proc/self/exe is the loader: not again.
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return;
  self[len] = '\0';
  if (std::string(self).find("/ld-") != std::string::npos) return;
  if (setenv("OPENBLAS_CORETYPE", twell::blas_core_for_cpu().c_str(), 1) != 0) return;
  execv(self, argv);  // returns only where it failed: go on with the kernels there are
  unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char** argv) {
  reexec_with_blas_core(argv);
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || is_help(args[0]) || (args[0] == "help" && args.size() == 1)) {
    std::cout << twell::cli::kGlobalHelp;
    return 0;
  }
  // `twell help CMD` is `twell CMD --help`; anything after CMD is refused.
  const bool help = args[0] == "help";
  if (help && args.size() > 2) {
    g_prefix = "twell help";
    std::string got;
    for (size_t i = 1; i < args.size(); ++i) got += (i > 1 ? " " : "") + args[i];
    usage_error("arguments: expected one command (bench | check | info), got '" + got + "'");
  }
  const std::string name = help ? args[1] : args[0];
  const Command* cmd = nullptr;
  for (const Command& c : kCommands)
    if (name == c.name) cmd = &c;
  if (cmd == nullptr) usage_error("unknown command '" + name + "' (expected bench | check | info; see twell --help)");
  g_prefix = std::string("twell ") + cmd->name;
  const std::vector<std::string> rest(args.begin() + 1 + help, args.end());
  if (help || std::any_of(rest.begin(), rest.end(), is_help)) {
    std::cout << cmd->help;
    return 0;
  }
  try {
    return cmd->run(rest);
  } catch (const twell::Error& e) {  // what the library cannot run: the request was bad
    fail(e.what(), 2);
  } catch (const std::bad_alloc&) {
    fail("out of memory for this case", 2);
  } catch (const std::exception& e) {
    fail(e.what(), 1);
  }
}
