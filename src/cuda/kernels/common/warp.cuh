// The warp, as every kernel of the backend uses it: 32 lanes, all taking part in each shuffle and
// ballot (no kernel runs a partial warp through one).
#pragma once

namespace twell::gpu {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;  // every lane of the warp

}  // namespace twell::gpu
