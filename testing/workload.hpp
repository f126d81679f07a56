// Synthetic FFN problems whose hidden activations have a chosen sparsity pattern, produced by the
// real GEMMs (not by masking): x and the first weight get three control channels.
//   channel K-1: bias (x = 1, weight = -t_n)  -> density of neuron n is 1 - Phi(t_n / scale_m)
//   channel K-2: hot tile (weight +b inside the hot tile, -b outside; x = 1 on hot rows only)
//   channel K-3: density switch (weight +a; x = +1 on dense rows, -1 on all-zero rows)
// Shared by the tests, the benchmark harness and the CLI.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "twell/ffn.hpp"
#include "twell/tensor.hpp"

namespace twell::testing {

enum class Pattern : uint8_t {
  uniform,       // every neuron fires with probability `density`, independently per token
  heavy_tailed,  // lognormal per-neuron rates, per-token scale (some tokens 10-40x denser)
  trained_like,  // as a trained ReLU model's: neuron rates by Zipf's law over a random order
                 // (rate ~ 1 / rank, the first ones capped at 50%); from M = 1024 rows up,
                 // the first token of every 1024 (a sequence's first) far denser than the rest
  edge_rows,     // uniform plus all-zero rows, fully dense rows and single-hot-tile rows
  all_zero,      // no neuron fires
  all_dense,     // every neuron fires
  captured,      // activations captured from a model (capture.hpp), never generated
};
const char* pattern_name(Pattern p);
Pattern parse_pattern(const std::string& s);  // throws Error for an unknown name

struct ProblemSpec {
  FfnKind kind = FfnKind::gated;
  int64_t m = 16, k = 64, n = 300;
  DType dtype = DType::f32;
  Pattern pattern = Pattern::uniform;
  double density = 0.05;   // mean fraction of active neurons (uniform, heavy_tailed, trained_like, edge_rows)
  int32_t hot_tile = 256;  // tile width whose first tile the hot rows fill
  uint64_t seed = 1;
  std::string describe() const;  // "gated bf16 M=16 K=64 N=300 uniform 5%"
};

// Host buffers in spec.dtype, plus views of them.
struct Problem {
  ProblemSpec spec;
  std::vector<uint8_t> x, gate, up, down;  // x [M, K]; gate, up, down [N, K]
  std::vector<int64_t> special_rows;       // rows made zero / dense / hot (edge_rows)
  TensorView x_view();
  FfnWeights weights();
};

Problem make_problem(const ProblemSpec& spec);

// A fresh seed per process unless TWELL_SEED is set (tests print it on failure).
uint64_t session_seed();

}  // namespace twell::testing
