// Every op and dtype, checked against a straightforward reference, on 2, 3,
// 4, 5, 6 and 8 real processes over loopback. Counts include ones that are not
// multiples of the rank count. Each rank checks its own results and reports
// the first mismatch.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <sstream>

#include "holdfast/communicator.h"
#include "src/backend/gloo/reduce.h"
#include "test/support/process_group.h"

using namespace holdfast;
namespace bg = holdfast::backend::gloo;

namespace {

const DataType kTypes[] = {
    DataType::kFloat32,  DataType::kFloat64, DataType::kInt32, DataType::kInt64,
    DataType::kBFloat16, DataType::kFloat16, DataType::kUInt8, DataType::kInt8};

// Small integers: every sum and product below is exact in every dtype, so
// the reference does not depend on the reduction order.
double Value(int rank, size_t i, bool for_product) {
  if (for_product) return 1 + static_cast<double>((rank + i) % 2);  // 1 or 2
  return 1 + static_cast<double>((rank * 7 + i * 3) % 5);           // 1..5
}

// Encodes doubles as `dtype` elements.
std::vector<uint8_t> Encode(DataType dtype, const std::vector<double>& v) {
  std::vector<uint8_t> out(v.size() * DataTypeSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    uint8_t* p = out.data() + i * DataTypeSize(dtype);
    switch (dtype) {
      case DataType::kFloat32: {
        float x = static_cast<float>(v[i]);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::kFloat64: {
        double x = v[i];
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::kInt32: {
        int32_t x = static_cast<int32_t>(v[i]);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::kInt64: {
        int64_t x = static_cast<int64_t>(v[i]);
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::kBFloat16: {
        uint16_t x = bg::FloatToBFloat16(static_cast<float>(v[i]));
        std::memcpy(p, &x, 2);
        break;
      }
      case DataType::kFloat16: {
        uint16_t x = bg::FloatToFloat16(static_cast<float>(v[i]));
        std::memcpy(p, &x, 2);
        break;
      }
      case DataType::kUInt8: {
        p[0] = static_cast<uint8_t>(v[i]);
        break;
      }
      case DataType::kInt8: {
        const int8_t x = static_cast<int8_t>(v[i]);
        std::memcpy(p, &x, 1);
        break;
      }
      case DataType::kBool: {
        p[0] = v[i] != 0;
        break;
      }
    }
  }
  return out;
}

// The reference for `op` over `n` ranks of element i, in double, then the
// average's division as the element type does it.
std::vector<uint8_t> Reference(DataType dtype, ReduceOp op, int n, size_t count,
                               size_t offset) {
  std::vector<double> out(count);
  const bool product = op == ReduceOp::kProduct;
  for (size_t i = 0; i < count; ++i) {
    double acc = Value(0, offset + i, product);
    for (int r = 1; r < n; ++r) {
      double x = Value(r, offset + i, product);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage:
          acc += x;
          break;
        case ReduceOp::kProduct:
          acc *= x;
          break;
        case ReduceOp::kMin:
          acc = std::min(acc, x);
          break;
        case ReduceOp::kMax:
          acc = std::max(acc, x);
          break;
      }
    }
    out[i] = acc;
  }
  std::vector<uint8_t> bytes = Encode(dtype, out);
  if (op == ReduceOp::kAverage)
    bg::DivideInPlace(bytes.data(), count, dtype, n);
  return bytes;
}

std::vector<uint8_t> Input(DataType dtype, int rank, size_t count,
                           size_t offset, bool product) {
  std::vector<double> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = Value(rank, offset + i, product);
  return Encode(dtype, v);
}

struct Checker {
  int failures = 0;
  std::string first;
  void Status(const absl::Status& s, const std::string& what) {
    if (s.ok()) return;
    Fail(what + ": " + s.ToString());
  }
  void Bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
             const std::string& what) {
    if (got == want) return;
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    Fail(what + ": mismatch at byte " + std::to_string(i));
  }
  void Fail(const std::string& what) {
    if (failures++ == 0) first = what;
  }
};

using Body = int (*)(Communicator& comm, int rank, int n);

// Rank `rank` of `n`: connects through a file store in `dir` and runs
// `body`, which reports its result; a failure to connect is reported as
// the result.
int WithComm(int rank, int n, const std::string& dir, Body body) {
  auto store = NewFileStore(dir);
  if (!store.ok()) return 10;
  CommunicatorOptions o;
  o.rank = rank;
  o.size = n;
  o.timeout = absl::Seconds(60);
  auto made = Communicator::Create(*store, o);
  if (!made.ok()) {
    proc::Report("event=result failures=1 msg=" + made.status().ToString());
    return 11;
  }
  Communicator& comm = **made;
  return body(comm, rank, n);
}

int RunAllOps(Communicator& comm, int rank, int n) {
  Checker check;
  // 70001 elements are more than 64 KiB in every dtype: an AllReduce that
  // large is reduced block by block at each block's owner, the smaller ones
  // by one exchange of whole inputs.
  const size_t counts[] = {1, 7, 1001, 70001};
  for (DataType dt : kTypes) {
    const std::string t(DataTypeName(dt));
    const size_t es = DataTypeSize(dt);
    for (size_t count : counts) {
      const std::string c = " " + t + " x" + std::to_string(count);
      for (int opi = 0; opi < kNumReduceOps; ++opi) {
        ReduceOp op = static_cast<ReduceOp>(opi);
        const bool product = op == ReduceOp::kProduct;
        auto buf = Input(dt, rank, count, 0, product);
        check.Status(comm.AllReduce(buf.data(), count, dt, op)->Wait(),
                     "AllReduce" + c);
        check.Bytes(buf, Reference(dt, op, n, count, 0),
                    "AllReduce " + std::string(ReduceOpName(op)) + c);

        auto send = Input(dt, rank, count * n, 0, product);
        std::vector<uint8_t> recv(count * es);
        check.Status(
            comm.ReduceScatter(send.data(), recv.data(), count, dt, op)->Wait(),
            "ReduceScatter" + c);
        check.Bytes(recv, Reference(dt, op, n, count, count * rank),
                    "ReduceScatter " + std::string(ReduceOpName(op)) + c);
      }
      for (int root = 0; root < n; ++root) {
        auto buf = rank == root ? Input(dt, root, count, 0, false)
                                : std::vector<uint8_t>(count * es, 0xEE);
        check.Status(comm.Broadcast(buf.data(), count, dt, root)->Wait(),
                     "Broadcast" + c);
        check.Bytes(buf, Input(dt, root, count, 0, false),
                    "Broadcast root " + std::to_string(root) + c);
      }
      {
        auto send = Input(dt, rank, count, 0, false);
        std::vector<uint8_t> recv(count * n * es, 0xEE);
        check.Status(
            comm.AllGather(send.data(), recv.data(), count, dt)->Wait(),
            "AllGather" + c);
        std::vector<uint8_t> want;
        for (int r = 0; r < n; ++r) {
          auto part = Input(dt, r, count, 0, false);
          want.insert(want.end(), part.begin(), part.end());
        }
        check.Bytes(recv, want, "AllGather" + c);
      }
      {
        // Block j of rank r's input: values for (rank r, offset j * count).
        std::vector<uint8_t> send;
        for (int j = 0; j < n; ++j) {
          auto part = Input(dt, rank, count, j * count, false);
          send.insert(send.end(), part.begin(), part.end());
        }
        std::vector<uint8_t> recv(count * n * es, 0xEE);
        check.Status(comm.AllToAll(send.data(), recv.data(), count, dt)->Wait(),
                     "AllToAll" + c);
        std::vector<uint8_t> want;
        for (int j = 0; j < n; ++j) {
          auto part = Input(dt, j, count, rank * count, false);
          want.insert(want.end(), part.begin(), part.end());
        }
        check.Bytes(recv, want, "AllToAll" + c);
      }
      {
        // Ring of point-to-point messages, two per neighbour, tagged.
        const int right = (rank + 1) % n, left = (rank + n - 1) % n;
        auto out1 = Input(dt, rank, count, 0, false);
        auto out2 = Input(dt, rank, count, 5, false);
        std::vector<uint8_t> in1(count * es), in2(count * es);
        OpOptions t7;
        t7.tag = 7;
        auto s1 = comm.Send(out1.data(), count, dt, right);
        auto s2 = comm.Send(out2.data(), count, dt, right, t7);
        auto r2 = comm.Recv(in2.data(), count, dt, left, t7);
        auto r1 = comm.Recv(in1.data(), count, dt, left);
        check.Status(s1->Wait(), "Send" + c);
        check.Status(s2->Wait(), "Send tag 7" + c);
        check.Status(r1->Wait(), "Recv" + c);
        check.Status(r2->Wait(), "Recv tag 7" + c);
        check.Bytes(in1, Input(dt, left, count, 0, false), "Send/Recv" + c);
        check.Bytes(in2, Input(dt, left, count, 5, false),
                    "Send/Recv tag 7" + c);
      }
    }
  }
  check.Status(comm.Barrier()->Wait(), "Barrier");
  // A larger AllReduce, of uneven blocks.
  {
    const size_t big = 1 << 20 | 3;
    auto buf = Input(DataType::kFloat32, rank, big, 0, false);
    check.Status(
        comm.AllReduce(buf.data(), big, DataType::kFloat32, ReduceOp::kSum)
            ->Wait(),
        "AllReduce big");
    check.Bytes(buf, Reference(DataType::kFloat32, ReduceOp::kSum, n, big, 0),
                "AllReduce big");
  }
  const size_t ops = comm.TraceSnapshot().size();
  proc::Report("event=result failures=" + std::to_string(check.failures) +
               " ops=" + std::to_string(ops) + " msg=" + check.first);
  return 0;
}

// Floats whose sum depends on the order of its terms: element i of rank r
// is a large value on some ranks, a small one on others, with signs and
// exponents that change along the buffer.
float OrderValue(int rank, size_t i) {
  const uint64_t h = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull ^
                     (i + 1) * 0xC2B2AE3D27D4EB4Full;
  const float mantissa = 1.0f + static_cast<float>(h >> 44) / (1 << 20);
  const int exponent = static_cast<int>((h >> 8) % 40) - 20;
  return ((h >> 3) & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
}

// AllReduce and ReduceScatter fold the inputs in rank order, the same at any
// count and wherever an element sits in the buffer, so a caller whose
// layout changes (DDP's buckets after a recovery) gets the same bits.
int RunOrderCheck(Communicator& comm, int rank, int n) {
  Checker check;
  int differs = 0;  // elements whose fold in another order differs
  // Up to 64 KiB of every peer's input: one exchange; above: per-owner
  // blocks. Each shift puts the same operands at other positions.
  for (size_t count : {size_t{5}, size_t{3001}, size_t{70001}}) {
    for (size_t shift : {size_t{0}, size_t{1}, count / 3 + 2}) {
      const std::string c =
          " x" + std::to_string(count) + " shift " + std::to_string(shift);
      std::vector<float> buf(count + shift, 0.0f);
      std::vector<float> want(count);
      for (size_t i = 0; i < count; ++i) {
        buf[shift + i] = OrderValue(rank, i);
        float acc = OrderValue(0, i);
        for (int r = 1; r < n; ++r) acc += OrderValue(r, i);
        want[i] = acc;
        float other = OrderValue(n - 1, i);
        for (int r = n - 2; r >= 0; --r) other += OrderValue(r, i);
        differs += other != acc;
      }
      check.Status(comm.AllReduce(buf.data(), count + shift, DataType::kFloat32,
                                  ReduceOp::kSum)
                       ->Wait(),
                   "AllReduce" + c);
      std::vector<float> got(buf.begin() + static_cast<ptrdiff_t>(shift),
                             buf.end());
      size_t bad = 0;
      while (bad < count && got[bad] == want[bad]) ++bad;
      if (bad < count) {
        check.Fail("AllReduce" + c + ": element " + std::to_string(bad) +
                   " is not the rank-order fold");
      }
    }
    // ReduceScatter: rank r's block holds elements shifted by r blocks.
    std::vector<float> send(count * n);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < count; ++i) {
        send[j * count + i] = OrderValue(rank, i + j);
      }
    }
    std::vector<float> recv(count);
    check.Status(comm.ReduceScatter(send.data(), recv.data(), count,
                                    DataType::kFloat32, ReduceOp::kSum)
                     ->Wait(),
                 "ReduceScatter x" + std::to_string(count));
    for (size_t i = 0; i < count; ++i) {
      float acc = OrderValue(0, i + rank);
      for (int r = 1; r < n; ++r) acc += OrderValue(r, i + rank);
      if (recv[i] != acc) {
        check.Fail("ReduceScatter x" + std::to_string(count) + ": element " +
                   std::to_string(i) + " is not the rank-order fold");
        break;
      }
    }
  }
  // The values must make the order visible, or the test shows nothing.
  if (differs == 0) check.Fail("no element's sum depends on the order");
  proc::Report("event=result failures=" + std::to_string(check.failures) +
               " ops=0 msg=" + check.first);
  return 0;
}

void RunGroup(int n, Body body = RunAllOps) {
  const std::string dir = proc::MakeTempDir();
  proc::ProcessGroup group(
      n, [&](int rank) { return WithComm(rank, n, dir, body); });
  for (int r = 0; r < n; ++r) {
    auto result = group.WaitEvent(r, "result", absl::Seconds(240));
    REQUIRE(result.has_value());
    INFO("rank " << r << " of " << n << ": " << (*result)["msg"]);
    CHECK((*result)["failures"] == "0");
  }
  for (const auto& e : group.WaitAll(absl::Seconds(30))) {
    CHECK(e.exited);
    CHECK(e.code == 0);
  }
}

}  // namespace

TEST_CASE("every op and dtype matches the reference on 2 ranks") {
  RunGroup(2);
}
TEST_CASE("every op and dtype matches the reference on 3 ranks") {
  RunGroup(3);
}
TEST_CASE("every op and dtype matches the reference on 4 ranks") {
  RunGroup(4);
}
// A prime, 2 x 3, and 2 x 2 x 2 ranks.
TEST_CASE("every op and dtype matches the reference on 5 ranks") {
  RunGroup(5);
}
TEST_CASE("every op and dtype matches the reference on 6 ranks") {
  RunGroup(6);
}
TEST_CASE("every op and dtype matches the reference on 8 ranks") {
  RunGroup(8);
}
TEST_CASE("AllReduce and ReduceScatter fold in rank order at any position") {
  for (int n : {3, 4, 5}) {
    INFO(n << " ranks");
    RunGroup(n, RunOrderCheck);
  }
}
