#include "src/backend/gloo/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace holdfast::backend::gloo {

float BFloat16ToFloat(uint16_t v) {
  uint32_t bits = uint32_t{v} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float Float16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00 | (x > 0x7f800000u ? 0x200 : 0);
  }
  if (x >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {                       // below the smallest normal
    float a;
    std::memcpy(&a, &x, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  const uint32_t mant = x & 0x7fffff;
  uint32_t h = (((x >> 23) - 112) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

namespace {

struct Sum {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_same_v<T, bool>) {
      return a || b;
    } else {
      return a + b;
    }
  }
};
struct Prod {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_same_v<T, bool>) {
      return a && b;
    } else {
      return a * b;
    }
  }
};
struct Min {
  template <typename T>
  static T Apply(T a, T b) {
    return std::min(a, b);
  }
};
struct Max {
  template <typename T>
  static T Apply(T a, T b) {
    return std::max(a, b);
  }
};

template <typename T, typename Op>
void Kernel(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(Op::Apply(x[i], y[i]));
}

using ToFloat = float (*)(uint16_t);
using FromFloat = uint16_t (*)(float);

template <ToFloat kTo, FromFloat kFrom, typename Op>
void Kernel16(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = kFrom(Op::Apply(kTo(x[i]), kTo(y[i])));
}

template <typename Op>
ReduceFn ForOp(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return &Kernel<float, Op>;
    case DataType::kFloat64:
      return &Kernel<double, Op>;
    case DataType::kInt32:
      return &Kernel<int32_t, Op>;
    case DataType::kInt64:
      return &Kernel<int64_t, Op>;
    case DataType::kUInt8:
      return &Kernel<uint8_t, Op>;
    case DataType::kInt8:
      return &Kernel<int8_t, Op>;
    case DataType::kBool:
      return &Kernel<bool, Op>;
    case DataType::kBFloat16:
      return &Kernel16<BFloat16ToFloat, FloatToBFloat16, Op>;
    case DataType::kFloat16:
      return &Kernel16<Float16ToFloat, FloatToFloat16, Op>;
  }
  return nullptr;
}

template <typename T>
void Divide(void* data, size_t n, int d) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<T>(p[i] / static_cast<T>(d));
}

template <ToFloat kTo, FromFloat kFrom>
void Divide16(void* data, size_t n, int d) {
  uint16_t* p = static_cast<uint16_t*>(data);
  for (size_t i = 0; i < n; ++i)
    p[i] = kFrom(kTo(p[i]) / static_cast<float>(d));
}

}  // namespace

ReduceFn GetReduceFn(DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return ForOp<Sum>(dtype);
    case ReduceOp::kProduct:
      return ForOp<Prod>(dtype);
    case ReduceOp::kMin:
      return ForOp<Min>(dtype);
    case ReduceOp::kMax:
      return ForOp<Max>(dtype);
  }
  return nullptr;
}

void DivideInPlace(void* data, size_t n, DataType dtype, int divisor) {
  switch (dtype) {
    case DataType::kFloat32:
      return Divide<float>(data, n, divisor);
    case DataType::kFloat64:
      return Divide<double>(data, n, divisor);
    case DataType::kInt32:
      return Divide<int32_t>(data, n, divisor);
    case DataType::kInt64:
      return Divide<int64_t>(data, n, divisor);
    case DataType::kUInt8:
      return Divide<uint8_t>(data, n, divisor);
    case DataType::kInt8:
      return Divide<int8_t>(data, n, divisor);
    case DataType::kBool:
      return;  // refused by the communicator
    case DataType::kBFloat16:
      return Divide16<BFloat16ToFloat, FloatToBFloat16>(data, n, divisor);
    case DataType::kFloat16:
      return Divide16<Float16ToFloat, FloatToFloat16>(data, n, divisor);
  }
}

}  // namespace holdfast::backend::gloo
