// The CUDA inference backend: the pack kernel bit for bit against the CPU pack_twell, CUDA-graph
// capture and replay, workspaces and streams, argument errors and the dispatch rule.
// TWELL_SMALL=1 keeps only small shapes (for the compute-sanitizer runs of scripts/gpu-check).
#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/kernels/inference.hpp"
#include "cuda/policy/calibration.hpp"
#include "cuda/policy/config.hpp"
#include "cuda/runtime/device.hpp"
#include "cuda_util.hpp"
#endif

namespace twell::test {
namespace {

#ifdef TWELL_WITH_CUDA

// ---------------------------------------------------------------------------------------------
// The pack kernel bit for bit against the CPU pack_twell, on adversarial rows.

enum class RowKind : uint8_t { zero, sparse, dense, hot_tile, at_capacity, over_capacity, signed_zeros };

// A host G [m, n] of 16-bit patterns: non-zero values are random normal-ish bits, zeros are +0
// or -0 (both must count as zero).
std::vector<uint16_t> adversarial_hidden(int64_t m, int64_t n, int32_t tile, int32_t capacity,
                                         uint64_t s) {
  std::mt19937_64 rng(s);
  std::uniform_int_distribution<int> kind_of(0, 6);
  std::uniform_real_distribution<double> u01(0, 1);
  auto value = [&]() { return uint16_t(0x3c00u + (rng() & 0x03ffu)); };  // positive, non-zero
  const int64_t tiles = (n + tile - 1) / tile;
  std::vector<uint16_t> g(size_t(m * n), 0);
  for (int64_t r = 0; r < m; ++r) {
    uint16_t* row = g.data() + r * n;
    const int64_t t = int64_t(rng() % uint64_t(tiles));
    const int64_t t0 = t * tile, width = std::min<int64_t>(tile, n - t0);
    switch (RowKind(kind_of(rng))) {
      case RowKind::zero: break;
      case RowKind::sparse:
        for (int64_t c = 0; c < n; ++c) row[c] = u01(rng) < 0.02 ? value() : 0;
        break;
      case RowKind::dense:
        for (int64_t c = 0; c < n; ++c) row[c] = value();
        break;
      case RowKind::hot_tile:
        for (int64_t c = t0; c < t0 + width; ++c) row[c] = value();
        break;
      case RowKind::at_capacity:
      case RowKind::over_capacity: {
        const int64_t want = std::min<int64_t>(width, capacity + (RowKind(kind_of(rng)) == RowKind::over_capacity));
        for (int64_t i = 0; i < want; ++i) row[t0 + (i * width) / want] = value();
        break;
      }
      case RowKind::signed_zeros:
        for (int64_t c = 0; c < n; ++c) row[c] = u01(rng) < 0.5 ? 0x8000u : (u01(rng) < 0.03 ? value() : 0);
        break;
    }
  }
  return g;
}

struct PackCase {
  int64_t m, n;
  int32_t tile, capacity;
  bool fused = false;  // the sm_90a gate GEMM + pack, fed x = I and W1 = G^T so that G comes out exact
};

void PrintTo(const PackCase& c, std::ostream* os) {
  *os << "M=" << c.m << " N=" << c.n << " tile=" << c.tile << " capacity=" << c.capacity
      << (c.fused ? " fused" : "");
}

class CudaPack : public ::testing::TestWithParam<PackCase> {};

TEST_P(CudaPack, MatchesCpuPack) {
  TWELL_REQUIRE_DEVICE();
  const PackCase& pc = GetParam();
  const std::vector<uint16_t> g = adversarial_hidden(pc.m, pc.n, pc.tile, pc.capacity, seed(303));
  std::vector<uint8_t> g_bytes(g.size() * 2);
  std::memcpy(g_bytes.data(), g.data(), g_bytes.size());

  // CPU reference.
  TensorView gv = TensorView::matrix(g_bytes.data(), DType::bf16, pc.m, pc.n);
  TwellMatrix cpu = pack_twell(&gv, 1, pc.tile, pc.capacity);
  TwellView cv = cpu.view();

  // GPU.
  TwellShape shape;
  shape.rows = pc.m;
  shape.cols = pc.n;
  shape.tile = pc.tile;
  shape.capacity = pc.capacity;
  const int64_t tiles = shape.num_tiles(), slots = pc.m * tiles * pc.capacity;
  DeviceBuffer hidden(g_bytes), values(size_t(slots) * 2), cols(size_t(slots) * 2),
      counts(size_t(pc.m * tiles) * 2), row_slot(size_t(pc.m) * 4), routed_rows(size_t(pc.m) * 4),
      control(sizeof(gpu::RunCounters));
  cuda_ok(cudaMemset(control.get(), 0, control.bytes()), "memset");
  cuda_ok(cudaDeviceSynchronize(), "memset");
  for (DeviceBuffer* b : {&values, &cols, &counts, &row_slot, &routed_rows}) b->poison();
  auto* ctl = static_cast<gpu::RunCounters*>(control.get());
  TwellView out;
  out.shape = shape;
  out.dtype = DType::bf16;
  out.device = Device::cuda(0);
  out.values = values.get();
  out.cols = static_cast<uint16_t*>(cols.get());
  out.counts = static_cast<uint16_t*>(counts.get());
  out.row_slot = static_cast<int32_t*>(row_slot.get());
  out.routed_rows = static_cast<int32_t*>(routed_rows.get());
  out.num_routed = &ctl->num_routed;
  const gpu::DeviceInfo dev = gpu::query_device(0, "test");
  if (pc.fused) {
    if (!gpu::gate_pack_available(dev)) GTEST_SKIP() << "the fused gate kernel needs sm_90a";
    // G = x W1^T with x = [I | 0] (K >= M) and W1[c, r] = G[r, c]: every product is exact.
    const int64_t k = (pc.m + 7) / 8 * 8;
    std::vector<uint16_t> x(size_t(pc.m * k), 0), w(size_t(pc.n * k), 0);
    for (int64_t r = 0; r < pc.m; ++r) x[size_t(r * k + r)] = 0x3f80u;  // bf16 1.0
    for (int64_t r = 0; r < pc.m; ++r)
      for (int64_t c = 0; c < pc.n; ++c) w[size_t(c * k + r)] = g[size_t(r * pc.n + c)];
    auto bytes = [](const std::vector<uint16_t>& v) {
      std::vector<uint8_t> b(v.size() * 2);
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    };
    DeviceBuffer xb(bytes(x)), wb(bytes(w));
    hidden.poison();
    gpu::GatePackArgs a;
    a.op = "test";
    a.x = xb.get();
    a.weight = wb.get();
    a.k = k;
    a.out = out;
    a.hidden = hidden.get();
    a.active = &ctl->active;
    gpu::launch_gate_pack(a, dev, cudaStreamPerThread);
    gpu::launch_route_overflow(out, hidden.get(), dev, cudaStreamPerThread, "test");
    cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "fused gate + pack");
  } else {
    gpu::PackArgs a;
    a.hidden = hidden.get();
    a.out = out;
    a.active = &ctl->active;
    gpu::launch_pack(a, dev, cudaStreamPerThread);
    cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "pack");
  }

