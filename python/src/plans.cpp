// InferencePlan / TrainingPlan for Python. A plan holds views of its weights; by default the
// Python object also holds the weight arrays so that they outlive it. `borrow=True` drops that
// reference: the caller then guarantees the weights outlive every call (twell.torch's plan cache
// does, keying each plan on the weights' addresses and dropping it when a weight dies).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "plans.hpp"
#include "twell/ffn.hpp"
#include "twell/format.hpp"
#include "twell/training.hpp"

namespace twell::python {

namespace {

using OptArray = std::optional<Array>;

TensorView optional_view(const OptArray& a, const char* op, const char* name) {
  return a ? to_view(*a, op, name) : TensorView{};
}

// The weights of a plan and, unless borrowed, the arrays that own them.
struct HeldWeights {
  FfnWeights weights;
  std::vector<Array> owners;

  HeldWeights(const OptArray& gate, const Array& up, const Array& down, bool borrow,
              const char* op) {
    weights.kind = gate ? FfnKind::gated : FfnKind::plain;
    weights.gate = optional_view(gate, op, "gate weight");
    weights.up = to_view(up, op, "up weight");
    weights.down = to_view(down, op, "down weight");
    if (borrow) return;
    if (gate) owners.push_back(*gate);
    owners.push_back(up);
    owners.push_back(down);
  }
};

// A 16-byte aligned uint8 vector on `device` of at least shape.bytes(dtype) bytes, carved into the
// TwELL layout.
TwellView saved_view(const TensorView& v, const TwellShape& shape, DType dtype, Device device,
                     const char* op) {
  const size_t need = shape.bytes(dtype);
  if (v.dtype != DType::u8 || v.rank != 1 || !v.is_contiguous())
    throw Error(op, "saved", "a contiguous uint8 vector", std::string(dtype_name(v.dtype)) + " " +
                v.shape_string());
  if (size_t(v.shape[0]) < need)
    throw Error(op, "saved", "at least " + std::to_string(need) + " bytes",
                std::to_string(v.shape[0]) + " bytes");
  if (v.device != device) throw Error(op, "saved", "device " + to_string(device), to_string(v.device));
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0)
    throw Error(op, "saved", "16-byte aligned memory", "an address 16 bytes do not divide");
  return make_twell_view(v.data, shape, dtype, device);
}

class PyInferencePlan {
 public:
  PyInferencePlan(const OptArray& gate, const Array& up, const Array& down,
                  const InferenceOptions& options, bool borrow)
      : held_(gate, up, down, borrow, "InferencePlan"), plan_(held_.weights, options) {}

  void run(const Array& x, const Array& y, const OptArray& counters, const OptArray& workspace,
           uintptr_t stream) {
    const char* op = "InferencePlan::run";
    const InferenceArgs args = this->args(x, y, counters, op);
    void* ws = nullptr;
    size_t ws_size = 0;
    if (workspace) {
      ws = workspace->data();
      ws_size = workspace->nbytes();
    }
    plan_.run(args, to_stream(stream), ws, ws_size);
  }

  std::pair<bool, std::string> can_run(const Array& x, const Array& y, const OptArray& counters) {
    const Status s = plan_.can_run(args(x, y, counters, "InferencePlan::can_run"));
    return {s.ok, s.reason};
  }

  size_t workspace_bytes(const Array& x, const Array& y) const {
    return plan_.workspace_bytes(args(x, y, std::nullopt, "InferencePlan::workspace_bytes"));
  }

  const InferencePlan& plan() const { return plan_; }

 private:
  InferenceArgs args(const Array& x, const Array& y, const OptArray& counters, const char* op) const {
    return {to_view(x, op, "x"), to_view(y, op, "y"), optional_view(counters, op, "counters")};
  }

  HeldWeights held_;
  InferencePlan plan_;
};

class PyTrainingPlan {
 public:
  PyTrainingPlan(const OptArray& gate, const Array& up, const Array& down,
                 const TrainingOptions& options, bool borrow)
      : held_(gate, up, down, borrow, "TrainingPlan"), plan_(held_.weights, options) {}

  size_t saved_bytes(int64_t rows) const {
    return plan_.saved_shape(rows).bytes(plan_.saved_dtype());
  }

  // Rebinds the plan to other weights of the same shapes (kept alive here unless borrowed).
  void set_weights(const OptArray& gate, const Array& up, const Array& down, bool borrow) {
    HeldWeights next(gate, up, down, borrow, "TrainingPlan::set_weights");
    plan_.set_weights(next.weights);
    held_ = std::move(next);
  }

