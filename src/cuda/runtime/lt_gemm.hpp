// The three dense products of an FFN through cuBLASLt (16-bit in and out, fp32 accumulation),
// described row-major:  D [m, n] = A [m, k] . B',  B' = B^T for B [n, k] (nn.Linear) or B for
// B [k, n]. cuBLASLt is column-major, so the call computes D^T = B'^T A^T (see lt_gemm.cpp).
// No epilogue: cuBLASLt documents its ReLU epilogue as max(x, 0), which need not keep NaN, so the
// ReLU is twell's own, applied where G is read (relu in element.cuh).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "cuda/runtime/no_copy.hpp"
#include "twell/dtype.hpp"

namespace twell::gpu {

enum class GemmId : uint8_t { gate, up, down, grad_hidden, grad_input };  // one cached algorithm each
enum class WeightLayout : uint8_t {
  n_by_k,  // B [n, k]: D = A B^T (gate and up weights)
  k_by_n,  // B [k, n]: D = A B   (the neuron-major down weight)
};

struct GemmCall {
  GemmId id = GemmId::gate;
  WeightLayout layout = WeightLayout::n_by_k;
  int64_t m = 0, n = 0, k = 0;   // all operands contiguous row-major
  const void* a = nullptr;       // [m, k] activations
  const void* b = nullptr;       // weight, see layout
  void* d = nullptr;             // [m, n] output
  int64_t ldd = 0;               // D's row stride in elements (0: n)
};

// D [m, n] = A [m, k] B^T for B [n, k] (nn.Linear's weight: the gate and up products).
inline GemmCall linear_call(GemmId id, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                            void* d) {
  GemmCall c;
  c.id = id;
  c.layout = WeightLayout::n_by_k;
  c.m = m;
  c.n = n;
  c.k = k;
  c.a = a;
  c.b = b;
  c.d = d;
  return c;
}

// D [m, n] = A [m, k] B for B [k, n] (the neuron-major down weight, stacked weights).
inline GemmCall matmul_call(GemmId id, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
                            void* d) {
  GemmCall c = linear_call(id, m, n, k, a, b, d);
  c.layout = WeightLayout::k_by_n;
  return c;
}

// Descriptors and the heuristic's algorithm for one (product, m, operand alignments).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

class LtGemm : NoCopy {
 public:
  explicit LtGemm(DType dtype);
  ~LtGemm();

  // Enqueues the product on s; workspace holds LtConfig::kWorkspaceBytes bytes.
  void run(const GemmCall& c, cudaStream_t s, void* workspace);

 private:
  using Key = std::tuple<GemmId, int64_t, int64_t, int, int, int>;  // id, m, ldd, alignments of a, b, d
  const LtPlan& plan_for(const GemmCall& c);
  void clear();

  cudaDataType_t type_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, LtPlan> plans_;
};

}  // namespace twell::gpu
