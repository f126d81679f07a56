// twell_l2_gather: the L2 gather ceiling of the row stage, on this GPU.
//
// The sparse path's dots and axpys kernels each read one weight row of K values per active entry,
// in random row order, from a weight matrix that stays in L2. This tool times only that: warps
// gather `entries` random rows of a [rows, k] bf16 matrix (16-byte loads, every byte XORed into a
// register so nothing is optimised away; no arithmetic beyond that), best of 10 passes per
// configuration with the matrix L2-warm, over a sweep of CTAs per SM and rows in flight per warp.
// Compare its best time with a row kernel's (ncu) to see how far that kernel is from the
// hardware's gather rate. Defaults: M = 16384 at 0.5% of N = 5632, K = 2048 (K: multiples of 2048).
//   twell_l2_gather [--rows N] [--k K] [--entries E] [--seed S]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "twell_l2_gather: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// Warp w gathers rows w * R .. w * R + R - 1, then strides by the grid's warps * R: R rows in
// flight per warp, 2048 columns (8 16-byte vectors per lane) at a time.
template <int R>
__global__ void gather_kernel(const uint4* __restrict__ w, int64_t row_vecs, const int32_t* __restrict__ idx,
                              int64_t n, uint32_t* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  uint32_t acc = 0;
  for (int64_t base = warp * R; base < n; base += warps * R) {
    for (int64_t v0 = 0; v0 < row_vecs; v0 += 8 * 32) {
      uint4 v[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4* p = w + idx[base + r < n ? base + r : base] * row_vecs + v0 + lane;
#pragma unroll
        for (int j = 0; j < 8; ++j) v[r][j] = __ldg(p + j * 32);
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc ^= v[r][j].x ^ v[r][j].y ^ v[r][j].z ^ v[r][j].w;
    }
  }
  if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads; practically never true
}

int64_t arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtoll(argv[i + 1], nullptr, 10);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = arg(argc, argv, "--rows", 5632), k = arg(argc, argv, "--k", 2048);
  const int64_t entries = arg(argc, argv, "--entries", 16384 * 5632 / 200);
  const auto seed = uint32_t(arg(argc, argv, "--seed", 1));
  if (rows < 1 || k < 2048 || k % 2048 != 0 || entries < 1) {
    std::fprintf(stderr, "twell_l2_gather: --rows >= 1, --k a multiple of 2048, --entries >= 1\n");
    return 2;
  }
  const int64_t row_vecs = k / 8;
  uint4* w = nullptr;
  int32_t* idx = nullptr;
  uint32_t* out = nullptr;
  check(cudaMalloc(&w, size_t(rows * k) * 2), "weights");
  check(cudaMemset(w, 1, size_t(rows * k) * 2), "weights");
  std::vector<int32_t> host(static_cast<size_t>(entries));
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(rows - 1));
  for (auto& r : host) r = pick(gen);
  check(cudaMalloc(&idx, host.size() * sizeof(int32_t)), "row list");
  check(cudaMemcpy(idx, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "row list");
  check(cudaMalloc(&out, sizeof(uint32_t)), "output");
  int sms = 0, dev = 0;
  check(cudaGetDevice(&dev), "device");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "device properties");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  const double bytes = double(entries) * double(k) * 2;
  std::printf("%s: %lld random rows of a [%lld, %lld] bf16 matrix (%.1f MB, L2 %.1f MB), %.2f GB per pass\n",
              prop.name, (long long)entries, (long long)rows, (long long)k, double(rows * k) * 2 / 1e6,
              prop.l2CacheSize / 1e6, bytes / 1e9);
  double best_us = 1e30;
  auto run = [&](auto kernel, int in_flight, int ctas_per_sm) {
    float best = 1e30f;
    for (int it = 0; it < 11; ++it) {  // the first pass warms L2
      check(cudaEventRecord(start), "event");
      kernel<<<unsigned(sms * ctas_per_sm), 128>>>(w, row_vecs, idx, entries, out);
      check(cudaEventRecord(stop), "event");
      check(cudaEventSynchronize(stop), "gather kernel");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "event");
      if (it > 0 && ms < best) best = ms;
    }
    const double us = double(best) * 1e3;
    if (us < best_us) best_us = us;
    std::printf("  %d CTAs of 4 warps per SM, %d rows in flight per warp: %8.1f us  %5.2f TB/s\n",
                ctas_per_sm, in_flight, us, bytes / (us * 1e-6) / 1e12);
  };
  for (int c : {2, 3, 4, 8}) {
    run(gather_kernel<1>, 1, c);
    run(gather_kernel<2>, 2, c);
    run(gather_kernel<4>, 4, c);
  }
  std::printf("best: %.1f us, %.2f TB/s\n", best_us, bytes / (best_us * 1e-6) / 1e12);
  cudaFree(w);
  cudaFree(idx);
  cudaFree(out);
  return 0;
}
