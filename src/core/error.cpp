#include "twell/error.hpp"

namespace twell {

Error::Error(std::string op, std::string argument, std::string expected, std::string actual)
    : std::runtime_error(op + ": " + argument + ": expected " + expected + ", got " + actual),
      op_(std::move(op)),
      argument_(std::move(argument)),
      expected_(std::move(expected)),
      actual_(std::move(actual)) {}

}  // namespace twell
