// The fp64 oracle: naive, dense, double-accumulating implementations of every op. Never optimised;
// fast paths are compared to it, never to each other.
#pragma once
#include <cstdint>
#include <vector>

#include "twell/ffn.hpp"
#include "twell/tensor.hpp"

namespace twell::reference {

struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Matrix() = default;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), v(size_t(r * c), 0.0) {}
  double& at(int64_t r, int64_t c) { return v[size_t(r * cols + c)]; }
  double at(int64_t r, int64_t c) const { return v[size_t(r * cols + c)]; }
};

// Reads any CPU float view (f32/f16/bf16, any strides) into doubles.
Matrix from_view(const TensorView& t);

struct Weights {
  FfnKind kind = FfnKind::gated;
  Matrix gate, up, down;  // [N, K] each (down neuron-major); gate empty for plain
};
Weights from_weights(const FfnWeights& w);

// The ReLU as torch.relu computes it: NaN stays NaN (NaN <= 0 is false); every other value <= 0,
// -0 and -Inf included, gives +0. A gate value is active (packed, ReLU derivative 1) when it is
// not <= 0: positive or NaN.
inline bool relu_active(double g) { return !(g <= 0); }
inline double relu(double g) { return relu_active(g) ? g : 0.0; }

// Dense semantics throughout: h = relu(g) * u is a product even where relu(g) = 0 (0 * Inf = NaN),
// and the products below skip a zero only against a finite operand, as a dense GEMM's result.
struct Forward {
  Matrix gate_pre;  // x Wg^T (gated) / x Wu^T (plain), [M, N]
  Matrix up;        // x Wu^T (gated only)
  Matrix h;         // hidden activation [M, N]
  Matrix y;         // [M, K]
};
Forward ffn_forward(const Weights& w, const Matrix& x);

struct Grads {
  Matrix dx, dgate, dup, ddown;  // dgate empty for plain; ddown neuron-major [N, K]
};
// Gradients of  <dy, y> + l1_coef * (1/M) sum |h|  w.r.t. x and the weights.
Grads ffn_backward(const Weights& w, const Matrix& x, const Matrix& dy, double l1_coef);

// Statistics (see training.hpp for the normalisation).
double l0_per_token(const Forward& f);  // mean count of active gate units per token
double l1_per_token(const Forward& f);  // mean over tokens of sum |h|

// Dead-neuron tracking over a token window: a neuron is dead if it was active for no token seen.
class DeadNeuronTracker {
 public:
  explicit DeadNeuronTracker(int64_t neurons) : hits_(size_t(neurons), 0) {}
  void observe(const Forward& f);
  int64_t tokens() const { return tokens_; }
  int64_t dead() const;
  double dead_fraction() const;
  void reset();

 private:
  std::vector<int64_t> hits_;
  int64_t tokens_ = 0;
};

// "Plain dense in dtype t": the same FFN with each GEMM output, the hidden activation and y
// rounded to t (fp32 accumulation), as a framework's dense bf16/fp16 layer computes it. Its error
// against ffn_forward sets the tolerance of the fast paths (docs/testing.md).
Matrix ffn_forward_rounded(const Weights& w, const Matrix& x, DType t);

// ||a - b||_F / ||b||_F (0 when both are zero; infinity when a has NaN/Inf).
double rel_error(const Matrix& a, const Matrix& b);

}  // namespace twell::reference
