// InferencePlan / TrainingPlan for Python. A plan holds views of its weights; by default the
// Python object also holds the weight arrays so that they outlive it. `borrow=True` drops that
// reference: the caller then guarantees the weights outlive every call (twell.torch's plan cache
// does, keying each plan on the weights' addresses and dropping it when a weight dies).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "arrays.hpp"
#include "plans.hpp"
#include "twell/ffn.hpp"
#include "twell/format.hpp"
#include "twell/training.hpp"

namespace twell::python {

namespace {

// What a weight may be (a dtype error names these).
constexpr const char* kWeightDtypes = "float32, float16 or bfloat16";

// The weights of a plan and, unless borrowed, the arrays that own them.
struct HeldWeights {
  FfnWeights weights;
  std::vector<nb::ndarray<nb::ro>> owners;

  HeldWeights(nb::handle gate, nb::handle up, nb::handle down, bool borrow, const char* op) {
    const ArrayArg g = to_arg(gate, op, "gate weight", Access::read, kWeightDtypes);
    const ArrayArg u = to_arg(up, op, "up weight", Access::read, kWeightDtypes);
    const ArrayArg d = to_arg(down, op, "down weight", Access::read, kWeightDtypes);
    weights.kind = gate.is_none() ? FfnKind::plain : FfnKind::gated;
    weights.gate = g.view;
    weights.up = u.view;
    weights.down = d.view;
    if (borrow) return;
    for (const ArrayArg* a : {&g, &u, &d})
      if (a->owner.is_valid()) owners.push_back(a->owner);
  }
};

// The saved state: a 16-byte aligned contiguous uint8 vector on `device` of at least
// shape.bytes(dtype) bytes, carved into the TwELL layout.
TwellView saved_view(const ArrayArg& a, const TwellShape& shape, DType dtype, Device device,
                     const char* op) {
  const TensorView v = byte_buffer(a, op, "saved", device);
  const size_t need = shape.bytes(dtype);
  if (size_t(v.shape[0]) < need)
    throw Error(op, "saved", "at least " + std::to_string(need) + " bytes",
                std::to_string(v.shape[0]) + " bytes");
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0)
    throw Error(op, "saved", "16-byte aligned memory", "an address 16 bytes do not divide");
  return make_twell_view(v.data, shape, dtype, device);
}

class PyInferencePlan {
 public:
  PyInferencePlan(nb::handle gate, nb::handle up, nb::handle down, const InferenceOptions& options,
                  bool borrow)
      : held_(gate, up, down, borrow, "InferencePlan"), plan_(held_.weights, options) {}

  void run(nb::handle x, nb::handle y, nb::handle counters, nb::handle workspace, uintptr_t stream) {
    const char* op = "InferencePlan::run";
    const Args a(x, y, counters, op, dtype());
    const ArrayArg ws = to_arg(workspace, op, "workspace", Access::write, "uint8");
    void* ws_data = nullptr;
    size_t ws_size = 0;
    if (!workspace.is_none()) {
      const TensorView v = byte_buffer(ws, op, "workspace", held_.weights.up.device);
      ws_data = v.data;
      ws_size = size_t(v.shape[0]);
    }
    plan_.run(a.args(), to_stream(stream), ws_data, ws_size);
  }

  // run() on raw addresses (Python's _run_addresses: private), for twell.torch's eager calls,
  // which hold suitable tensors already (no DLPack capsules). x and y: contiguous [rows, K] of the
  // weights' dtype on their device; counters: int64 [2] or 0; workspace: workspace_bytes bytes or
  // 0. The plan checks what an address can show (null, alignment, overlap, the workspace size,
  // the device of CUDA memory); that each address holds the bytes its role needs, the caller
  // vouches for: an address is not an array, and nothing here can tell its size.
  void run_addresses(uintptr_t x, uintptr_t y, int64_t rows, uintptr_t counters, uintptr_t workspace,
                     size_t workspace_bytes, uintptr_t stream) {
    const char* op = "InferencePlan::_run_addresses";
    if (workspace == 0 && workspace_bytes != 0)
      throw Error(op, "workspace", "an address for workspace_bytes " + std::to_string(workspace_bytes),
                  "0 (none)");
    plan_.run(address_args(x, y, rows, counters), to_stream(stream), reinterpret_cast<void*>(workspace),
              workspace_bytes);
  }
  size_t workspace_bytes_for(int64_t rows) const { return plan_.workspace_bytes(rows); }

