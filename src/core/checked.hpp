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

template <class T>
T checked_mul(T a, T b, const char* op, const std::string& what) {
  static_assert(std::is_integral_v<T>, "checked_mul takes integers");
  T r;
  if (__builtin_mul_overflow(a, b, &r))
    throw Error(op, what, "a size that fits in " + std::to_string(sizeof(T) * 8) + " bits",
                std::to_string(a) + " * " + std::to_string(b) + " (overflow)");
  return r;
}

template <class T>
T checked_add(T a, T b, const char* op, const std::string& what) {
  static_assert(std::is_integral_v<T>, "checked_add takes integers");
  T r;
  if (__builtin_add_overflow(a, b, &r))
    throw Error(op, what, "a size that fits in " + std::to_string(sizeof(T) * 8) + " bits",
                std::to_string(a) + " + " + std::to_string(b) + " (overflow)");
  return r;
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

}  // namespace twell::detail