  gpu::RunCounters c{};
  cuda_ok(cudaMemcpy(&c, control.get(), sizeof c, cudaMemcpyDeviceToHost), "counters");
  auto as = [](const std::vector<uint8_t>& b, auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    std::vector<T> v(b.size() / sizeof(T));
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  };
  const auto gvals = as(values.download(), (uint16_t*)nullptr);
  const auto gcols = as(cols.download(), (uint16_t*)nullptr);
  const auto gcounts = as(counts.download(), (uint16_t*)nullptr);
  const auto gslot = as(row_slot.download(), (int32_t*)nullptr);
  auto listed = as(routed_rows.download(), (int32_t*)nullptr);

  ASSERT_EQ(c.num_routed, cpu.num_routed());
  int64_t nonzeros = 0;
  for (uint16_t v : g) nonzeros += (v & 0x7fffu) != 0;
  EXPECT_EQ(int64_t(c.active), nonzeros);
  listed.resize(size_t(c.num_routed));
  for (int32_t s = 0; s < c.num_routed; ++s)
    EXPECT_EQ(gslot[size_t(listed[size_t(s)])], s) << "routed slot " << s;
  std::vector<int32_t> gpu_routed(listed), cpu_routed(cv.routed_rows, cv.routed_rows + cpu.num_routed());
  std::sort(gpu_routed.begin(), gpu_routed.end());
  EXPECT_EQ(gpu_routed, cpu_routed);
  const auto* cpu_vals = static_cast<const uint16_t*>(cv.values);
  const auto ghidden = as(hidden.download(), (uint16_t*)nullptr);
  for (int64_t r = 0; r < pc.m; ++r) {
    ASSERT_EQ(gslot[size_t(r)] >= 0, cv.row_slot[r] >= 0) << "row " << r;
    if (pc.fused && gslot[size_t(r)] >= 0)  // a routed row's G is complete (zeros of either sign)
      for (int64_t c = 0; c < pc.n; ++c) {
        const uint16_t want = g[size_t(r * pc.n + c)], got = ghidden[size_t(r * pc.n + c)];
        ASSERT_EQ((want & 0x7fffu) == 0 ? 0 : want, (got & 0x7fffu) == 0 ? 0 : got)
            << "routed row " << r << " column " << c;
      }
    for (int64_t t = 0; t < tiles; ++t) {
      const size_t ti = size_t(r * tiles + t);
      ASSERT_EQ(gcounts[ti], cv.counts[ti]) << "row " << r << " tile " << t;
      for (int64_t i = 0; i < cv.counts[ti]; ++i) {
        const size_t si = ti * size_t(pc.capacity) + size_t(i);
        ASSERT_EQ(gcols[si], cv.cols[si]) << "row " << r << " tile " << t << " entry " << i;
        ASSERT_EQ(gvals[si], cpu_vals[si]) << "row " << r << " tile " << t << " entry " << i;
      }
    }
  }
}

