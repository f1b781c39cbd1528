#include "src/backend/gloo/reduce.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

using namespace holdfast::backend::gloo;
using holdfast::DataType;
using holdfast::ReduceOp;

TEST_CASE("bfloat16 conversion rounds to nearest even") {
  CHECK(FloatToBFloat16(1.0f) == 0x3f80);
  CHECK(FloatToBFloat16(-2.0f) == 0xc000);
  CHECK(BFloat16ToFloat(0x3f80) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(FloatToBFloat16(1.00390625f) == 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even (up).
  CHECK(FloatToBFloat16(1.01171875f) == 0x3f82);
  CHECK(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

TEST_CASE("float16 conversion covers normals and subnormals and inf and nan") {
  CHECK(FloatToFloat16(1.0f) == 0x3c00);
  CHECK(FloatToFloat16(-2.0f) == 0xc000);
  CHECK(FloatToFloat16(65504.0f) == 0x7bff);
  CHECK(FloatToFloat16(65520.0f) == 0x7c00);               // rounds to inf
  CHECK(FloatToFloat16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(FloatToFloat16(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(Float16ToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(Float16ToFloat(0x7bff) == 65504.0f);
  CHECK(std::isinf(Float16ToFloat(0x7c00)));
  CHECK(std::isnan(Float16ToFloat(FloatToFloat16(std::nanf("")))));
  // 1 + 2^-11 is halfway between 1 and the next half: ties to even.
  CHECK(FloatToFloat16(1.00048828125f) == 0x3c00);
  // Every half round-trips exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // nan payloads
    REQUIRE(FloatToFloat16(Float16ToFloat(static_cast<uint16_t>(h))) == h);
  }
}

TEST_CASE("reduce kernels for every dtype and op") {
  float a[3] = {1, -5, 3}, b[3] = {4, 2, -3}, o[3];
  GetReduceFn(DataType::kFloat32, ReduceOp::kSum)(o, a, b, 3);
  CHECK(o[0] == 5);
  CHECK(o[1] == -3);
  CHECK(o[2] == 0);
  GetReduceFn(DataType::kFloat32, ReduceOp::kMin)(o, a, b, 3);
  CHECK(o[1] == -5);
  GetReduceFn(DataType::kFloat32, ReduceOp::kMax)(o, a, b, 3);
  CHECK(o[2] == 3);
  GetReduceFn(DataType::kFloat32, ReduceOp::kProduct)(o, a, b, 3);
  CHECK(o[0] == 4);

  int64_t i1[2] = {7, -7}, i2[2] = {2, 2};
  DivideInPlace(i1, 2, DataType::kInt64, 2);
  CHECK(i1[0] == 3);
  CHECK(i1[1] == -3);  // truncates toward zero
  GetReduceFn(DataType::kInt64, ReduceOp::kProduct)(i1, i1, i2, 2);
  CHECK(i1[0] == 6);

  uint16_t h1 = FloatToFloat16(1.5f), h2 = FloatToFloat16(2.25f), ho;
  GetReduceFn(DataType::kFloat16, ReduceOp::kSum)(&ho, &h1, &h2, 1);
  CHECK(Float16ToFloat(ho) == 3.75f);
  uint16_t b1 = FloatToBFloat16(3.0f), b2 = FloatToBFloat16(-1.0f), bo;
  GetReduceFn(DataType::kBFloat16, ReduceOp::kMin)(&bo, &b1, &b2, 1);
  CHECK(BFloat16ToFloat(bo) == -1.0f);

  // int8 compares signed; a bool sum is a logical or, a product an and.
  int8_t c1[2] = {-5, 100}, c2[2] = {3, 100}, co[2];
  GetReduceFn(DataType::kInt8, ReduceOp::kMin)(co, c1, c2, 2);
  CHECK(co[0] == -5);
  GetReduceFn(DataType::kInt8, ReduceOp::kSum)(co, c1, c2, 2);
  CHECK(co[0] == -2);
  CHECK(co[1] == -56);  // wraps as torch's int8 does
  bool t1[3] = {true, true, false}, t2[3] = {true, false, false}, to[3];
  GetReduceFn(DataType::kBool, ReduceOp::kSum)(to, t1, t2, 3);
  CHECK((to[0] && to[1] && !to[2]));
  GetReduceFn(DataType::kBool, ReduceOp::kProduct)(to, t1, t2, 3);
  CHECK((to[0] && !to[1] && !to[2]));

  for (int d = 0; d < holdfast::kNumDataTypes; ++d) {
    for (int r = 0; r < holdfast::kNumReduceOps; ++r) {
      CHECK(GetReduceFn(static_cast<DataType>(d), static_cast<ReduceOp>(r)) !=
            nullptr);
    }
  }
}
