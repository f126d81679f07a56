// `twell check`: a quick conformance run of every pattern and dtype against the fp64 oracle.
#pragma once
#include <iosfwd>
#include <string>

namespace twell::cli {

// Returns the number of failing cases; prints one line per case.
int run_check(const std::string& backend, std::ostream& out);

}  // namespace twell::cli
