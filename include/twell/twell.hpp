// Umbrella header of the twell public API.
#pragma once
#include "twell/dtype.hpp"
#include "twell/error.hpp"
#include "twell/ffn.hpp"
#include "twell/format.hpp"
#include "twell/info.hpp"
#include "twell/tensor.hpp"
#include "twell/threads.hpp"
#include "twell/training.hpp"