  void forward(const Array& x, const Array& y, const Array& saved, const OptArray& stats,
               uintptr_t stream, const OptArray& workspace) {
    const char* op = "TrainingPlan::forward";
    TrainingForwardArgs a{to_view(x, op, "x"), to_view(y, op, "y"), optional_view(stats, op, "stats"),
                          optional_view(workspace, op, "workspace")};
    plan_.forward(a, this->saved(saved, a.x, op), to_stream(stream));
  }

  void backward(const Array& dy, const Array& dx, const OptArray& dgate, const Array& dup,
                const Array& ddown, const Array& x, const Array& saved, const OptArray& l1_coef,
                uintptr_t stream, const OptArray& workspace) {
    const char* op = "TrainingPlan::backward";
    TrainingBackwardArgs a;
    a.dy = to_view(dy, op, "dy");
    a.dx = to_view(dx, op, "dx");
    a.dgate = optional_view(dgate, op, "dgate");
    a.dup = to_view(dup, op, "dup");
    a.ddown = to_view(ddown, op, "ddown");
    a.l1_coef = optional_view(l1_coef, op, "l1_coef");
    a.workspace = optional_view(workspace, op, "workspace");
    const TensorView xv = to_view(x, op, "x");
    plan_.backward(a, xv, this->saved(saved, xv, op), to_stream(stream));
  }

  const TrainingPlan& plan() const { return plan_; }

