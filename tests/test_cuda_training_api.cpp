// CUDA training: graph capture and replay, and the plan's API (saved state, workspace, dispatch,
// errors) (cuda_training_step.hpp).
#include "common.hpp"

#ifdef TWELL_WITH_CUDA
#include "cuda_training_step.hpp"
#endif

namespace twell::test {
namespace {

#ifdef TWELL_WITH_CUDA

// ---------------------------------------------------------------------------------------------
// A whole step (forward + backward) captured in a CUDA graph and replayed.

TEST(CudaTrainingGraph, CaptureAndReplay) {
  TWELL_REQUIRE_DEVICE();
  Case c;
  c.pattern = Pattern::edge_rows;
  c.m = 257;
  c.tile = 64;
  c.capacity = 4;
  c.l1_from = L1From::tensor;
  c.dispatch = Dispatch::automatic;  // saved_shape polls the calibration's events (below)
  TrainingOptions o = options_of(c);
  o.determinism = Determinism::deterministic;  // the replay is compared bit for bit
  DeviceStep d(spec_of(c, 1303), o, c.l1_from, kTensorL1);
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  d.poison_outputs();
  d.enqueue(d.view, s);  // grows the plan's workspace and plans the cuBLASLt call
  cuda_ok(cudaStreamSynchronize(s), "warm-up");
  const StepOutputs eager = download(d, d.view);
  expect_matches_oracle(d, eager, "eager step");

  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  // A framework asks for the saved shape inside its capture: the calibration's event polls must
  // not invalidate a global-mode capture (either form is valid; this pattern is above dense_above).
  const TwellShape during = d.plan->saved_shape(c.m);
  EXPECT_TRUE(during.backup_capacity == 0 || during.backup_capacity == c.m);
  d.enqueue(d.view, s);
  cuda_ok(cudaStreamEndCapture(s, &graph), "end capture");
  size_t nodes = 0;
  cuda_ok(cudaGraphGetNodes(graph, nullptr, &nodes), "graph nodes");
  EXPECT_GT(nodes, 10u) << "the capture recorded (almost) nothing";
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  d.poison_outputs();
  cuda_ok(cudaGraphLaunch(exec, s), "launch");
  cuda_ok(cudaStreamSynchronize(s), "replay");
  const StepOutputs replay = download(d, d.view);
  EXPECT_EQ(replay.y, eager.y);
  EXPECT_EQ(replay.dx, eager.dx);
  EXPECT_EQ(replay.dgate, eager.dgate);
  EXPECT_EQ(replay.dup, eager.dup);
  EXPECT_EQ(replay.ddown, eager.ddown);
  EXPECT_EQ(replay.stats, eager.stats);

  // New x and dy in the same buffers: the replay computes on them (nothing host-side baked in).
  Case c2 = c;
  c2.pattern = Pattern::heavy_tailed;
  const ProblemSpec spec2 = spec_of(c2, 1304);
  d.p.x = testing::make_problem(spec2).x;
  d.x.upload(d.p.x);
  d.dy_host = testing::make_problem({spec2.kind, spec2.m, spec2.k, 1, spec2.dtype, Pattern::uniform,
                                     0.5, 64, spec2.seed + 1})
                  .x;
  d.dy.upload(d.dy_host);
  d.poison_outputs();
  cuda_ok(cudaGraphLaunch(exec, s), "launch");
  cuda_ok(cudaStreamSynchronize(s), "replay");
  expect_matches_oracle(d, download(d, d.view), "replay on new x and dy");

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// A framework asks for the saved shape inside its capture with the default capacity too: the
// capacity's poll of the routed count must not invalidate a global-mode capture either, and a
// step at the capacity asked for then matches the oracle.
TEST(CudaTrainingGraph, CaptureAsksForTheDensitySizedState) {
  TWELL_REQUIRE_DEVICE();
  Case c = problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::uniform, 0.0001, 512, 64, 1024);
  TrainingOptions o = options_of(c);
  o.capacity = 0;
  o.dispatch = Dispatch::automatic;
  DeviceStep d(spec_of(c, 1305), o, L1From::options, 0.0f);
  ASSERT_EQ(d.plan->options().min_capacity, 4);
  run_step(d);  // a density and a routed count to poll
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  const TwellShape during = d.plan->saved_shape(c.m);
  cuda_ok(cudaStreamEndCapture(s, &graph), "end capture: the poll left it valid");
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_EQ(during.backup_capacity == 0 ? during.capacity : 4, 4) << "the compact state at 0.01%";
  d.renew_saved();
  expect_matches_oracle(d, run_step(d), "after the capture");
  cudaStreamDestroy(s);
}

TEST(CudaTrainingGraph, CaptureBeforeWorkspaceExistsRaises) {
  TWELL_REQUIRE_DEVICE();
  Case c;
  c.kind = FfnKind::plain;
  c.m = 7;
  DeviceStep d(spec_of(c, 1404), options_of(c), L1From::options, 0.0f);
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  EXPECT_THROW(d.plan->forward(d.forward_args(), d.view, s), Error);
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  // The plan is still usable afterwards.
  expect_matches_oracle(d, run_step(d), "after a refused capture");
  cudaStreamDestroy(s);
}

// With a caller workspace a step can be captured with no uncaptured run before it (how frameworks
// capture: their allocator provides the scratch), and the replay matches an eager step.
TEST(CudaTrainingGraph, CaptureWithCallerWorkspace) {
  TWELL_REQUIRE_DEVICE();
  Case c;
  c.pattern = Pattern::edge_rows;
  c.m = 65;
  c.tile = 128;
  c.capacity = 8;
  DeviceStep d(spec_of(c, 1505), options_of(c), L1From::options, 0.0f);
  DeviceBuffer ws(d.plan->workspace_bytes(c.m));
  const TensorView wsv = TensorView::vector(ws.get(), DType::u8, int64_t(d.plan->workspace_bytes(c.m)),
                                            Device::cuda(0));
  TrainingForwardArgs fa = d.forward_args();
  TrainingBackwardArgs ba = d.backward_args();
  fa.workspace = ba.workspace = wsv;
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
  d.plan->forward(fa, d.view, s);
  d.plan->backward(ba, d.x_view(), d.view, s);
  cuda_ok(cudaStreamEndCapture(s, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  d.poison_outputs();
  cuda_ok(cudaGraphLaunch(exec, s), "launch");
  cuda_ok(cudaStreamSynchronize(s), "replay");
  expect_matches_oracle(d, download(d, d.view), "captured with a caller workspace");
  TrainingForwardArgs small = fa;
  small.workspace.shape[0] = 1;
  EXPECT_THROW(d.plan->forward(small, d.view, s), Error);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// ---------------------------------------------------------------------------------------------
// The plan-owned saved state, an empty batch, argument errors.

TEST(CudaTrainingApi, PlanOwnedSavedStateMatchesCallerOwned) {
  TWELL_REQUIRE_DEVICE();
  Case c;
  c.pattern = Pattern::edge_rows;
  c.m = 65;
  c.tile = 64;
  c.capacity = 4;
  TrainingOptions o = options_of(c);
  o.determinism = Determinism::deterministic;  // the second step is compared bit for bit
  DeviceStep d(spec_of(c, 1505), o, L1From::options, 0.0f);
  const StepOutputs caller = run_step(d);
  d.poison_outputs();
  SavedActivations saved;
  d.plan->forward(d.forward_args(), saved);
  d.plan->backward(d.backward_args(), saved);
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "plan-owned step");
  const StepOutputs owned = download(d, d.view);
  EXPECT_EQ(caller.y, owned.y);
  EXPECT_EQ(caller.dx, owned.dx);
  EXPECT_EQ(caller.dgate, owned.dgate);
  EXPECT_EQ(caller.dup, owned.dup);
  EXPECT_EQ(caller.ddown, owned.ddown);
  EXPECT_EQ(saved.routed_rows(), caller.routed);
  EXPECT_EQ(saved.bytes(), d.saved.bytes());
}

// A fused gate-up parameter (Wu right after Wg, dWu right after dWg), both saved forms.
TEST(CudaTrainingApi, AdjacentGateAndUpMatchOracle) {
  TWELL_REQUIRE_DEVICE();
  for (const Dispatch form : {Dispatch::force_dense, Dispatch::force_sparse})
    for (const DType dt : {DType::bf16, DType::f16}) {
      Case c = problem_case<Case>(FfnKind::gated, dt, Pattern::edge_rows, 0.05, 257, 136, 1000);
      c.dispatch = form;
      DeviceStep d(spec_of(c, 1950), options_of(c), L1From::options, 0.0f);
      d.make_adjacent();
      expect_matches_oracle(d, run_step(d), form == Dispatch::force_dense ? "dense form" : "compact form");
    }
}

// The workspace per saved form and call: at the LLM shape the compact form's backward takes no
// more than its column index's records and cuBLAS's share (the routed rows' buffers live in the
// records' bytes, the positions in cuBLAS's), either form's is at most the plan-wide figure, the dense
// form's holds a copy of [Wg; Wu] only where Wu does not follow Wg; each call runs in exactly its
// bytes, and one byte less raises.
TEST(CudaTrainingApi, WorkspacePerSavedForm) {
  TWELL_REQUIRE_DEVICE();
  const int64_t n = 5632, k = 2048, m = 16384;
  const size_t es = dtype_size(DType::bf16);
  DeviceBuffer storage;
  const FfnWeights w = device_weights(DType::bf16, n, k, storage);  // Wu right after Wg
  TrainingPlan plan(w);
  const size_t compact = plan.workspace_bytes(m, SavedForm::compact);
  const size_t dense = plan.workspace_bytes(m, SavedForm::dense);
  EXPECT_EQ(plan.workspace_bytes(m), std::max(compact, dense));
  EXPECT_LT(compact, size_t(3 * m * n) * es);  // [g | u | dh] for every row
  const size_t slots = size_t(m) * size_t((n + 255) / 256) * size_t(plan.options().capacity);
  // The records, then the cuBLAS share (32 MiB of scratch and 32 MiB of rows, in the positions'
  // bytes) and the column index's small arrays.
  EXPECT_LE(plan.workspace_bytes(m, SavedForm::compact, TrainingCall::backward),
            slots * 16 + (size_t(72) << 20));
  EXPECT_EQ(compact, std::max(plan.workspace_bytes(m, SavedForm::compact, TrainingCall::forward),
                              plan.workspace_bytes(m, SavedForm::compact, TrainingCall::backward)));
  FfnWeights apart = w;  // Wu no longer after Wg
  std::swap(apart.up, apart.down);
  plan.set_weights(apart);
  EXPECT_EQ(plan.workspace_bytes(m, SavedForm::dense), dense + size_t(2 * n * k) * es);
  EXPECT_EQ(plan.workspace_bytes(m, SavedForm::compact), compact);
  TrainingOptions sparse;
  sparse.dispatch = Dispatch::force_sparse;
  EXPECT_EQ(TrainingPlan(w, sparse).workspace_bytes(m), compact);
  expect_error([&] { plan.workspace_bytes(-1, SavedForm::compact); }, "rows");

  for (const Dispatch form : {Dispatch::force_sparse, Dispatch::force_dense}) {
    Case c = problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::edge_rows, 0.05, 257, 136, 1000);
    c.dispatch = form;
    DeviceStep d(spec_of(c, 1960), options_of(c), L1From::options, 0.0f);
    const SavedForm f = form == Dispatch::force_dense ? SavedForm::dense : SavedForm::compact;
    const size_t forward = d.plan->workspace_bytes(c.m, f, TrainingCall::forward);
    const size_t backward = d.plan->workspace_bytes(c.m, f, TrainingCall::backward);
    EXPECT_EQ(d.plan->workspace_bytes(c.m, f), std::max(forward, backward));
    d.workspace = DeviceBuffer(forward - 1);
    expect_error([&] { d.plan->forward(d.forward_args(), d.view); }, "workspace");
    d.workspace = DeviceBuffer(forward);
    d.plan->forward(d.forward_args(), d.view);
    d.backward_workspace = DeviceBuffer(backward - 1);
    expect_error([&] { d.plan->backward(d.backward_args(), d.x_view(), d.view); }, "workspace");
    d.backward_workspace = DeviceBuffer(backward);
    expect_matches_oracle(d, run_step(d), form == Dispatch::force_dense ? "dense form" : "compact form");
  }
}

TEST(CudaTrainingApi, EmptyBatchWritesZeroGradients) {
  TWELL_REQUIRE_DEVICE();
  Case c;
  c.m = 0;
  DeviceStep d(spec_of(c, 1606), options_of(c), L1From::options, 0.0f);
  const StepOutputs o = run_step(d);
  for (float v : o.stats) EXPECT_EQ(v, 0.0f);
  for (const std::vector<float>* g : {&o.dgate, &o.dup, &o.ddown})
    for (float v : *g) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(o.routed, 0);
}

TEST(CudaTrainingApi, UnsupportedShapesAndTypesRaise) {
  TWELL_REQUIRE_DEVICE();
  DeviceBuffer storage;
  expect_error([&] { TrainingPlan p(device_weights(DType::bf16, 520, 68, storage)); }, "hidden size K");
  expect_error([&] { TrainingPlan p(device_weights(DType::bf16, 1004, 64, storage)); },
               "intermediate size N");
  expect_error([&] { TrainingPlan p(device_weights(DType::bf16, 520, 16392, storage)); }, "hidden size K");
  expect_error([&] { TrainingPlan p(device_weights(DType::f32, 520, 64, storage)); }, "weights dtype");
  TrainingOptions o;
  o.tile = 32;
  expect_error([&] { TrainingPlan p(device_weights(DType::bf16, 520, 64, storage), o); }, "options.tile");
}

TEST(CudaTrainingApi, BadStepArgumentsRaise) {
  TWELL_REQUIRE_DEVICE();
  Case c;
  c.m = 7;
  DeviceStep d(spec_of(c, 1707), options_of(c), L1From::options, 0.0f);
  TrainingBackwardArgs host_dx = d.backward_args();
  std::vector<uint8_t> host(d.p.x.size());
  host_dx.dx.data = host.data();  // host memory with a CUDA label
  d.plan->forward(d.forward_args(), d.view);
  expect_error([&] { d.plan->backward(host_dx, d.x_view(), d.view); }, "dx");
  TrainingForwardArgs misaligned = d.forward_args();
  DeviceBuffer shifted(d.p.x.size() + 16);
  misaligned.y.data = static_cast<char*>(shifted.get()) + 2;
  expect_error([&] { d.plan->forward(misaligned, d.view); }, "y");
  TrainingBackwardArgs host_l1 = d.backward_args();
  float coef = 0.1f;
  host_l1.l1_coef = TensorView::vector(&coef, DType::f32, 1, Device::cuda(0));
  expect_error([&] { d.plan->backward(host_l1, d.x_view(), d.view); }, "l1_coef");
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "forward");
}

// Automatic dispatch: compact before any measurement, the dense form once a finished forward
// measured a density above dense_above, compact again once one measured below it; a form that
// does not match M raises.
TEST(CudaTrainingApi, AutomaticDispatchFollowsMeasuredDensity) {
  TWELL_REQUIRE_DEVICE();
  TrainingOptions o;
  o.l1_coef = kOptionsL1;
  o.dense_above = 0.1;
  Case c = problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::uniform, 0.3, 64, 64, 520);
  DeviceStep d(spec_of(c, 1801), o, L1From::options, 0.0f);
  EXPECT_EQ(d.plan->saved_shape(64).backup_capacity, 0);
  run_step(d);  // finishes on the host
  const TwellShape dense_shape = d.plan->saved_shape(64);
  EXPECT_EQ(dense_shape.backup_capacity, 64);
  EXPECT_EQ(dense_shape.capacity, 1);  // no row uses the dense form's compact slots
  {
    TwellShape padded = dense_shape;  // the dense form with the compact form's capacity
    padded.capacity = d.plan->options().capacity;
    ASSERT_GT(padded.capacity, 1);
    DeviceBuffer b(padded.bytes(d.plan->saved_dtype()));
    const TwellView v = make_twell_view(b.get(), padded, d.plan->saved_dtype(), Device::cuda(0));
    expect_error([&] { d.plan->forward(d.forward_args(), v); }, "saved shape");
  }
  c.density = 0.01;
  DeviceStep sparse(spec_of(c, 1802), o, L1From::options, 0.0f);
  sparse.plan->forward(sparse.forward_args(), sparse.view);  // compact form (allocated before)
  cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "forward");
  EXPECT_EQ(sparse.plan->saved_shape(64).backup_capacity, 0);
  TwellView wrong = sparse.view;
  wrong.shape.backup_capacity = 32;
  expect_error([&] { sparse.plan->forward(sparse.forward_args(), wrong); }, "saved shape");
}

