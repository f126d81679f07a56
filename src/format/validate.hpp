// The structural check shared by validate_twell and the ops that read a caller's TwELL buffer.
#pragma once
#include "twell/format.hpp"

namespace twell::detail {

// Throws Error(op, ...) unless `in` is a CPU view whose shape is valid, whose arrays are present
// (those with elements) and whose contents satisfy every invariant of docs/format.md: after it
// returns, every count, column, slot and routed row indexes inside the view's arrays. The header
// is not read.
void check_twell_structure(const char* op, const TwellView& in);

// Throws Error(op, "<array>", ...) when an array of `out` that has elements is null.
void check_twell_arrays(const char* op, const TwellView& out);

}  // namespace twell::detail
