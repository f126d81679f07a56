// twell::Error and twell::Status: how every op reports a problem. A library never exits or aborts.
#pragma once
#include <stdexcept>
#include <string>

namespace twell {

// Thrown for any unsupported shape, dtype, layout, device or value. what() reads
// "<op>: <argument>: expected <expected>, got <actual>".
class Error : public std::runtime_error {
 public:
  Error(std::string op, std::string argument, std::string expected, std::string actual);
  const std::string& op() const noexcept { return op_; }
  const std::string& argument() const noexcept { return argument_; }
  const std::string& expected() const noexcept { return expected_; }
  const std::string& actual() const noexcept { return actual_; }

 private:
  std::string op_, argument_, expected_, actual_;
};

// Result of a can_run() query: ok, or the reason the op cannot run (same text as the Error).
struct Status {
  bool ok = true;
  std::string reason;
  static Status success() { return {}; }
  static Status failure(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const noexcept { return ok; }
};

}  // namespace twell
