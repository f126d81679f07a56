#include "workload.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include "twell/error.hpp"

namespace twell::testing {

namespace {

double normal_tail_quantile(double p) {  // t with P(Z > t) = p, by bisection on erfc
  if (p <= 0) return 40;
  if (p >= 1) return -40;
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double tail(double t) { return 0.5 * std::erfc(t / std::sqrt(2.0)); }

// The expected density at threshold multiplier a: a strided sample of up to ~256 rows, and the
// `first` rows that start a sequence (rows 0, 1024, 2048, ...: trained_like from M = 1024 up)
// apart, weighted by their share of the rows, which a strided sample would over- or under-count.
double expected_density(const std::vector<double>& t, const std::vector<double>& scale, double a,
                        int64_t first) {
  const int64_t m = int64_t(scale.size()), n = int64_t(t.size()), nstep = std::max<int64_t>(1, n / 512);
  auto row_mean = [&](double sc) {
    double sum = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i += nstep, ++cnt) sum += tail(a * t[size_t(i)] / sc);
    return sum / double(cnt);
  };
  double rest = 0;
  int64_t cnt = 0;
  const int64_t stride = std::max<int64_t>(1, (m - first) / 256);
  for (int64_t r = first ? 1 : 0; r < m; r += stride)
    if (!first || r % 1024 != 0) rest += row_mean(scale[size_t(r)]), ++cnt;
  const double others = cnt ? rest / double(cnt) : 0.0;
  return ((first ? double(first) * row_mean(scale[0]) : 0.0) + double(m - first) * others) / double(m);
}

}  // namespace

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::uniform: return "uniform";
    case Pattern::heavy_tailed: return "heavy_tailed";
    case Pattern::trained_like: return "trained_like";
    case Pattern::edge_rows: return "edge_rows";
    case Pattern::all_zero: return "all_zero";
    case Pattern::all_dense: return "all_dense";
    case Pattern::captured: return "captured";
  }
  return "?";
}

Pattern parse_pattern(const std::string& s) {
  for (Pattern p : {Pattern::uniform, Pattern::heavy_tailed, Pattern::trained_like, Pattern::edge_rows,
                    Pattern::all_zero, Pattern::all_dense})
    if (s == pattern_name(p)) return p;
  throw Error("parse_pattern", "pattern", "uniform, heavy_tailed, trained_like, edge_rows, all_zero or all_dense",
              s);
}

std::string ProblemSpec::describe() const {
  char buf[200];
  if (pattern == Pattern::captured) {  // its density is the model's, known once run
    std::snprintf(buf, sizeof buf, "%s %s M=%lld K=%lld N=%lld captured", ffn_kind_name(kind), dtype_name(dtype),
                  (long long)m, (long long)k, (long long)n);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%s %s M=%lld K=%lld N=%lld %s %.3g%% seed=%llu",
                ffn_kind_name(kind), dtype_name(dtype), (long long)m, (long long)k, (long long)n,
                pattern_name(pattern), density * 100, (unsigned long long)seed);
  return buf;
}

TensorView Problem::x_view() {
  return TensorView::matrix(x.data(), spec.dtype, spec.m, spec.k);
}

FfnWeights Problem::weights() {
  FfnWeights w;
  w.kind = spec.kind;
  if (spec.kind == FfnKind::gated) w.gate = TensorView::matrix(gate.data(), spec.dtype, spec.n, spec.k);
  w.up = TensorView::matrix(up.data(), spec.dtype, spec.n, spec.k);
  w.down = TensorView::matrix(down.data(), spec.dtype, spec.n, spec.k);
  return w;
}

// Per-neuron ReLU thresholds (the gate's bias channel) giving the pattern's density, and per-token
// scales of x (heavy-tailed: lognormal rates per neuron, a few tokens 10-40x denser).
struct ThresholdsAndScales {
  std::vector<double> t, scale;
};

ThresholdsAndScales thresholds_and_scales(const ProblemSpec& spec, std::mt19937_64& rng) {
  const int64_t m = spec.m, n = spec.n;
  std::normal_distribution<double> z(0.0, 1.0);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  ThresholdsAndScales out;
  std::vector<double>& t = out.t;
  std::vector<double>& scale = out.scale;
  t.assign(static_cast<size_t>(n), 0.0);
  scale.assign(size_t(m), 1.0);
  const double d = std::clamp(spec.density, 0.0, 1.0);
  // trained_like rows that start a sequence (every 1024th) in problems of whole sequences (M >= 1024:
  // prefill, training); fewer rows are decoding steps, later tokens.
  const int64_t first = spec.pattern == Pattern::trained_like && m >= 1024 ? (m + 1023) / 1024 : 0;
  if (spec.pattern == Pattern::heavy_tailed || spec.pattern == Pattern::trained_like) {
    std::vector<double> rate(static_cast<size_t>(n));
    if (spec.pattern == Pattern::heavy_tailed) {
      for (auto& r : rate) r = std::min(0.5, d * std::exp(1.5 * z(rng) - 1.125));
      for (auto& s : scale) s = u01(rng) < 0.03 ? 1.8 + 1.4 * u01(rng) : std::exp(0.25 * z(rng));
    } else {
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
      std::shuffle(order.begin(), order.end(), rng);
      double harmonic = 0;
      for (int64_t i = 1; i <= n; ++i) harmonic += 1.0 / double(i);
      for (int64_t i = 0; i < n; ++i)
        rate[size_t(order[size_t(i)])] = std::min(0.5, d * double(n) / (harmonic * double(i + 1)));
      for (int64_t r = 0; r < m; ++r) scale[size_t(r)] = first && r % 1024 == 0 ? 3.0 : std::exp(0.2 * z(rng));
    }
    for (int64_t i = 0; i < n; ++i) t[size_t(i)] = normal_tail_quantile(rate[size_t(i)]);
    // Scale all thresholds so the expected mean density is d (bisection on the multiplier).
    double lo = 0.05, hi = 20;
    for (int it = 0; it < 60 && m > 0; ++it) {
      const double a = 0.5 * (lo + hi);
      const double mean = expected_density(t, scale, a, first);
      (mean > d ? lo : hi) = a;
    }
    for (auto& v : t) v *= 0.5 * (lo + hi);
  } else {
    std::fill(t.begin(), t.end(), normal_tail_quantile(d));
  }
  return out;
}