std::vector<PackCase> pack_cases() {
  std::vector<PackCase> out;
  for (int32_t tile : {64, 128, 256})
    for (int32_t capacity : {1, 8, tile / 8, tile})
      for (int64_t n : {int64_t(520), int64_t(1000), int64_t(5632)})
        for (int64_t m : {int64_t(1), int64_t(7), int64_t(257)})
          for (bool fused : {false, true}) {
            if (small_only() && n > 1000) continue;
            out.push_back({m, n, tile, capacity, fused});
          }
  return out;
}

std::string pack_name(const ::testing::TestParamInfo<PackCase>& info) {
  const PackCase& c = info.param;
  return "M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_tile" + std::to_string(c.tile) +
         "_cap" + std::to_string(c.capacity) + (c.fused ? "_fused_" : "_") + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Pack, CudaPack, ::testing::ValuesIn(pack_cases()), pack_name);

// ---------------------------------------------------------------------------------------------
// Streams, graphs, workspaces.

ProblemSpec small_spec(FfnKind kind, Pattern pattern, uint64_t salt) {
  ProblemSpec s;
  s.kind = kind;
  s.dtype = DType::bf16;
  s.pattern = pattern;
  s.density = 0.05;
  s.m = 257;
  s.k = 136;
  s.n = 1000;
  s.seed = seed(salt);
  return s;
}

struct GraphCase {
  Dispatch dispatch;
  int64_t m;  // 1, 12, 24: the decode path (the fused kernel's one, two and four token tiles); 257: TwELL
};
void PrintTo(const GraphCase& c, std::ostream* os) { *os << dispatch_name(c.dispatch) << " M=" << c.m; }

class CudaGraph : public ::testing::TestWithParam<GraphCase> {};

