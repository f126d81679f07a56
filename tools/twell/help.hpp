// The help texts of the twell command line: the global one and one per command.
#pragma once

namespace twell::cli {

extern const char* const kGlobalHelp;
extern const char* const kBenchHelp;
extern const char* const kCheckHelp;
extern const char* const kInfoHelp;

}  // namespace twell::cli