Problem make_problem(const ProblemSpec& spec) {
  if (spec.k < 4) throw Error("make_problem", "K", ">= 4 (three control channels)", std::to_string(spec.k));
  if (spec.m < 0 || spec.n < 1) throw Error("make_problem", "M, N", "M >= 0, N >= 1", "other");
  if (spec.pattern == Pattern::captured)
    throw Error("make_problem", "pattern", "a generated pattern (captured problems: load_capture)", "captured");
  const int64_t m = spec.m, k = spec.k, n = spec.n, kr = k - 3;  // kr: random channels
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);

  // Per-neuron thresholds and per-token scales.
  const ThresholdsAndScales ts = thresholds_and_scales(spec, rng);
  const std::vector<double>& t = ts.t;
  const std::vector<double>& scale = ts.scale;
  double tmax = 0;
  for (double v : t) tmax = std::max(tmax, std::fabs(v));
  const double a = tmax + 4, b = tmax + 4;

  // Row roles.
  enum Role : uint8_t { normal, zero, dense, hot };
  std::vector<uint8_t> role(static_cast<size_t>(m), normal);
  Problem p;
  p.spec = spec;
  for (int64_t r = 0; r < m; ++r) {
    if (spec.pattern == Pattern::all_zero) role[size_t(r)] = zero;
    if (spec.pattern == Pattern::all_dense) role[size_t(r)] = dense;
    if (spec.pattern == Pattern::edge_rows) {
      const double q = u01(rng);
      role[size_t(r)] = q < 0.06 ? zero : q < 0.12 ? dense : q < 0.18 ? hot : normal;
      if (m <= 4 && r == 0) role[0] = hot;  // tiny M still exercises a routed row
    }
    if (role[size_t(r)] != normal) p.special_rows.push_back(r);
  }

  const size_t es = dtype_size(spec.dtype);
  p.x.resize(size_t(m * k) * es);
  p.gate.resize(spec.kind == FfnKind::gated ? size_t(n * k) * es : 0);
  p.up.resize(size_t(n * k) * es);
  p.down.resize(size_t(n * k) * es);
  const double wscale = 1.0 / std::sqrt(double(kr));
  const int64_t hot_end = std::min<int64_t>(n, spec.hot_tile);
  // Each row of each tensor draws from its own stream, so generation runs in parallel and the
  // result does not depend on the thread count.
  auto row_rng = [&](uint64_t tensor, int64_t row) {
    return std::mt19937_64(spec.seed * 0x9e3779b97f4a7c15ull + tensor * 0xbf58476d1ce4e5b9ull +
                           uint64_t(row) * 0x94d049bb133111ebull);
  };
  auto fill_first = [&](std::vector<uint8_t>& w) {  // gate (gated) or up (plain)
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      std::mt19937_64 r = row_rng(1, i);
      std::normal_distribution<double> zr(0.0, 1.0);
      for (int64_t c = 0; c < kr; ++c) store_float(w.data(), spec.dtype, i * k + c, float(zr(r) * wscale));
      store_float(w.data(), spec.dtype, i * k + kr, float(a));
      store_float(w.data(), spec.dtype, i * k + kr + 1, float(i < hot_end ? b : -b));
      store_float(w.data(), spec.dtype, i * k + kr + 2, float(-t[size_t(i)]));
    }
  };
  auto fill_random = [&](std::vector<uint8_t>& w, double sc, uint64_t tensor) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      std::mt19937_64 r = row_rng(tensor, i);
      std::normal_distribution<double> zr(0.0, 1.0);
      for (int64_t c = 0; c < k; ++c) store_float(w.data(), spec.dtype, i * k + c, float(zr(r) * sc));
    }
  };
  if (spec.kind == FfnKind::gated) {
    fill_first(p.gate);
    fill_random(p.up, wscale, 2);
  } else {
    fill_first(p.up);
  }
  fill_random(p.down, 1.0 / std::sqrt(std::max(1.0, std::clamp(spec.density, 0.0, 1.0) * double(n))), 3);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    std::mt19937_64 rr = row_rng(4, r);
    std::normal_distribution<double> zr(0.0, 1.0);
    const Role ro = Role(role[size_t(r)]);
    const double sc = ro == normal ? scale[size_t(r)] : 0.1;
    for (int64_t c = 0; c < kr; ++c) store_float(p.x.data(), spec.dtype, r * k + c, float(zr(rr) * sc));
    store_float(p.x.data(), spec.dtype, r * k + kr, ro == dense ? 1.f : ro == zero ? -1.f : 0.f);
    store_float(p.x.data(), spec.dtype, r * k + kr + 1, ro == hot ? 1.f : 0.f);
    store_float(p.x.data(), spec.dtype, r * k + kr + 2, ro == normal ? 1.f : ro == hot ? 1.f : 0.f);
  }
  return p;
}

uint64_t session_seed() {
  if (const char* s = std::getenv("TWELL_SEED")) return std::strtoull(s, nullptr, 10);
  return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^ 0x9e3779b97f4a7c15ull;
}

}  // namespace twell::testing