// Automatic dispatch below dense_above: compact before any measurement, then the two saved forms
// alternate until each ran two timed steps in the regime, then the faster one stays; every step
// matches the oracle whichever form it ran.
TEST(CudaTrainingApi, AutomaticDispatchTimesBothForms) {
  TWELL_REQUIRE_DEVICE();
  TrainingOptions o;
  o.l1_coef = kOptionsL1;
  o.dense_above = 0.5;
  Case c = problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::uniform, 0.05, 64, 64, 520);
  DeviceStep d(spec_of(c, 1803), o, L1From::options, 0.0f);
  std::vector<bool> dense;
  for (int i = 0; i < 8; ++i) {
    d.renew_saved();  // asks saved_shape once
    dense.push_back(d.view.shape.backup_capacity == c.m);
    expect_matches_oracle(d, run_step(d), "step " + std::to_string(i));  // run_step synchronises
  }
  EXPECT_EQ(dense, (std::vector<bool>{false, true, false, true, false, true, dense[6], dense[6]}));
}

// Automatic dispatch with the default capacity sizes each step's compact state to the density the
// last forward measured (TrainingOptions::min_capacity): tile / 16 before any measurement, tile /
// 64 at 0.01-0.08%; a forward at a capacity that routes more than M / 256 rows raises it a step for
// good (hot rows route at any capacity here, so it climbs back to tile / 16). Every step matches
// the oracle whatever its form and capacity; dense-form trial steps are skipped in the sequence.
std::vector<int32_t> compact_capacities(bool hot_rows, uint64_t seed) {
  TrainingOptions o;
  o.l1_coef = kOptionsL1;
  Case c = problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::uniform, 0.0001, 1024, 64, 4096);
  DeviceStep d(spec_of(c, seed), o, L1From::options, 0.0f);
  EXPECT_EQ(d.plan->options().capacity, 16);
  EXPECT_EQ(d.plan->options().min_capacity, 4);
  if (hot_rows) {  // every 100th row fires its whole first tile (the generator's hot control channel)
    for (int64_t r = 0; r < c.m; r += 100) store_float(d.p.x.data(), c.dtype, r * c.k + c.k - 2, 1.0f);
    d.x.upload(d.p.x);
  }
  std::vector<int32_t> capacities;
  for (int i = 0; i < 8; ++i) {
    d.renew_saved();
    const bool dense = d.view.shape.backup_capacity == c.m;
    if (!dense) capacities.push_back(d.view.shape.capacity);
    expect_matches_oracle(d, run_step(d), "step " + std::to_string(i));  // run_step synchronises
  }
  return capacities;
}

