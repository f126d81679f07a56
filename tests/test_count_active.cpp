// count_active (twell/ffn.hpp) against a scalar oracle on the values as floats (!(v <= 0)): random
// bit patterns of every dtype (NaNs of either sign, infinities, zeros of either sign, subnormals
// among them), every size class (empty, a few, the calling thread's, the parallel split), any
// thread count (above 2^22 values the count is split over the threads); and the arguments it
// must refuse.
#include <cstring>
#include <random>

#include "common.hpp"

namespace twell::test {
namespace {

float value_of(const void* p, DType t, int64_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, static_cast<const uint32_t*>(p) + i, 4);
    return f;
  }
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return t == DType::bf16 ? to_float(bf16{b}) : to_float(f16{b});
}

// n values of dtype t: random bits, with the special values planted at random places.
std::vector<uint8_t> random_values(DType t, int64_t n, uint64_t s) {
  const size_t size = dtype_size(t);
  std::vector<uint8_t> buf(size_t(n) * size);
  std::mt19937_64 rng(s);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    std::memcpy(buf.data() + size_t(i) * size, &r, size);
  }
  const uint32_t specials32[] = {0u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                 0x7f800001u, 0xff800001u, 0x00000001u, 0x80000001u};
  const uint16_t specials16[] = {0, 0x8000, 0x7f80, 0xff80, 0x7c00, 0xfc00, 0x7fc0, 0xffc0, 0x7e00,
                                 0xfe00, 0x7c01, 0xfc01, 0x0001, 0x8001};
  for (int64_t j = 0; j < n / 3; ++j) {
    const int64_t i = int64_t(rng() % uint64_t(n));
    if (size == 4)
      std::memcpy(buf.data() + size_t(i) * 4, &specials32[rng() % 10], 4);
    else
      std::memcpy(buf.data() + size_t(i) * 2, &specials16[rng() % 14], 2);
  }
  return buf;
}

int64_t oracle(const void* p, DType t, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += !(value_of(p, t, i) <= 0.0f);
  return c;
}

TEST(CountActive, EqualsTheOracleOnEveryDtypeSizeAndThreadCount) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(5632 * 3 + 5), int64_t(300001),
                      (int64_t(1) << 22) + 7}) {
      auto buf = random_values(t, n, seed(uint64_t(n) * 3 + uint64_t(t)));
      const int64_t want = oracle(buf.data(), t, n);
      for (int threads : {1, 2, 3}) {
        set_cpu_threads(threads);
        EXPECT_EQ(count_active(TensorView::vector(buf.data(), t, n)), want)
            << dtype_name(t) << " n " << n << " threads " << threads;
        // a [rows, cols] view of the same memory counts the same
        if (n % 7 == 0)
          EXPECT_EQ(count_active(TensorView::matrix(buf.data(), t, 7, n / 7)), want);
      }
      set_cpu_threads(0);
    }
  }
}

TEST(CountActive, EmptyTensorsCountNothing) {
  EXPECT_EQ(count_active(TensorView::matrix(nullptr, DType::bf16, 0, 5632)), 0);
  EXPECT_EQ(count_active(TensorView::vector(nullptr, DType::f32, 0)), 0);
}

TEST(CountActive, RefusesWhatItCannotCount) {
  std::vector<float> v(64, 1.0f);
  expect_named_error([&] { count_active(TensorView{}); }, "values", "a tensor");
  expect_named_error([&] { count_active(TensorView::vector(v.data(), DType::i32, 64)); }, "values",
                     "float32");
  expect_named_error(
      [&] { count_active(TensorView::vector(v.data(), DType::f32, 64, Device::cuda(0))); }, "values",
      "host");
  TensorView strided = TensorView::matrix(v.data(), DType::f32, 8, 4);
  strided.stride = {8, 1};  // every other group of four: not contiguous
  expect_named_error([&] { count_active(strided); }, "values", "contiguous");
  expect_named_error(
      [&] { count_active(TensorView::vector(reinterpret_cast<char*>(v.data()) + 2, DType::f32, 8)); },
      "values");
}

}  // namespace
}  // namespace twell::test