  // Rebinds the plan to other weights of the same shapes (kept alive here unless borrowed).
  void set_weights(nb::handle gate, nb::handle up, nb::handle down, bool borrow) {
    HeldWeights next(gate, up, down, borrow, "InferencePlan::set_weights");
    plan_.set_weights(next.weights);
    held_ = std::move(next);
  }
  uintptr_t down_address() const { return reinterpret_cast<uintptr_t>(held_.weights.down.data); }

  // Whether run() would accept these arrays: an array the binding itself refuses (a read-only y,
  // a negative stride, an unknown dtype) is a reason too.
  std::pair<bool, std::string> can_run(nb::handle x, nb::handle y, nb::handle counters) {
    try {
      const Status s = plan_.can_run(Args(x, y, counters, "InferencePlan::can_run", dtype()).args());
      return {s.ok, s.reason};
    } catch (const Error& e) {
      return {false, e.what()};
    }
  }

  size_t workspace_bytes(nb::handle x, nb::handle y) const {
    const char* op = "InferencePlan::workspace_bytes";
    const ArrayArg xa = to_arg(x, op, "x", Access::read, dtype()), ya = to_arg(y, op, "y", Access::read, dtype());
    return plan_.workspace_bytes({xa.view, ya.view, {}});
  }

  const InferencePlan& plan() const { return plan_; }
  std::string dtype() const { return dtype_name(held_.weights.up.dtype); }  // x's, y's

 private:
  // run's arrays, held for the duration of a call.
  struct Args {
    ArrayArg x, y, counters;
    Args(nb::handle x_, nb::handle y_, nb::handle counters_, const char* op, const std::string& dtype)
        : x(to_arg(x_, op, "x", Access::read, dtype)),
          y(to_arg(y_, op, "y", Access::write, dtype)),
          counters(to_arg(counters_, op, "counters", Access::write, "int64")) {}
    InferenceArgs args() const { return {x.view, y.view, counters.view}; }
  };

  InferenceArgs address_args(uintptr_t x, uintptr_t y, int64_t rows, uintptr_t counters) const {
    const TensorView& up = held_.weights.up;
    const int64_t k = up.shape[1];
    InferenceArgs a;
    a.x = TensorView::matrix(reinterpret_cast<void*>(x), up.dtype, rows, k, up.device);
    a.y = TensorView::matrix(reinterpret_cast<void*>(y), up.dtype, rows, k, up.device);
    if (counters != 0) a.counters = TensorView::vector(reinterpret_cast<void*>(counters), DType::i64, 2, up.device);
    return a;
  }

  HeldWeights held_;
  InferencePlan plan_;
};

class PyTrainingPlan {
 public:
  PyTrainingPlan(nb::handle gate, nb::handle up, nb::handle down, const TrainingOptions& options,
                 bool borrow)
      : held_(gate, up, down, borrow, "TrainingPlan"), plan_(held_.weights, options) {}

  size_t saved_bytes(int64_t rows) const {
    return plan_.saved_shape(rows).bytes(plan_.saved_dtype());
  }

  // Rebinds the plan to other weights of the same shapes (kept alive here unless borrowed).
  void set_weights(nb::handle gate, nb::handle up, nb::handle down, bool borrow) {
    HeldWeights next(gate, up, down, borrow, "TrainingPlan::set_weights");
    plan_.set_weights(next.weights);
    held_ = std::move(next);
  }