TEST_P(CudaGraph, CaptureAndReplay) {
  TWELL_REQUIRE_DEVICE();
  ProblemSpec spec = small_spec(FfnKind::gated, Pattern::edge_rows, 404);
  spec.m = GetParam().m;
  DeviceProblem d(spec);
  InferenceOptions o;
  o.dispatch = GetParam().dispatch;
  InferencePlan plan(d.weights(), o);
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  plan.run(d.args(), s);  // grows the plan's workspace and plans the cuBLASLt calls
  cuda_ok(cudaStreamSynchronize(s), "warm-up");

  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  plan.run(d.args(), s);
  cuda_ok(cudaStreamEndCapture(s, &graph), "end capture");
  size_t nodes = 0;
  cuda_ok(cudaGraphGetNodes(graph, nullptr, &nodes), "graph nodes");
  EXPECT_GE(nodes, 1u) << "the capture recorded nothing";
  // The fused decode kernel is the whole run: one node, nothing zeroed before it.
  const gpu::DeviceInfo dev = gpu::query_device(0, "test");
  if (spec.m <= gpu::FusedDecodeConfig::kMaxRows && GetParam().dispatch == Dispatch::force_sparse &&
      gpu::fused_decode_setup(spec.kind, spec.dtype, spec.k, spec.n, dev)[size_t(spec.m)].ctas > 0)
    EXPECT_EQ(nodes, 1u) << "the fused decode path should capture one kernel";
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  d.y.poison();
  cuda_ok(cudaGraphLaunch(exec, s), "launch");
  cuda_ok(cudaStreamSynchronize(s), "replay");
  expect_matches_oracle(d, d.y_host(), "graph replay");

  // New x in the same buffer: the replay computes on it (nothing host-side was baked in).
  spec.seed = seed(405);
  d.p.x = testing::make_problem(spec).x;
  d.x.upload(d.p.x);
  d.y.poison();
  cuda_ok(cudaGraphLaunch(exec, s), "launch");
  cuda_ok(cudaStreamSynchronize(s), "replay");
  expect_matches_oracle(d, d.y_host(), "graph replay on new x");

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaGraph,
                         ::testing::Values(GraphCase{Dispatch::force_sparse, 257},
                                           GraphCase{Dispatch::force_dense, 257},
                                           GraphCase{Dispatch::automatic, 257},
                                           GraphCase{Dispatch::force_sparse, 1},
                                           GraphCase{Dispatch::force_sparse, 12},
                                           GraphCase{Dispatch::force_sparse, 24},
                                           GraphCase{Dispatch::automatic, 1}),
                         [](const ::testing::TestParamInfo<GraphCase>& i) {
                           return dispatch_name(i.param.dispatch) + "_M" + std::to_string(i.param.m);
                         });

// The long-row limit follows the measured density under Determinism::fast (long_row_limit): a
// plan under automatic dispatch at 0.5% of N = 1000 (5 entries a row) moves the rows of 21 - 96
// entries from a warp to a CTA once its first run's density arrives (its trials alternate sparse
// and dense). Every run exact against one oracle of all rows; one column range and two (the long
// rows' split passes), gated and plain (one fused row kernel).
TEST(CudaInference, LongRowLimitMovesRowsExactly) {
  TWELL_REQUIRE_DEVICE();
  for (const auto& [kind, k] : {std::pair{FfnKind::gated, int64_t(2048)}, std::pair{FfnKind::gated, int64_t(2560)},
                                std::pair{FfnKind::plain, int64_t(2048)}}) {
    ProblemSpec spec = small_spec(kind, Pattern::heavy_tailed, 717);
    spec.m = 384;
    spec.k = k;
    spec.density = 0.005;
    DeviceProblem d(spec);
    const std::string where = spec.describe();
    std::vector<int64_t> all(size_t(spec.m));
    for (int64_t r = 0; r < spec.m; ++r) all[size_t(r)] = r;
    const ref::Weights w = ref::from_weights(d.p.weights());
    const ref::Matrix x = testing::rows_of(d.p.x_view(), all);
    const ref::Forward f = ref::ffn_forward(w, x);
    const double tolerance = testing::tolerance(w, x, f, spec.dtype);
    const int32_t limit = gpu::long_row_limit(0.005, spec.n, Determinism::fast);
    int64_t moved = 0;  // rows a warp takes before the density arrives and a CTA after
    for (int64_t r = 0; r < spec.m; ++r) {
      int64_t active = 0;
      for (int64_t c = 0; c < spec.n; ++c) active += round_to(spec.dtype, float(f.gate_pre.at(r, c))) > 0.0f;
      moved += active > limit && active <= gpu::RowConfig::kLongRow;
    }
    EXPECT_GT(moved, 0) << where << ": no row between the limits " << limit << " and " << gpu::RowConfig::kLongRow;
    InferencePlan plan(d.weights());
    for (int run = 0; run < 6; ++run) {
      d.y.poison();
      plan.run(d.args());
      cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "run");
      const std::vector<uint8_t> y_host = d.y_host();
      const ref::Matrix y = testing::rows_of(TensorView::matrix(const_cast<uint8_t*>(y_host.data()), spec.dtype,
                                                                spec.m, spec.k),
                                             all);
      EXPECT_LE(ref::rel_error(y, f.y), tolerance) << where << ", run " << run;
    }
  }
}

