// Checked size arithmetic: every product or sum that sizes a buffer or indexes one goes through
// these, so that an extreme shape raises a twell::Error naming what overflowed instead of wrapping.
#pragma once
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "twell/error.hpp"

namespace twell::detail {

// a OP b, or Error naming `what` when it overflows T (OP: __builtin_mul_overflow or _add_).
template <class T, class Overflows>
T checked_op(T a, T b, const char* op, const std::string& what, Overflows overflows, const char* sign) {
  static_assert(std::is_integral_v<T>, "size arithmetic takes integers");
  T r;
  if (overflows(a, b, &r))
    throw Error(op, what, "a size that fits in " + std::to_string(sizeof(T) * 8) + " bits",
                std::to_string(a) + sign + std::to_string(b) + " (overflow)");
  return r;
}

template <class T>
T checked_mul(T a, T b, const char* op, const std::string& what) {
  return checked_op(a, b, op, what, [](T x, T y, T* r) { return __builtin_mul_overflow(x, y, r); }, " * ");
}

template <class T>
T checked_add(T a, T b, const char* op, const std::string& what) {
  return checked_op(a, b, op, what, [](T x, T y, T* r) { return __builtin_add_overflow(x, y, r); }, " + ");
}

// Runs `allocate` (which allocates `bytes` bytes), turning an allocation failure into an Error
// naming `what`.
template <class F>
auto allocate_or_throw(const char* op, const std::string& what, size_t bytes, F&& allocate) {
  try {
    return allocate();
  } catch (const std::bad_alloc&) {
    throw Error(op, what, "memory for " + std::to_string(bytes) + " bytes", "allocation failed");
  } catch (const std::length_error&) {
    throw Error(op, what, "memory for " + std::to_string(bytes) + " bytes", "too large for a vector");
  }
}

// Runs `fn`, turning an allocation failure inside it (std::bad_alloc, or std::length_error from a
// container asked for more than it can hold) into an Error(op, "memory", ...): what the public
// entry points run their backends through, so that no allocation failure escapes as another type.
template <class F>
decltype(auto) translate_allocation_failure(const char* op, F&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    throw Error(op, "memory", "the host memory this call needs", "an allocation failed");
  } catch (const std::length_error&) {
    throw Error(op, "memory", "the host memory this call needs", "a size no container can hold");
  }
}

}  // namespace twell::detail
