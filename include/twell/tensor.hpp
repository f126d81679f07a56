// Non-owning tensor views: pointer, dtype, device, shape and strides (in elements).
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "twell/dtype.hpp"

namespace twell {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};
std::string to_string(Device d);

// A view of at most 4 dimensions. Row-major contiguous unless strides say otherwise.
struct TensorView {
  static constexpr int kMaxRank = 4;
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};

  // Contiguous row-major [rows, cols] matrix.
  static TensorView matrix(void* data, DType dt, int64_t rows, int64_t cols, Device dev = Device::cpu());
  // Contiguous vector [n].
  static TensorView vector(void* data, DType dt, int64_t n, Device dev = Device::cpu());

  bool defined() const { return data != nullptr; }
  // Product of the shape; throws Error when the rank is outside 0..kMaxRank, a dimension is
  // negative or the product overflows int64.
  int64_t numel() const;
  int64_t rows() const { return shape[0]; }
  int64_t cols() const { return rank >= 2 ? shape[1] : 1; }
  bool is_contiguous() const;
  std::string shape_string() const;  // "[4, 2048]"; "<rank 7>" for a rank outside 0..kMaxRank
};

}  // namespace twell