// Dispatch's trials up to DispatchConfig::kGraphTimedRows rows run as private graphs on the plan's
// own stream, joined to the caller's: every run exact on the per-thread, the legacy and a created
// stream, through every trial and the decision after them, and a capture afterwards replays exactly.
TEST(CudaInference, GraphTimedTrialsAreExactOnEveryStream) {
  TWELL_REQUIRE_DEVICE();
  cudaStream_t created = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking), "stream");
  for (const int64_t m : {int64_t(1), int64_t(16), int64_t(64), int64_t(200)}) {
    ProblemSpec spec = small_spec(m % 2 == 0 ? FfnKind::gated : FfnKind::plain, Pattern::heavy_tailed, 707);
    spec.m = m;
    spec.density = 0.01;
    DeviceProblem d(spec);
    InferencePlan plan(d.weights());
    for (cudaStream_t s : {cudaStream_t(nullptr), cudaStreamLegacy, created}) {
      const std::string where = "M = " + std::to_string(m) + (s == nullptr ? ", per-thread stream" :
                                                               s == cudaStreamLegacy ? ", legacy stream" :
                                                                                       ", created stream");
      for (int run = 0; run < 10; ++run) {
        d.y.poison();
        plan.run(d.args(), s);
        cuda_ok(cudaStreamSynchronize(s == nullptr ? cudaStreamPerThread : s), "run");
        expect_matches_oracle(d, d.y_host(), where + ", run " + std::to_string(run));
      }
    }
    cudaGraph_t graph = nullptr;
    cuda_ok(cudaStreamBeginCapture(created, cudaStreamCaptureModeGlobal), "begin capture");
    plan.run(d.args(), created);
    cuda_ok(cudaStreamEndCapture(created, &graph), "end capture");
    cudaGraphExec_t exec = nullptr;
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    d.y.poison();
    cuda_ok(cudaGraphLaunch(exec, created), "launch");
    cuda_ok(cudaStreamSynchronize(created), "replay");
    expect_matches_oracle(d, d.y_host(), "M = " + std::to_string(m) + ", graph replay after the trials");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(created);
}

TEST(CudaInference, CaptureBeforeWorkspaceExistsRaises) {
  TWELL_REQUIRE_DEVICE();
  DeviceProblem d(small_spec(FfnKind::plain, Pattern::uniform, 505));
  InferencePlan plan(d.weights());
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  EXPECT_THROW(plan.run(d.args(), s), Error);
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  // The plan is still usable afterwards.
  const Outcome o = run_once(plan, d);
  expect_matches_oracle(d, o.y, "after a refused capture");
  cudaStreamDestroy(s);
}