TEST(CudaTrainingApi, CompactStateFollowsTheDensity) {
  TWELL_REQUIRE_DEVICE();
  const std::vector<int32_t> quiet = compact_capacities(false, 1901);
  ASSERT_GE(quiet.size(), 3u);
  EXPECT_EQ(quiet[0], 16);
  for (size_t i = 1; i < quiet.size(); ++i) EXPECT_EQ(quiet[i], 4) << "compact step " << i;
  const std::vector<int32_t> hot = compact_capacities(true, 1902);
  ASSERT_GE(hot.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(hot.begin(), hot.begin() + 3), (std::vector<int32_t>{16, 4, 8}));
  for (size_t i = 3; i < hot.size(); ++i) EXPECT_EQ(hot[i], 16) << "compact step " << i;
}

// The capacities a state may have are the plan's set: any other is refused by name, and a state
// sized at any capacity of the set runs (the backward takes the view's).
TEST(CudaTrainingApi, SavedShapesOfAnAdaptivePlan) {
  TWELL_REQUIRE_DEVICE();
  TrainingOptions o;
  o.l1_coef = kOptionsL1;
  Case c = problem_case<Case>(FfnKind::gated, DType::bf16, Pattern::uniform, 0.002, 257, 64, 1000);
  DeviceStep d(spec_of(c, 1903), o, L1From::options, 0.0f);
  const std::vector<TwellShape> shapes = d.plan->saved_shapes(c.m);
  ASSERT_EQ(shapes.size(), 4u);  // compact at 16, 8, 4; dense
  EXPECT_EQ(shapes[0].capacity, 16);
  EXPECT_EQ(shapes[1].capacity, 8);
  EXPECT_EQ(shapes[2].capacity, 4);
  EXPECT_EQ(shapes[3].backup_capacity, c.m);
  for (size_t i = 0; i < 3; ++i) {
    d.saved = DeviceBuffer(shapes[i].bytes(d.plan->saved_dtype()));
    d.view = d.new_view(d.saved, shapes[i]);
    expect_matches_oracle(d, run_step(d), "capacity " + std::to_string(shapes[i].capacity));
  }
  TwellShape other = shapes[0];
  other.capacity = 2;
  DeviceBuffer b(other.bytes(d.plan->saved_dtype()));
  const TwellView v = d.new_view(b, other);
  try {
    d.plan->forward(d.forward_args(), v);
    ADD_FAILURE() << "a compact state at capacity 2 was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "saved shape") << e.what();
    EXPECT_NE(std::string(e.what()).find("capacity one of 16, 8, 4"), std::string::npos) << e.what();
  }
}

#endif  // TWELL_WITH_CUDA

}  // namespace
}  // namespace twell::test
