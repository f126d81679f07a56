#include "core/capacity.hpp"

#include <algorithm>

#include "core/policy.hpp"

namespace twell::detail {

std::vector<int32_t> saved_capacities(int32_t capacity, int32_t min_capacity) {
  std::vector<int32_t> c;
  for (int32_t v = capacity; v >= std::max(min_capacity, 1); v /= 2) c.push_back(v);
  if (c.empty()) c.push_back(capacity);
  return c;
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
  if (rows <= 0 || routed * policy::kCapacityRoutedDivisor <= rows) return;
  const auto above = std::upper_bound(ascending_.begin(), ascending_.end(), capacity);
  if (above != ascending_.end()) floor_ = std::max(floor_, *above);
}

}  // namespace twell::detail