TEST(CudaInference, CallerWorkspaceAndAlternatingStreams) {
  TWELL_REQUIRE_DEVICE();
  DeviceProblem d(small_spec(FfnKind::gated, Pattern::edge_rows, 606));
  InferencePlan plan(d.weights());
  const size_t need = plan.workspace_bytes(d.args());
  DeviceBuffer ws(need + 16);
  char* unaligned = static_cast<char*>(ws.get()) + 16;  // the plan aligns it itself
  EXPECT_THROW(plan.run(d.args(), nullptr, unaligned, need - 1), Error);
  d.y.poison();
  plan.run(d.args(), nullptr, unaligned, need);
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "run");
  expect_matches_oracle(d, d.y_host(), "caller workspace");

  cudaStream_t s1 = nullptr, s2 = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "stream");
  DeviceBuffer y2(d.y.bytes());
  InferenceArgs second = d.args(false);
  second.y.data = y2.get();
  d.y.poison();
  y2.poison();
  for (int i = 0; i < 3; ++i) {
    plan.run(d.args(false), s1);
    plan.run(second, s2);
  }
  cuda_ok(cudaDeviceSynchronize(), "streams");
  expect_matches_oracle(d, d.y_host(), "stream 1");
  auto other = y2.download();
  other.resize(d.p.x.size());
  expect_matches_oracle(d, other, "stream 2");
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

TEST(CudaInference, EmptyBatchIsANoOp) {
  TWELL_REQUIRE_DEVICE();
  ProblemSpec s = small_spec(FfnKind::gated, Pattern::uniform, 707);
  s.m = 0;
  DeviceProblem d(s);
  InferencePlan plan(d.weights());
  d.counters.poison();
  plan.run(d.args(), nullptr);
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "run");
  const auto c = d.counters_host();
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[1], 0);
  EXPECT_EQ(plan.last_run().rows, 0);
}

TEST(CudaInference, DenseAboveOptionIsHonoured) {
  TWELL_REQUIRE_DEVICE();
  DeviceProblem d(small_spec(FfnKind::gated, Pattern::uniform, 808));
  InferenceOptions o;
  o.dense_above = 0.0;  // every measured density exceeds it: dense from the second run on
  InferencePlan plan(d.weights(), o);
  for (int i = 0; i < 3; ++i) {
    const Outcome r = run_once(plan, d);
    EXPECT_EQ(r.info.ran_dense, i > 0);
    expect_matches_oracle(d, r.y, "dense above the cap");
  }
}

// set_weights points a plan at other weights of the same shapes and dtype: each run then equals the
// oracle on the weights it was pointed at; a misaligned weight is refused at once, host memory
// labelled CUDA at the next run, and the plan is usable again once pointed at good weights.
TEST(CudaInference, SetWeightsRebindsAndChecks) {
  TWELL_REQUIRE_DEVICE();
  DeviceProblem a(small_spec(FfnKind::gated, Pattern::edge_rows, 1001));
  DeviceProblem b(small_spec(FfnKind::gated, Pattern::uniform, 1002));
  InferencePlan plan(a.weights());
  for (int round = 0; round < 3; ++round) {  // through the dispatch trials, both ways
    plan.set_weights(b.weights());
    expect_matches_oracle(b, run_once(plan, b).y, "rebound to b, round " + std::to_string(round));
    plan.set_weights(a.weights());
    expect_matches_oracle(a, run_once(plan, a).y, "rebound to a, round " + std::to_string(round));
  }
  DeviceBuffer shifted(b.down.bytes() + 16);
  cuda_ok(cudaMemcpy(static_cast<char*>(shifted.get()) + 2, b.down.get(), b.down.bytes(),
                     cudaMemcpyDeviceToDevice), "copy");
  FfnWeights misaligned = b.weights();
  misaligned.down.data = static_cast<char*>(shifted.get()) + 2;
  expect_error([&] { plan.set_weights(misaligned); }, "down weight");
  std::vector<uint8_t> host(b.p.down.size());
  FfnWeights host_labelled = b.weights();
  host_labelled.down.data = host.data();
  plan.set_weights(host_labelled);
  expect_error([&] { plan.run(b.args()); }, "down weight");
  plan.set_weights(b.weights());
  expect_matches_oracle(b, run_once(plan, b).y, "good weights after a refusal");
  ProblemSpec wide_spec = small_spec(FfnKind::gated, Pattern::uniform, 1003);
  wide_spec.n += 8;
  DeviceProblem wide(wide_spec);
  expect_error([&] { plan.set_weights(wide.weights()); }, "weights shape");
  expect_matches_oracle(b, run_once(plan, b).y, "after a refused shape");
}

