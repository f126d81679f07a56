// Python classes over twell::InferencePlan and twell::TrainingPlan.
#pragma once
#include <nanobind/nanobind.h>

namespace twell::python {

void bind_plans(nanobind::module_& m);

}  // namespace twell::python