  void forward(nb::handle x, nb::handle y, nb::handle saved, nb::handle stats, uintptr_t stream,
               nb::handle workspace) {
    const char* op = "TrainingPlan::forward";
    const ArrayArg xa = to_arg(x, op, "x", Access::read, dtype()), ya = to_arg(y, op, "y", Access::write, dtype());
    const ArrayArg st = to_arg(stats, op, "stats", Access::write, "float32");
    const ArrayArg ws = to_arg(workspace, op, "workspace", Access::write, "uint8");
    const ArrayArg sv = to_arg(saved, op, "saved", Access::write, "uint8");
    TrainingForwardArgs a{xa.view, ya.view, st.view, ws.view};
    plan_.forward(a, this->saved(sv, a.x, op), to_stream(stream));
  }

  void backward(nb::handle dy, nb::handle dx, nb::handle dgate, nb::handle dup, nb::handle ddown,
                nb::handle x, nb::handle saved, nb::handle l1_coef, uintptr_t stream,
                nb::handle workspace) {
    const char* op = "TrainingPlan::backward";
    const ArrayArg dya = to_arg(dy, op, "dy", Access::read, dtype());
    const ArrayArg dxa = to_arg(dx, op, "dx", Access::write, dtype());
    const ArrayArg dg = to_arg(dgate, op, "dgate", Access::write, "float32");
    const ArrayArg du = to_arg(dup, op, "dup", Access::write, "float32");
    const ArrayArg dd = to_arg(ddown, op, "ddown", Access::write, "float32");
    const ArrayArg xa = to_arg(x, op, "x", Access::read, dtype());
    const ArrayArg sv = to_arg(saved, op, "saved", Access::read, "uint8");
    const ArrayArg l1 = to_arg(l1_coef, op, "l1_coef", Access::read, "float32");
    const ArrayArg ws = to_arg(workspace, op, "workspace", Access::write, "uint8");
    TrainingBackwardArgs a;
    a.dy = dya.view;
    a.dx = dxa.view;
    a.dgate = dg.view;
    a.dup = du.view;
    a.ddown = dd.view;
    a.l1_coef = l1.view;
    a.workspace = ws.view;
    plan_.backward(a, xa.view, this->saved(sv, xa.view, op), to_stream(stream));
  }

  const TrainingPlan& plan() const { return plan_; }
  std::string dtype() const { return dtype_name(held_.weights.up.dtype); }  // x's, y's, dy's, dx's

 private:
  // The saved layout for x's rows (x is checked by the plan; an x of the wrong rank gets 0 rows
  // here and the plan's own error): the first of saved_shapes(rows) whose size the buffer has.
  // Not the shape saved_shape would ask for now: under automatic dispatch the form and capacity
  // may change between a forward and its backward.
  TwellView saved(const ArrayArg& saved, const TensorView& x, const char* op) const {
    const int64_t rows = x.rank == 2 ? x.shape[0] : 0;
    const DType dt = plan_.saved_dtype();
    const std::vector<TwellShape> shapes = plan_.saved_shapes(rows);
    const TensorView& v = saved.view;
    const TwellShape* pick = nullptr;
    if (v.rank == 1 && v.dtype == DType::u8)
      for (const TwellShape& s : shapes)
        if (size_t(v.shape[0]) == s.bytes(dt)) {
          pick = &s;
          break;
        }
    // No size matches: a buffer of at least the largest compact state's bytes is read as that
    // state; a smaller one is refused, naming every size a state of these rows may have.
    if (pick == nullptr && v.rank == 1 && v.dtype == DType::u8 && shapes.size() > 1 &&
        size_t(v.shape[0]) < shapes.front().bytes(dt)) {
      std::string sizes;
      for (const TwellShape& s : shapes)
        sizes += (sizes.empty() ? "" : ", ") + std::to_string(s.bytes(dt)) +
                 (s.backup_capacity > 0 ? " (dense form)" : " (capacity " + std::to_string(s.capacity) + ")");
      throw Error(op, "saved", "a state's bytes for " + std::to_string(rows) + " rows: " + sizes,
                  std::to_string(v.shape[0]) + " bytes");
    }
    return saved_view(saved, pick ? *pick : shapes.front(), dt, held_.weights.up.device, op);
  }

