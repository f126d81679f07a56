// twell._core: the twell C++ API for Python. Arrays cross as DLPack (numpy, PyTorch CPU/CUDA, ...)
// with zero copy; CUDA streams cross as integers. twell::Error becomes twell.TwellError (a
// ValueError) with the attributes op, argument, expected and actual.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.hpp"
#include "plans.hpp"
#include "twell/dtype.hpp"
#include "twell/error.hpp"
#include "twell/ffn.hpp"
#include "twell/info.hpp"
#include "twell/threads.hpp"

namespace nb = nanobind;

namespace {

void bind_error(nb::module_& m) {
  PyObject* type = PyErr_NewExceptionWithDoc(
      "twell.TwellError",
      "An unsupported shape, dtype, layout, device or value. Attributes: op, argument, expected, "
      "actual.",
      PyExc_ValueError, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr("TwellError") = nb::steal(type);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        try {
          std::rethrow_exception(p);
        } catch (const twell::Error& e) {
          nb::handle type(static_cast<PyObject*>(payload));
          nb::object err = type(e.what());
          err.attr("op") = e.op();
          err.attr("argument") = e.argument();
          err.attr("expected") = e.expected();
          err.attr("actual") = e.actual();
          PyErr_SetObject(type.ptr(), err.ptr());
        }
      },
      type);
}

}  // namespace

NB_MODULE(_core, m) {
  using namespace nb::literals;
  m.doc() = "twell C++ bindings: DLPack arrays in, no framework linked.";
  bind_error(m);

  nb::enum_<twell::DType>(m, "DType")
      .value("f32", twell::DType::f32)
      .value("f16", twell::DType::f16)
      .value("bf16", twell::DType::bf16)
      .value("i32", twell::DType::i32)
      .value("i64", twell::DType::i64)
      .value("u16", twell::DType::u16)
      .value("u8", twell::DType::u8);
  m.def("dtype_size", &twell::dtype_size, "dtype"_a);

  m.def("version", &twell::version);
  m.def("cuda_compiled", &twell::cuda_compiled, "The CUDA backend is part of this build.");
  m.def("cuda_device_count", &twell::cuda_device_count);
  m.def("cuda_devices", &twell::cuda_devices);
  m.def("cpu_description", &twell::cpu_description);
  m.def("blas_core", &twell::blas_core, "OpenBLAS's kernel set in this process.");
  m.def("blas_core_for_cpu", &twell::blas_core_for_cpu,
        "OpenBLAS's kernel set for this CPU's vector units ('' : OpenBLAS's own detection).");
  m.def("blas_core_advice", &twell::blas_core_advice,
        "Where OpenBLAS runs kernels older than the CPU's vector units, what to do; else ''.");
  m.def("set_cpu_threads", &twell::set_cpu_threads, "n"_a,
        "Threads of every CPU call: n >= 1 (at most cpu_count()), or 0 (the default): the calling "
        "thread's OpenMP count. Process-wide; twell.torch sets it to torch.get_num_threads().");
  m.def("cpu_threads_setting", &twell::cpu_threads_setting, "What set_cpu_threads set (0: automatic).");
  m.def("cpu_threads", &twell::cpu_threads, "The threads a CPU call from this thread runs now.");
  m.def("last_cpu_threads", &twell::last_cpu_threads,
        "The threads the last CPU call ran (0: none yet).");
  m.def("cpu_count", &twell::cpu_count,
        "CPUs this process may run on (affinity mask, within a cgroup CPU quota).");

  m.def(
      "count_active",
      [](nb::handle values) {
        const auto a = twell::python::to_arg(values, "count_active", "values",
                                             twell::python::Access::read,
                                             "float32, float16 or bfloat16");
        return twell::count_active(a.view);
      },
      "values"_a,
      "The entries of a contiguous CPU float tensor (float32, float16, bfloat16) that are not "
      "<= 0 (positive or NaN): the units a ReLU makes active, as the plans count them.");

  twell::python::bind_plans(m);
}