// ---------------------------------------------------------------------------------------------
// Argument errors name the argument.

TEST(CudaInference, UnsupportedShapesAndTypesRaise) {
  TWELL_REQUIRE_DEVICE();
  DeviceBuffer storage;
  expect_error([&] { InferencePlan p(device_weights(DType::bf16, 520, 68, storage)); }, "hidden size K");
  expect_error([&] { InferencePlan p(device_weights(DType::bf16, 1004, 64, storage)); },
               "intermediate size N");
  expect_error([&] { InferencePlan p(device_weights(DType::bf16, 520, 16392, storage)); },
               "hidden size K");
  expect_error([&] { InferencePlan p(device_weights(DType::f32, 520, 64, storage)); }, "weights dtype");
  InferenceOptions o;
  o.tile = 32;
  expect_error([&] { InferencePlan p(device_weights(DType::bf16, 520, 64, storage), o); },
               "options.tile");
  FfnWeights host_labelled = device_weights(DType::bf16, 520, 64, storage);
  std::vector<uint8_t> host(size_t(520 * 64 * 2));
  host_labelled.down.data = host.data();
  expect_error([&] { InferencePlan p(host_labelled); }, "down weight");
}

TEST(CudaInference, BadRunArgumentsRaise) {
  TWELL_REQUIRE_DEVICE();
  DeviceProblem d(small_spec(FfnKind::gated, Pattern::uniform, 909));
  InferencePlan plan(d.weights());
  InferenceArgs cpu_x = d.args();
  cpu_x.x = d.p.x_view();
  expect_error([&] { plan.run(cpu_x); }, "x");
  InferenceArgs host_labelled = d.args();
  host_labelled.x.data = d.p.x.data();  // host memory with a CUDA label
  expect_error([&] { plan.run(host_labelled); }, "x");
  InferenceArgs misaligned = d.args();
  DeviceBuffer shifted(d.p.x.size() + 16);
  misaligned.y.data = static_cast<char*>(shifted.get()) + 2;
  expect_error([&] { plan.run(misaligned); }, "y");
}

// The dispatch rule both plans share (calibration.hpp; host logic, no device needed): sparse before
// any measurement and dense above dense_above without a trial; per regime (rows to a power of two,
// density to a factor of ~1.41) each path twice, alternating from sparse, then the faster by best
// time; other regimes start over.
TEST(DispatchRule, AlternatesThenTakesTheFaster) {
  gpu::PathTimes t;
  const int64_t m = 16384;
  const double d = 0.01, above = 0.04;
  EXPECT_FALSE(t.prefer_dense(m, -1.0, above)) << "no density measured yet";
  EXPECT_TRUE(t.decide(m, -1.0, above).trying) << "no density measured yet";
  EXPECT_TRUE(t.prefer_dense(m, 0.05, above)) << "above dense_above";
  EXPECT_FALSE(t.decide(m, 0.05, above).trying) << "above dense_above: no trial";
  EXPECT_FALSE(t.prefer_dense(m, d, above)) << "a new regime starts sparse";
  EXPECT_FALSE(t.decide(m, d, above).settled_dense) << "a capture before any trial: sparse";
  EXPECT_TRUE(t.decide(m, 0.05, above).settled_dense) << "a capture above dense_above: dense";
  t.add(m, d, false, 3.0f);
  EXPECT_TRUE(t.prefer_dense(m, d, above));
  EXPECT_FALSE(t.decide(m, d, above).settled_dense) << "a capture takes no trial of dense";
  t.add(m, d, true, 2.0f);
  EXPECT_FALSE(t.prefer_dense(m, d, above));
  EXPECT_TRUE(t.decide(m, d, above).settled_dense) << "a capture: the faster so far";
  t.add(m, d, false, 2.5f);
  EXPECT_TRUE(t.prefer_dense(m, d, above));
  t.add(m, d, true, 4.0f);
  EXPECT_FALSE(t.prefer_dense(m, d, above)) << "three trials of each path";
  t.add(m, d, false, 2.6f);
  EXPECT_TRUE(t.prefer_dense(m, d, above));
  EXPECT_TRUE(t.decide(m, d, above).trying) << "dense ran twice";
  t.add(m, d, true, 4.1f);
  EXPECT_FALSE(t.decide(m, d, above).trying) << "both paths tried three times";
  EXPECT_TRUE(t.prefer_dense(m, d, above)) << "best dense 2.0 ms < best sparse 2.5 ms";
  EXPECT_TRUE(t.prefer_dense(m + 1000, 0.0101, above)) << "the same regime";
  EXPECT_FALSE(t.prefer_dense(2 * m, d, above)) << "twice the rows: another regime";
  EXPECT_FALSE(t.prefer_dense(m, 2 * d, above)) << "twice the density: another regime";
  t.add(m, d, false, 1.5f);
  EXPECT_FALSE(t.prefer_dense(m, d, above)) << "sparse became the faster";
}