  HeldWeights held_;
  TrainingPlan plan_;
};

InferenceOptions inference_options(int32_t tile, int32_t capacity, Dispatch dispatch,
                                   double dense_above, Determinism determinism) {
  InferenceOptions o;
  o.tile = tile;
  o.capacity = capacity;
  o.dispatch = dispatch;
  o.dense_above = dense_above;
  o.determinism = determinism;
  return o;
}

TrainingOptions training_options(int32_t tile, int32_t capacity, double l1_coef,
                                 Determinism determinism, Dispatch dispatch, double dense_above,
                                 uint64_t state_tag, int32_t min_capacity) {
  TrainingOptions o;
  o.state_tag = state_tag;
  o.tile = tile;
  o.capacity = capacity;
  o.min_capacity = min_capacity;
  o.l1_coef = l1_coef;
  o.determinism = determinism;
  o.dispatch = dispatch;
  o.dense_above = dense_above;
  return o;
}

// The enums and value types the plans take and return.
void bind_types(nb::module_& m) {
  using namespace nb::literals;

  nb::enum_<Dispatch>(m, "Dispatch")
      .value("automatic", Dispatch::automatic)
      .value("force_sparse", Dispatch::force_sparse)
      .value("force_dense", Dispatch::force_dense);
  nb::enum_<Determinism>(m, "Determinism")
      .value("fast", Determinism::fast)
      .value("deterministic", Determinism::deterministic);
  nb::enum_<SavedForm>(m, "SavedForm")
      .value("compact", SavedForm::compact)
      .value("dense", SavedForm::dense);
  nb::enum_<TrainingCall>(m, "TrainingCall")
      .value("both", TrainingCall::both)
      .value("forward", TrainingCall::forward)
      .value("backward", TrainingCall::backward);
  nb::enum_<FfnKind>(m, "FfnKind").value("gated", FfnKind::gated).value("plain", FfnKind::plain);

  nb::class_<RunInfo>(m, "RunInfo", "Host-side summary of the last InferencePlan.run().")
      .def_ro("rows", &RunInfo::rows)
      .def_ro("routed_rows", &RunInfo::routed_rows, "-1 on CUDA: see the counters output")
      .def_ro("active", &RunInfo::active, "-1 on CUDA: see the counters output")
      .def_ro("ran_dense", &RunInfo::ran_dense)
      .def_prop_ro("density", &RunInfo::density, "active gate units per token");

  nb::class_<TwellShape>(m, "TwellShape", "Shape of a TwELL matrix (docs/format.md).")
      .def(nb::init<>())
      .def_rw("rows", &TwellShape::rows)
      .def_rw("cols", &TwellShape::cols)
      .def_rw("tile", &TwellShape::tile)
      .def_rw("capacity", &TwellShape::capacity)
      .def_rw("planes", &TwellShape::planes)
      .def_rw("backup_capacity", &TwellShape::backup_capacity)
      .def("num_tiles", &TwellShape::num_tiles)
      .def("bytes", &TwellShape::bytes, "dtype"_a,
           "Bytes of the single-buffer form (every array 16-byte aligned).");
}

void bind_inference_plan(nb::module_& m) {
  using namespace nb::literals;

  nb::class_<PyInferencePlan>(m, "InferencePlan",
                              "Sparse FFN inference. Weights [N, K]; down is neuron-major "
                              "(down_proj.weight.t()); gate=None for a plain FFN.")
      .def("__init__",
           [](PyInferencePlan* self, nb::handle gate, nb::handle up, nb::handle down,
              int32_t tile, int32_t capacity, Dispatch dispatch, double dense_above,
              Determinism determinism, bool borrow) {
             new (self) PyInferencePlan(
                 gate, up, down, inference_options(tile, capacity, dispatch, dense_above, determinism),
                 borrow);
           },
           "gate"_a.none(), "up"_a.none(), "down"_a.none(), "tile"_a = 0, "capacity"_a = 0,
           "dispatch"_a = Dispatch::automatic, "dense_above"_a = -1.0,
           "determinism"_a = Determinism::fast, "borrow"_a = false)
      .def("run", &PyInferencePlan::run, "x"_a.none(), "y"_a.none(), "counters"_a = nb::none(),
           "workspace"_a = nb::none(), "stream"_a = 0,
           "y = FFN(x). counters: optional int64 [2] {routed rows, active}; workspace: optional "
           "contiguous uint8 vector on x's device (at least workspace_bytes); stream: a "
           "cudaStream_t as an int. Arrays the op writes (y, counters, workspace) must be "
           "writable.")
      .def("_run_addresses", &PyInferencePlan::run_addresses, "x"_a, "y"_a, "rows"_a, "counters"_a,
           "workspace"_a, "workspace_bytes"_a, "stream"_a,
           "Private (twell.torch's eager calls): run() on raw addresses, x and y contiguous "
           "[rows, K] in the weights' dtype on their device, counters int64 [2] or 0, workspace "
           "(workspace_bytes bytes) or 0. Null, misaligned and overlapping addresses are refused; "
           "that each holds the bytes its role needs, the caller vouches for.")
      .def("workspace_bytes_for", &PyInferencePlan::workspace_bytes_for, "rows"_a,
           "workspace_bytes for `rows` rows (what _run_addresses needs on CUDA).")
      .def("set_weights", &PyInferencePlan::set_weights, "gate"_a.none(), "up"_a.none(),
           "down"_a.none(), "borrow"_a = false,
           "Points the plan at other weights of the same shapes and dtype (its dispatch "
           "calibration stays).")
      .def_prop_ro("_down_address", &PyInferencePlan::down_address,
                   "The address of the down weight the plan reads now (private).")
      .def("can_run", &PyInferencePlan::can_run, "x"_a.none(), "y"_a.none(),
           "counters"_a = nb::none())
      .def("workspace_bytes", &PyInferencePlan::workspace_bytes, "x"_a.none(), "y"_a.none())
      .def("last_run", [](const PyInferencePlan& p) { return p.plan().last_run(); })
      .def_prop_ro("tile", [](const PyInferencePlan& p) { return p.plan().options().tile; })
      .def_prop_ro("capacity", [](const PyInferencePlan& p) { return p.plan().options().capacity; })
      .def_prop_ro("dispatch", [](const PyInferencePlan& p) { return p.plan().options().dispatch; })
      .def_prop_ro("determinism",
                   [](const PyInferencePlan& p) { return p.plan().options().determinism; });
}

void bind_training_plan(nb::module_& m) {
  using namespace nb::literals;

  nb::class_<PyTrainingPlan>(m, "TrainingPlan",
                             "Sparse FFN training with caller-owned saved state (a uint8 buffer of "
                             "saved_bytes(M) bytes on the weights' device, asked for before each "
                             "step: under automatic dispatch on CUDA the saved form follows the "
                             "measured density; backward takes the form from the buffer's size).")
      .def("__init__",
           [](PyTrainingPlan* self, nb::handle gate, nb::handle up, nb::handle down,
              int32_t tile, int32_t capacity, double l1_coef, Determinism determinism,
              Dispatch dispatch, double dense_above, uint64_t state_tag, bool borrow,
              int32_t min_capacity) {
             new (self) PyTrainingPlan(gate, up, down,
                                       training_options(tile, capacity, l1_coef, determinism, dispatch,
                                                        dense_above, state_tag, min_capacity),
                                       borrow);
           },
           "gate"_a.none(), "up"_a.none(), "down"_a.none(), "tile"_a = 0, "capacity"_a = 0,
           "l1_coef"_a = 0.0,
           "determinism"_a = Determinism::fast, "dispatch"_a = Dispatch::automatic,
           "dense_above"_a = -1.0, "state_tag"_a = 0, "borrow"_a = false, "min_capacity"_a = 0,
           "state_tag: 0 (the default) = backward accepts only the saved states of this plan's "
           "forward; a nonzero tag = those of every plan made with that tag (same kind, shapes "
           "and options), for a cache that may remake a layer's plan between its forward and "
           "backward.")
      .def("saved_shape", [](const PyTrainingPlan& p, int64_t rows) { return p.plan().saved_shape(rows); },
           "rows"_a, "The form dispatch asks for now (backup_capacity 0: compact; M: dense).")
      .def("saved_shape",
           [](const PyTrainingPlan& p, int64_t rows, SavedForm form) { return p.plan().saved_shape(rows, form); },
           "rows"_a, "form"_a, "The shape of one form (the compact one at the options' capacity).")
      .def("saved_shapes", [](const PyTrainingPlan& p, int64_t rows) { return p.plan().saved_shapes(rows); },
           "rows"_a,
           "Every shape a saved state of `rows` rows may have: the compact form at each capacity "
           "automatic dispatch may pick (largest first), then the dense form (CUDA).")
      .def("saved_dtype", [](const PyTrainingPlan& p) { return p.plan().saved_dtype(); })
      .def("saved_bytes", &PyTrainingPlan::saved_bytes, "rows"_a)
      .def("set_weights", &PyTrainingPlan::set_weights, "gate"_a.none(), "up"_a.none(),
           "down"_a.none(), "borrow"_a = false, "Points the plan at other weights of the same shapes and dtype.")
      .def("workspace_bytes", [](const PyTrainingPlan& p, int64_t rows) { return p.plan().workspace_bytes(rows); },
           "rows"_a, "Scratch bytes of one forward or backward of `rows` rows, either saved form (0: none needed).")
      .def("workspace_bytes",
           [](const PyTrainingPlan& p, int64_t rows, SavedForm form, TrainingCall call) {
             return p.plan().workspace_bytes(rows, form, call);
           },
           "rows"_a, "form"_a, "call"_a = TrainingCall::both,
           "Scratch bytes of `rows` rows whose saved state has this form: for its forward and backward "
           "(call=both), or for one of them alone.")
      .def("forward", &PyTrainingPlan::forward, "x"_a.none(), "y"_a.none(), "saved"_a.none(),
           "stats"_a = nb::none(), "stream"_a = 0, "workspace"_a = nb::none(),
           "y = FFN(x); fills saved; stats: optional float32 [2] {L0, L1 value}; workspace: "
           "optional uint8 scratch of workspace_bytes(M) on x's device (else the plan's own).")
      .def("backward", &PyTrainingPlan::backward, "dy"_a.none(), "dx"_a.none(), "dgate"_a.none(),
           "dup"_a.none(), "ddown"_a.none(), "x"_a.none(), "saved"_a.none(),
           "l1_coef"_a = nb::none(), "stream"_a = 0, "workspace"_a = nb::none(),
           "Gradients (weights' in float32, ddown neuron-major). l1_coef: optional float32 [1] "
           "on x's device, this call's upstream gradient of the L1 value (l1_coef * d loss / "
           "d l1_loss; default: the plan's l1_coef): any sign, and a NaN or inf makes the "
           "gradients NaN where dense autograd's are (read on the device, unchecked, on CUDA).")
      .def_prop_ro("tile", [](const PyTrainingPlan& p) { return p.plan().options().tile; })
      .def_prop_ro("capacity", [](const PyTrainingPlan& p) { return p.plan().options().capacity; })
      .def_prop_ro("min_capacity", [](const PyTrainingPlan& p) { return p.plan().options().min_capacity; })
      .def_prop_ro("l1_coef", [](const PyTrainingPlan& p) { return p.plan().options().l1_coef; })
      .def_prop_ro("dispatch", [](const PyTrainingPlan& p) { return p.plan().options().dispatch; });
}

}  // namespace

void bind_plans(nb::module_& m) {
  bind_types(m);
  bind_inference_plan(m);
  bind_training_plan(m);
}

}  // namespace twell::python
