// Shared helpers of the CUDA test files (compiled only with the CUDA backend): device presence,
// error checks, and a device buffer that uploads, downloads and poisons synchronously.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <functional>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace twell::test {

// A dispatch mode in test names.
inline std::string dispatch_name(Dispatch d) {
  switch (d) {
    case Dispatch::automatic: return "auto";
    case Dispatch::force_sparse: return "sparse";
    case Dispatch::force_dense: return "dense";
  }
  return "unknown";
}

// TWELL_SMALL=1: small shapes only (the sanitizer runs of scripts/gpu-check).
inline bool small_only() {
  const char* s = std::getenv("TWELL_SMALL");
  return s != nullptr && *s != '\0' && *s != '0';
}

// A test case (either CUDA test's Case: kind, dtype, pattern, density, shape, tile and capacity;
// tile and capacity 0 are the backend's defaults) with its other fields defaulted.
template <typename Case>
Case problem_case(FfnKind kind, DType dtype, Pattern pattern, double density, int64_t m, int64_t k,
                  int64_t n, int32_t tile = 0, int32_t capacity = 0) {
  Case c;
  c.kind = kind;
  c.dtype = dtype;
  c.pattern = pattern;
  c.density = density;
  c.m = m;
  c.k = k;
  c.n = n;
  c.tile = tile;
  c.capacity = capacity;
  return c;
}

// A case's problem as one table row (lists of cases read as tables).
struct CaseShape {
  FfnKind kind;
  DType dtype;
  Pattern pattern;
  double density;
  int64_t m, k, n;
};
template <typename Case>
Case problem_case(const CaseShape& s) {
  return problem_case<Case>(s.kind, s.dtype, s.pattern, s.density, s.m, s.k, s.n);
}

// The problem of a case, with a seed from the session seed and `salt`.
template <typename Case>
ProblemSpec spec_of(const Case& c, uint64_t salt) {
  ProblemSpec s;
  s.kind = c.kind;
  s.dtype = c.dtype;
  s.pattern = c.pattern;
  s.density = c.density;
  s.m = c.m;
  s.k = c.k;
  s.n = c.n;
  s.seed = seed(salt);
  return s;
}

// Elements of a host buffer of 16-bit floats (bf16 or f16) that are NaN or infinite: outputs poisoned
// with 0xff bytes that a kernel never wrote read as NaN.
inline int64_t count_nonfinite(const std::vector<uint8_t>& bytes, DType t) {
  const uint16_t exponent = t == DType::bf16 ? 0x7f80 : 0x7c00;
  int64_t bad = 0;
  const size_t n = bytes.size() / 2;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + 2 * i, 2);
    bad += (v & exponent) == exponent;
  }
  return bad;
}

// Free memory on the current device, in bytes.
inline size_t device_free_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
  return free_bytes;
}

