// cuBLASLt calls. Row-major D [m, n] = A [m, k] B' is column-major D^T [n, m] = B'^T A^T, so the
// weight is cuBLAS's first operand and the activations its second:
//   weight [n, k] row-major = column-major [k, n] (ld k), used transposed  -> opA = T
//   weight [k, n] row-major = column-major [n, k] (ld n), used as is       -> opA = N
//   A [m, k] row-major      = column-major [k, m] (ld k)                   -> opB = N
//   D [m, n] row-major      = column-major [n, m] (ld n).
#include "cuda/runtime/lt_gemm.hpp"

#include <string>

#include "cuda/policy/config.hpp"
#include "cuda/runtime/cuda_check.hpp"

namespace twell::gpu {

namespace {

constexpr const char* kOp = "InferencePlan::run";
constexpr int kMaxAlign = 256;  // cuBLASLt's default (and largest) alignment assumption

// The largest power of two (<= 256) dividing the address: the heuristic must not assume more.
int alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int align = 1;
  while (align < kMaxAlign && u % uintptr_t(2 * align) == 0) align *= 2;
  return align;
}

void set_alignment(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                   int align) {
  const uint32_t v = uint32_t(align);
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v), kOp,
               "cuBLASLt alignment preference");
}

void destroy(LtPlan& p) {
  if (p.d != nullptr) cublasLtMatrixLayoutDestroy(p.d);
  if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
  if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
  if (p.op != nullptr) cublasLtMatmulDescDestroy(p.op);
  p = LtPlan{};
}

// Fills p (descriptors, algorithm) for the call; on failure p holds what must be destroyed.
void build(cublasLtHandle_t handle, cudaDataType_t type, const GemmCall& c, int align_a,
           int align_b, int align_d, LtPlan& p) {
  const bool transposed = c.layout == WeightLayout::n_by_k;
  const cublasOperation_t op_a = transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), kOp,
               "cuBLASLt matmul descriptor");
  check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
               kOp, "cuBLASLt transpose A");
  check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
               kOp, "cuBLASLt transpose B");

  const uint64_t m = uint64_t(c.m), n = uint64_t(c.n), k = uint64_t(c.k);
  if (transposed)
    check_cublas(cublasLtMatrixLayoutCreate(&p.a, type, k, n, int64_t(k)), kOp, "cuBLASLt layout");
  else
    check_cublas(cublasLtMatrixLayoutCreate(&p.a, type, n, k, int64_t(n)), kOp, "cuBLASLt layout");
  check_cublas(cublasLtMatrixLayoutCreate(&p.b, type, k, m, int64_t(k)), kOp, "cuBLASLt layout");
  check_cublas(cublasLtMatrixLayoutCreate(&p.d, type, n, m, c.ldd > 0 ? c.ldd : int64_t(n)), kOp,
               "cuBLASLt layout");

  // cuBLAS's A is our weight (b) and its B our activations (a).
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), kOp, "cuBLASLt preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  try {
    const size_t ws = LtConfig::kWorkspaceBytes;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof ws),
                 kOp, "cuBLASLt workspace preference");
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b);
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    check_cublas(cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.d, p.d, pref, 1, &result,
                                                &found),
                 kOp, "cuBLASLt heuristic");
  } catch (...) {
    cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0)
    throw Error(kOp, "cuBLASLt algorithm",
                "one for m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                    " k=" + std::to_string(c.k),
                "none");
  p.algo = result.algo;
}

}  // namespace

LtGemm::LtGemm(DType dtype) : type_(dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F) {
  check_cublas(cublasLtCreate(&handle_), "InferencePlan", "cuBLASLt handle");
}

LtGemm::~LtGemm() {
  clear();
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void LtGemm::clear() {
  for (auto& entry : plans_) destroy(entry.second);
  plans_.clear();
}

const LtPlan& LtGemm::plan_for(const GemmCall& c) {
  const Key key{c.id, c.m, c.ldd, alignment_of(c.a), alignment_of(c.b), alignment_of(c.d)};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  LtPlan p;
  try {
    build(handle_, type_, c, std::get<3>(key), std::get<4>(key), std::get<5>(key), p);
  } catch (...) {
    destroy(p);
    throw;
  }
  if (plans_.size() >= LtConfig::kMaxCachedPlans) clear();
  return plans_.emplace(key, p).first->second;
}

void LtGemm::run(const GemmCall& c, cudaStream_t s, void* workspace) {
  const LtPlan& p = plan_for(c);
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasLtMatmul(handle_, p.op, &alpha, c.b, p.a, c.a, p.b, &beta, c.d, p.d, c.d, p.d,
                              &p.algo, workspace, LtConfig::kWorkspaceBytes, s),
               kOp, "cuBLASLt matmul");
}

}  // namespace twell::gpu
