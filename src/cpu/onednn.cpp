// cpu/onednn.hpp. One oneDNN matmul primitive per problem shape, made on first use and kept per
// thread (the last few shapes). The guard is one pass over each row of x (its absolute sum and
// subnormals) and one over its row of g.
#include "cpu/onednn.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

#include "cpu/kernels.hpp"

#ifdef TWELL_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#include <cstring>
#endif

namespace twell::cpu {

#ifdef TWELL_WITH_ONEDNN
namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::matmul::primitive_desc matmul_desc(int64_t m, int64_t n, int64_t k, int64_t ldc) {
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  const md a({m, k}, dt::bf16, {k, 1}), b({k, n}, dt::bf16, {1, k}), c({m, n}, dt::f32, {ldc, 1});
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(engine(), a, b, c);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine());
#endif
}

// The calling thread's most recent primitives (a plan's blocks repeat a shape or two): making
// one again costs ~0.05 ms even where oneDNN's cache has it, a fifth of a 16-row GEMM here.
struct Made {
  int64_t m, n, k, ldc;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul mm;
};

const Made& made(int64_t m, int64_t n, int64_t k, int64_t ldc) {
  constexpr size_t kKept = 8;
  thread_local std::vector<Made> kept;
  for (const Made& p : kept)
    if (p.m == m && p.n == n && p.k == k && p.ldc == ldc) return p;
  auto pd = matmul_desc(m, n, k, ldc);
  dnnl::matmul mm(pd);
  if (kept.size() == kKept) kept.erase(kept.begin());
  kept.push_back(Made{m, n, k, ldc, pd, mm});
  return kept.back();
}

}  // namespace

bool bf16_gemm_available() {
  static const bool ok = [] {
    try {
      const char* impl = matmul_desc(16, 64, 64, 64).impl_info_str();
      return impl != nullptr && std::strstr(impl, "ref") == nullptr;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

bool gemm_nt_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, float* c,
                  int64_t ldc) {
  if (!bf16_gemm_available()) return false;
  if (m == 0 || n == 0) return true;
  try {
    const Made& p = made(m, n, k, ldc);
    thread_local dnnl::stream s(engine());
    dnnl::memory am(p.pd.src_desc(), engine(), const_cast<uint16_t*>(a));
    dnnl::memory bm(p.pd.weights_desc(), engine(), const_cast<uint16_t*>(b));
    dnnl::memory cm(p.pd.dst_desc(), engine(), c);
    p.mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}
#else
bool bf16_gemm_available() { return false; }
bool gemm_nt_bf16(int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*, float*, int64_t) {
  return false;
}
#endif

int64_t bf16_gate_guard(int64_t rows, int64_t n, int64_t k, const float* xf, const uint16_t* w,
                        float* g) {
  int64_t again = 0;
#pragma omp parallel for schedule(static) reduction(+ : again)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = xf + r * k;
    float* grow = g + r * n;
    double sum = 0.0;
    bool subnormal = false;
    for (int64_t i = 0; i < k; ++i) {
      sum += std::fabs(double(x[i]));
      subnormal = subnormal || std::fpclassify(x[i]) == FP_SUBNORMAL;
    }
    // A zero row: every product is 0 (or NaN for a non-finite weight), nothing to flush. NaN or
    // infinite x: every value of g is NaN or infinite, the comparison below false for them all.
    if (!subnormal && sum == 0.0) continue;
    const double bound = std::ldexp(sum + 2.0 * double(k), -126 + 24);
    for (int64_t c = 0; c < n; ++c) {
      if (!subnormal && !(std::fabs(double(grow[c])) < bound)) continue;
      grow[c] = dot(x, w + c * k, k);  // the row's bits widened as read
      ++again;
    }
  }
  return again;
}

}  // namespace twell::cpu
