// The compact saved state's capacity under automatic dispatch (TrainingOptions::min_capacity): the
// capacities a plan may pick, and the rule that picks one per step from what the last forwards
// measured. Host logic only: the CUDA backend feeds it the counts it polls (calibration.hpp).
#pragma once
#include <cstdint>
#include <vector>

namespace twell::detail {

// capacity, capacity / 2, capacity / 4, ... (integer halves) while >= min_capacity: largest first.
std::vector<int32_t> saved_capacities(int32_t capacity, int32_t min_capacity);
// Whether c is one of saved_capacities(capacity, min_capacity), without building the list.
bool is_saved_capacity(int32_t c, int32_t capacity, int32_t min_capacity);

class CapacityChoice {
 public:
  CapacityChoice(int32_t tile, int32_t capacity, int32_t min_capacity);

  // The capacity of the next step's compact state at `density` (the last forward's active fraction;
  // < 0: none measured yet, the largest): the smallest candidate that holds
  // policy::kCapacityEntriesHeadroom times a tile's mean entries, at least the floor.
  int32_t choose(double density) const;
  // A forward of `rows` rows at `capacity` routed `routed` rows: more than rows /
  // policy::kCapacityRoutedDivisor raises the floor to the next candidate above `capacity`;
  // policy::kCapacityRetryForwards forwards at the floor with fewer lower it a step again.
  void routed(int64_t rows, int32_t capacity, int64_t routed);
  int32_t floor() const { return floor_; }

 private:
  int32_t tile_;
  std::vector<int32_t> ascending_;  // the candidates, smallest first
  int32_t floor_;
  int32_t clean_ = 0;  // forwards at the raised floor since it was raised or last lowered
};

}  // namespace twell::detail
