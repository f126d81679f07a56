#include "core/capacity.hpp"

#include <algorithm>

#include "core/policy.hpp"

namespace twell::detail {

namespace {
// Calls f(v) for capacity, capacity / 2, ... while >= min_capacity (and >= 1); stops where f is true.
template <typename F>
bool for_each_capacity(int32_t capacity, int32_t min_capacity, F&& f) {
  for (int32_t v = capacity; v >= std::max(min_capacity, 1); v /= 2)
    if (f(v)) return true;
  return false;
}
}  // namespace

std::vector<int32_t> saved_capacities(int32_t capacity, int32_t min_capacity) {
  std::vector<int32_t> c;
  for_each_capacity(capacity, min_capacity, [&](int32_t v) { c.push_back(v); return false; });
  if (c.empty()) c.push_back(capacity);
  return c;
}

bool is_saved_capacity(int32_t c, int32_t capacity, int32_t min_capacity) {
  return for_each_capacity(capacity, min_capacity, [&](int32_t v) { return v == c; });
}

CapacityChoice::CapacityChoice(int32_t tile, int32_t capacity, int32_t min_capacity)
    : tile_(tile), ascending_(saved_capacities(capacity, min_capacity)) {
  std::reverse(ascending_.begin(), ascending_.end());
  floor_ = ascending_.front();
}

int32_t CapacityChoice::choose(double density) const {
  if (!(density >= 0)) return ascending_.back();
  const double want = policy::kCapacityEntriesHeadroom * density * double(tile_);
  const auto it = std::find_if(ascending_.begin(), ascending_.end(), [&](int32_t c) { return c >= want; });
  return std::max(it == ascending_.end() ? ascending_.back() : *it, floor_);
}

void CapacityChoice::routed(int64_t rows, int32_t capacity, int64_t routed) {
  if (rows <= 0) return;
  if (routed * policy::kCapacityRoutedDivisor > rows) {  // too many: one step up, for now
    const auto above = std::upper_bound(ascending_.begin(), ascending_.end(), capacity);
    if (above != ascending_.end() && *above > floor_) {
      floor_ = *above;
      clean_ = 0;
    }
    return;
  }
  // Forwards at the floor that routed few rows: after enough of them, try one step lower again.
  if (capacity != floor_ || floor_ == ascending_.front()) return;
  if (++clean_ < policy::kCapacityRetryForwards) return;
  floor_ = *(std::lower_bound(ascending_.begin(), ascending_.end(), floor_) - 1);
  clean_ = 0;
}

}  // namespace twell::detail