// Inference's margin (DispatchConfig::kSparseMargin): after the trials, sparse runs only where its
// best time beats dense's by the margin; a plain PathTimes (training's) takes the faster.
TEST(DispatchRule, InferenceRunsSparseOnlyBeyondItsMargin) {
  const int64_t m = 4096;
  const double d = 0.01, above = 0.04;
  const double margin = gpu::DispatchConfig::kSparseMargin;
  ASSERT_GT(margin, 0.0);
  for (const double sparse_ms : {1.0, 1.0 / (1.0 + margin) * 0.999, 1.0 / (1.0 + margin) * 1.001}) {
    gpu::PathTimes inference(margin), training;
    for (int i = 0; i < 3; ++i) {
      for (gpu::PathTimes* t : {&inference, &training}) {
        t->add(m, d, false, float(sparse_ms));
        t->add(m, d, true, 1.0f);
      }
    }
    ASSERT_FALSE(inference.decide(m, d, above).trying);
    const bool beyond = sparse_ms * (1.0 + margin) < 0.9995;
    EXPECT_EQ(inference.prefer_dense(m, d, above), !beyond) << "sparse " << sparse_ms << " ms, dense 1 ms";
    EXPECT_EQ(inference.decide(m, d, above).settled_dense, !beyond) << "a capture's choice too";
    EXPECT_FALSE(training.prefer_dense(m, d, above)) << "no margin: sparse at a tie or faster";
  }
}

// The row kernels' long-row limit (calibration.hpp): kLongRow before a density and under
// Determinism::deterministic; otherwise kLongRowMeans x the mean entries, clamped.
TEST(DispatchRule, LongRowLimitFollowsTheDensity) {
  using gpu::RowConfig;
  const auto fast = Determinism::fast;
  EXPECT_EQ(gpu::long_row_limit(-1.0, 5632, fast), RowConfig::kLongRow) << "no density yet";
  EXPECT_EQ(gpu::long_row_limit(1e-4, 5632, Determinism::deterministic), RowConfig::kLongRow);
  EXPECT_EQ(gpu::long_row_limit(0.01, 5632, fast), RowConfig::kLongRow) << "56 entries a row: the cap";
  EXPECT_EQ(gpu::long_row_limit(1e-4, 5632, fast), RowConfig::kMinLongRow) << "0.56 entries a row: the floor";
  EXPECT_EQ(gpu::long_row_limit(0.0, 5632, fast), RowConfig::kMinLongRow) << "no entries";
  EXPECT_EQ(gpu::long_row_limit(0.001, 5632, fast), int32_t(std::ceil(RowConfig::kLongRowMeans * 5.632)));
  EXPECT_LE(gpu::long_row_limit(0.2, 65536, fast), RowConfig::kLongRow);
}

#endif  // TWELL_WITH_CUDA

}  // namespace
}  // namespace twell::test
