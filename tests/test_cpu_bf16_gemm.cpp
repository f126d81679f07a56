// The CPU's bfloat16 gate GEMM (cpu/onednn.hpp): oneDNN's bf16 kernels flush subnormal inputs,
// products and sums; with bf16_gate_guard every value must stay within what an fp32 dot product
// of the same bf16 values may round to: |g - exact| <= 2k 2^-24 sum_k |x w| + k 2^-149 (the last
// term: fp32's own gradual underflow). Inputs that make the flushing visible: rows of subnormal
// values, rows of tiny normal values whose products are subnormal, a subnormal entry in a normal
// row, zero rows; weights with subnormal entries and rows of tiny values. Skipped where the build
// or the CPU has no bf16 GEMM (the fp32 path then runs, which the oracle suites cover).
#include <cmath>
#include <cstring>
#include <random>

#include "common.hpp"
#include "cpu/onednn.hpp"

namespace twell::test {
namespace {

uint16_t bf16_bits(float f) { return to_bf16(f).bits; }
double value(uint16_t b) { return double(to_float(bf16{b})); }

TEST(CpuBf16Gemm, FlushedValuesAreComputedAgain) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << "no bfloat16 GEMM in this build or on this CPU";
  const int64_t m = 40, k = 96, n = 300;
  std::mt19937_64 rng(seed(4242));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto subnormal = [&] { return uint16_t((rng() & 1 ? 0x8000 : 0) | (1 + rng() % 0x7f)); };
  std::vector<uint16_t> x(size_t(m * k)), w(size_t(n * k));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      uint16_t& b = x[size_t(r * k + i)];
      switch (r % 6) {
        case 0: b = bf16_bits(normal(rng)); break;
        case 1: b = subnormal(); break;                                      // all subnormal
        case 2: b = bf16_bits(std::ldexp(normal(rng), -110)); break;         // tiny normal
        case 3: b = bf16_bits(std::ldexp(normal(rng), -122)); break;         // tinier, some subnormal
        case 4: b = 0; break;                                                // zero row
        default: b = i == 7 ? subnormal() : bf16_bits(normal(rng)); break;  // one subnormal entry
      }
    }
  }
  for (int64_t c = 0; c < n; ++c)
    for (int64_t i = 0; i < k; ++i) {
      float v = 0.1f * normal(rng);
      if (c % 7 == 3) v = std::ldexp(v, -20);  // rows of tiny weights: products with tiny x subnormal
      uint16_t b = bf16_bits(v);
      if (rng() % 20 == 0) b = subnormal();
      w[size_t(c * k + i)] = b;
    }
  std::vector<float> xf(size_t(m * k)), g(size_t(m * n), 7.0f), unguarded;
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = float(value(x[i]));
  ASSERT_TRUE(cpu::gemm_nt_bf16(m, n, k, x.data(), w.data(), g.data(), n));
  unguarded = g;
  const int64_t again = cpu::bf16_gate_guard(m, n, k, xf.data(), w.data(), g.data());
  int64_t flushed = 0;  // values the unguarded GEMM got wrong: the test can fail without the guard
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double exact = 0, mass = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double p = value(x[size_t(r * k + i)]) * value(w[size_t(c * k + i)]);
        exact += p;
        mass += std::fabs(p);
      }
      const double bound = 2.0 * double(k) * std::ldexp(mass, -24) + double(k) * std::ldexp(1.0, -149);
      EXPECT_LE(std::fabs(double(g[size_t(r * n + c)]) - exact), bound)
          << "row " << r << " (kind " << r % 6 << "), column " << c;
      flushed += std::fabs(double(unguarded[size_t(r * n + c)]) - exact) > bound;
    }
  EXPECT_GT(flushed, 0) << "no value was flushed: the inputs no longer test the guard";
  EXPECT_GE(again, flushed);
  // Ordinary rows (no subnormal x, nothing near zero) are left as the GEMM gave them.
  std::vector<float> g0(size_t(6 * n));
  std::vector<uint16_t> x0(x.begin(), x.begin() + k);  // row 0: normal values
  std::vector<float> xf0(xf.begin(), xf.begin() + k);
  ASSERT_TRUE(cpu::gemm_nt_bf16(1, n, k, x0.data(), w.data(), g0.data(), n));
  EXPECT_EQ(cpu::bf16_gate_guard(1, n, k, xf0.data(), w.data(), g0.data()), 0);
}

TEST(CpuBf16Gemm, NonFiniteRowsKeepTheirNaNs) {
  if (!cpu::bf16_gemm_available()) GTEST_SKIP() << "no bfloat16 GEMM in this build or on this CPU";
  const int64_t m = 3, k = 32, n = 20;
  std::vector<uint16_t> x(size_t(m * k), bf16_bits(0.5f)), w(size_t(n * k), bf16_bits(0.25f));
  x[0] = 0x7fc0;                   // NaN in row 0
  x[k] = 0x7f80;                   // +Inf in row 1
  x[k + 1] = 0xff80;               // and -Inf: Inf - Inf = NaN
  std::vector<float> xf(size_t(m * k)), g(size_t(m * n));
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = float(value(x[i]));
  ASSERT_TRUE(cpu::gemm_nt_bf16(m, n, k, x.data(), w.data(), g.data(), n));
  cpu::bf16_gate_guard(m, n, k, xf.data(), w.data(), g.data());
  for (int64_t c = 0; c < n; ++c) {
    EXPECT_TRUE(std::isnan(g[size_t(c)]));
    EXPECT_TRUE(std::isnan(g[size_t(n + c)]));
    EXPECT_FLOAT_EQ(g[size_t(2 * n + c)], 0.125f * float(k));
  }
}

}  // namespace
}  // namespace twell::test