inline bool has_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define TWELL_REQUIRE_DEVICE() \
  if (!has_device()) GTEST_SKIP() << "no CUDA device"

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) cuda_ok(cudaMalloc(&p_, bytes_), "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<uint8_t>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }

  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }
  // Complete before returning, so work on any stream (non-blocking ones too) sees them.
  void upload(const std::vector<uint8_t>& host) {
    if (bytes_ == 0) return;
    cuda_ok(cudaMemcpy(p_, host.data(), std::min(bytes_, host.size()), cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaDeviceSynchronize(), "upload");
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> host(bytes_);
    if (bytes_ > 0) cuda_ok(cudaMemcpy(host.data(), p_, bytes_, cudaMemcpyDeviceToHost), "download");
    return host;
  }
  void poison() {
    if (bytes_ == 0) return;
    cuda_ok(cudaMemset(p_, 0xff, bytes_), "poison");
    cuda_ok(cudaDeviceSynchronize(), "poison");
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Runs f, expecting a twell::Error that names `argument`.
inline void expect_error(const std::function<void()>& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no Error for " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

// Gated bf16/fp16 weights [n, k] in one device buffer (each 256-byte aligned), contents unset.
inline FfnWeights device_weights(DType dt, int64_t n, int64_t k, DeviceBuffer& storage) {
  storage = DeviceBuffer(size_t(3 * n * k) * dtype_size(dt) + 256);
  char* p = static_cast<char*>(storage.get());
  const size_t bytes = size_t(n * k) * dtype_size(dt);
  const size_t step = (bytes + 255) / 256 * 256;
  FfnWeights w;
  w.kind = FfnKind::gated;
  w.gate = TensorView::matrix(p, dt, n, k, Device::cuda(0));
  w.up = TensorView::matrix(p + step, dt, n, k, Device::cuda(0));
  w.down = TensorView::matrix(p + 2 * step, dt, n, k, Device::cuda(0));
  return w;
}

// Replaces a device fixture's problem (D: x, gate, up, down buffers and the host Problem p) with
// one of the same shapes, uploading its x and weights into the same buffers (plans keep pointing
// at them).
template <typename D>
void load_problem(D& d, testing::Problem p) {
  d.p = std::move(p);
  d.x.upload(d.p.x);
  if (d.p.spec.kind == FfnKind::gated) d.gate.upload(d.p.gate);
  d.up.upload(d.p.up);
  d.down.upload(d.p.down);
}

// Views of a problem's weights uploaded to device 0 (gate unused for a plain FFN).
inline FfnWeights device_weights_of(const ProblemSpec& s, const DeviceBuffer& gate, const DeviceBuffer& up,
                                    const DeviceBuffer& down) {
  const Device dev = Device::cuda(0);
  FfnWeights w;
  w.kind = s.kind;
  if (s.kind == FfnKind::gated) w.gate = TensorView::matrix(gate.get(), s.dtype, s.n, s.k, dev);
  w.up = TensorView::matrix(up.get(), s.dtype, s.n, s.k, dev);
  w.down = TensorView::matrix(down.get(), s.dtype, s.n, s.k, dev);
  return w;
}

// A problem with its tensors on device 0.
struct DeviceProblem {
  Problem p;
  DeviceBuffer x, gate, up, down, y, counters;

  explicit DeviceProblem(const ProblemSpec& spec)
      : p(testing::make_problem(spec)),
        x(p.x),
        up(p.up),
        down(p.down),
        y(std::max<size_t>(p.x.size(), 16)),
        counters(2 * sizeof(int64_t)) {
    if (spec.kind == FfnKind::gated) gate = DeviceBuffer(p.gate);
  }
  FfnWeights weights() const { return device_weights_of(p.spec, gate, up, down); }
  InferenceArgs args(bool with_counters = true) const {
    const Device dev = Device::cuda(0);
    const ProblemSpec& s = p.spec;
    InferenceArgs a;
    a.x = TensorView::matrix(x.get() ? x.get() : y.get(), s.dtype, s.m, s.k, dev);
    a.y = TensorView::matrix(y.get(), s.dtype, s.m, s.k, dev);
    if (with_counters) a.counters = TensorView::vector(counters.get(), DType::i64, 2, dev);
    return a;
  }
  std::vector<uint8_t> y_host() const {
    auto h = y.download();
    h.resize(p.x.size());
    return h;
  }
  std::array<int64_t, 2> counters_host() const {
    std::array<int64_t, 2> c{};
    cuda_ok(cudaMemcpy(c.data(), counters.get(), sizeof c, cudaMemcpyDeviceToHost), "counters");
    return c;
  }
};

struct Outcome {
  std::vector<uint8_t> y;
  RunInfo info;
  std::array<int64_t, 2> counters{};
};

// Poisons y and the counters, runs on the per-thread default stream, waits, downloads.
inline Outcome run_once(InferencePlan& plan, DeviceProblem& d) {
  d.y.poison();
  d.counters.poison();
  plan.run(d.args(), nullptr);
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "run");
  return {d.y_host(), plan.last_run(), d.counters_host()};
}

// On oracle_rows, or on `rows` where given.
inline void expect_matches_oracle(DeviceProblem& d, const std::vector<uint8_t>& y, const std::string& what,
                           const std::vector<int64_t>* rows = nullptr) {
  const ForwardCheck c =
      rows != nullptr ? testing::check_forward_rows(d.p, y.data(), *rows) : check_forward(d.p, y.data());
  EXPECT_LE(c.error, c.tolerance) << what << ": " << d.p.spec.describe();
  EXPECT_TRUE(c.zero_rows_exact) << what << ": rows with a zero reference are not exactly zero: "
                                 << d.p.spec.describe();
}

}  // namespace twell::test