 private:
  // The saved layout for x's rows (x is checked by the plan; an x of the wrong rank gets 0 rows
  // here and the plan's own error), in the form whose size the buffer has: the dense form's bytes
  // exactly (and not also the compact form's), else the compact form. Not the form saved_shape
  // would ask for now: under automatic dispatch that may change between a forward and its
  // backward.
  TwellView saved(const Array& saved, const TensorView& x, const char* op) const {
    const int64_t rows = x.rank == 2 ? x.shape[0] : 0;
    const DType dt = plan_.saved_dtype();
    const TwellShape compact = plan_.saved_shape(rows, SavedForm::compact);
    const TwellShape dense = plan_.saved_shape(rows, SavedForm::dense);
    const TensorView v = to_view(saved, op, "saved");
    const bool is_dense = v.rank == 1 && v.dtype == DType::u8 && size_t(v.shape[0]) == dense.bytes(dt) &&
                          size_t(v.shape[0]) != compact.bytes(dt);
    return saved_view(v, is_dense ? dense : compact, dt, held_.weights.up.device, op);
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
                                 Determinism determinism, Dispatch dispatch, double dense_above) {
  TrainingOptions o;
  o.tile = tile;
  o.capacity = capacity;
  o.l1_coef = l1_coef;
  o.determinism = determinism;
  o.dispatch = dispatch;
  o.dense_above = dense_above;
  return o;
}

}  // namespace

void bind_plans(nb::module_& m) {
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

  nb::class_<PyInferencePlan>(m, "InferencePlan",
                              "Sparse FFN inference. Weights [N, K]; down is neuron-major "
                              "(down_proj.weight.t()); gate=None for a plain FFN.")
      .def("__init__",
           [](PyInferencePlan* self, const OptArray& gate, const Array& up, const Array& down,
              int32_t tile, int32_t capacity, Dispatch dispatch, double dense_above,
              Determinism determinism, bool borrow) {
             new (self) PyInferencePlan(
                 gate, up, down, inference_options(tile, capacity, dispatch, dense_above, determinism),
                 borrow);
           },
           "gate"_a.none(), "up"_a, "down"_a, "tile"_a = 0, "capacity"_a = 0,
           "dispatch"_a = Dispatch::automatic, "dense_above"_a = -1.0,
           "determinism"_a = Determinism::fast, "borrow"_a = false)
      .def("run", &PyInferencePlan::run, "x"_a, "y"_a, "counters"_a = nb::none(),
           "workspace"_a = nb::none(), "stream"_a = 0,
           "y = FFN(x). counters: optional int64 [2] {routed rows, active}; workspace: optional "
           "bytes on x's device (at least workspace_bytes); stream: a cudaStream_t as an int.")
      .def("can_run", &PyInferencePlan::can_run, "x"_a, "y"_a, "counters"_a = nb::none())
      .def("workspace_bytes", &PyInferencePlan::workspace_bytes, "x"_a, "y"_a)
      .def("last_run", [](const PyInferencePlan& p) { return p.plan().last_run(); })
      .def_prop_ro("tile", [](const PyInferencePlan& p) { return p.plan().options().tile; })
      .def_prop_ro("capacity", [](const PyInferencePlan& p) { return p.plan().options().capacity; })
      .def_prop_ro("dispatch", [](const PyInferencePlan& p) { return p.plan().options().dispatch; })
      .def_prop_ro("determinism",
                   [](const PyInferencePlan& p) { return p.plan().options().determinism; });

  nb::class_<PyTrainingPlan>(m, "TrainingPlan",
                             "Sparse FFN training with caller-owned saved state (a uint8 buffer of "
                             "saved_bytes(M) bytes on the weights' device, asked for before each "
                             "step: under automatic dispatch on CUDA the saved form follows the "
                             "measured density; backward takes the form from the buffer's size).")
      .def("__init__",
           [](PyTrainingPlan* self, const OptArray& gate, const Array& up, const Array& down,
              int32_t tile, int32_t capacity, double l1_coef, Determinism determinism,
              Dispatch dispatch, double dense_above, bool borrow) {
             new (self) PyTrainingPlan(
                 gate, up, down,
                 training_options(tile, capacity, l1_coef, determinism, dispatch, dense_above), borrow);
           },
           "gate"_a.none(), "up"_a, "down"_a, "tile"_a = 0, "capacity"_a = 0, "l1_coef"_a = 0.0,
           "determinism"_a = Determinism::fast, "dispatch"_a = Dispatch::automatic,
           "dense_above"_a = -1.0, "borrow"_a = false)
      .def("saved_shape", [](const PyTrainingPlan& p, int64_t rows) { return p.plan().saved_shape(rows); },
           "rows"_a, "The form dispatch asks for now (backup_capacity 0: compact; M: dense).")
      .def("saved_shape",
           [](const PyTrainingPlan& p, int64_t rows, SavedForm form) { return p.plan().saved_shape(rows, form); },
           "rows"_a, "form"_a, "The shape of one form.")
      .def("saved_dtype", [](const PyTrainingPlan& p) { return p.plan().saved_dtype(); })
      .def("saved_bytes", &PyTrainingPlan::saved_bytes, "rows"_a)
      .def("set_weights", &PyTrainingPlan::set_weights, "gate"_a.none(), "up"_a, "down"_a,
           "borrow"_a = false, "Points the plan at other weights of the same shapes and dtype.")
      .def("workspace_bytes", [](const PyTrainingPlan& p, int64_t rows) { return p.plan().workspace_bytes(rows); },
           "rows"_a, "Scratch bytes of one forward or backward of `rows` rows, either saved form (0: none needed).")
      .def("workspace_bytes",
           [](const PyTrainingPlan& p, int64_t rows, SavedForm form) { return p.plan().workspace_bytes(rows, form); },
           "rows"_a, "form"_a, "Scratch bytes of one forward or backward of `rows` rows whose saved state has this form.")
      .def("forward", &PyTrainingPlan::forward, "x"_a, "y"_a, "saved"_a, "stats"_a = nb::none(),
           "stream"_a = 0, "workspace"_a = nb::none(),
           "y = FFN(x); fills saved; stats: optional float32 [2] {L0, L1 value}; workspace: "
           "optional uint8 scratch of workspace_bytes(M) on x's device (else the plan's own).")
      .def("backward", &PyTrainingPlan::backward, "dy"_a, "dx"_a, "dgate"_a.none(), "dup"_a,
           "ddown"_a, "x"_a, "saved"_a, "l1_coef"_a = nb::none(), "stream"_a = 0,
           "workspace"_a = nb::none(),
           "Gradients (weights' in float32, ddown neuron-major). l1_coef: optional float32 [1] "
           "on x's device, this call's L1 coefficient (default: the plan's).")
      .def_prop_ro("tile", [](const PyTrainingPlan& p) { return p.plan().options().tile; })
      .def_prop_ro("capacity", [](const PyTrainingPlan& p) { return p.plan().options().capacity; })
      .def_prop_ro("l1_coef", [](const PyTrainingPlan& p) { return p.plan().options().l1_coef; })
      .def_prop_ro("dispatch", [](const PyTrainingPlan& p) { return p.plan().options().dispatch; });
}

}  // namespace twell::python
