// Where the running binary is installed: the shipped configs and the plugin are found beside it
// (bin/../share/multinorm, bin/libmultinorm_cuda.so) whatever the working directory.
#pragma once
#include <string>

namespace multinorm {

// The directory of the running executable (/proc/self/exe).
std::string executable_dir();

}  // namespace multinorm
