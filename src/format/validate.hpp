// The structural check shared by validate_twell and the ops that read a caller's TwELL buffer.
#pragma once
#include <string>

#include "twell/format.hpp"

namespace twell::detail {

// Throws Error(op, ...) unless `in` is a CPU view whose shape is valid, whose arrays are present
// (those with elements) and whose contents satisfy every invariant of docs/format.md: after it
// returns, every count, column, slot and routed row indexes inside the view's arrays. The header
// is not read.
void check_twell_structure(const char* op, const TwellView& in);

// Throws Error(op, "<prefix><array>", ...) when an array of `v` that has elements is null, or
// when an array is not aligned to its element size (the header to 8 bytes).
void check_twell_arrays(const char* op, const TwellView& v, const std::string& prefix = "");

}  // namespace twell::detail
