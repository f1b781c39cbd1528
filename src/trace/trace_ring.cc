#include "src/trace/trace_ring.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "src/trace/trace_json.h"

namespace holdfast::trace {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

uint64_t Pack(OpType op, DataType dtype, ReduceOp reduce, OpState state,
              int32_t peer) {
  return uint64_t{static_cast<uint8_t>(op)} |
         uint64_t{static_cast<uint8_t>(dtype)} << 8 |
         uint64_t{static_cast<uint8_t>(reduce)} << 16 |
         uint64_t{static_cast<uint8_t>(state)} << 24 |
         uint64_t{static_cast<uint32_t>(peer)} << 32;
}

void Unpack(uint64_t p, TraceRecord* r) {
  r->op = static_cast<OpType>(p & 0xff);
  r->dtype = static_cast<DataType>((p >> 8) & 0xff);
  r->reduce = static_cast<ReduceOp>((p >> 16) & 0xff);
  r->state = static_cast<OpState>((p >> 24) & 0xff);
  r->peer = static_cast<int32_t>(static_cast<uint32_t>(p >> 32));
}

}  // namespace

TraceRing::TraceRing(size_t capacity)
    : capacity_(std::max<size_t>(capacity, 1)), slots_(new Slot[capacity_]) {}

void TraceRing::Begin(const TraceRecord& r) {
  Slot& s = slots_[r.seq % capacity_];
  const uint64_t v = s.version.load(kRelaxed);
  s.version.store(v + 1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.seq.store(r.seq, kRelaxed);
  s.generation.store(r.generation, kRelaxed);
  s.coll_seq.store(r.coll_seq, kRelaxed);
  s.packed.store(Pack(r.op, r.dtype, r.reduce, OpState::kEnqueued, r.peer),
                 kRelaxed);
  s.count.store(r.count, kRelaxed);
  s.bytes.store(r.bytes, kRelaxed);
  s.enqueued_ns.store(r.enqueued_ns, kRelaxed);
  s.started_ns.store(0, kRelaxed);
  s.ended_ns.store(0, kRelaxed);
  s.status_code.store(0, kRelaxed);
  s.tag.store(r.tag, kRelaxed);
  s.used.store(true, kRelaxed);
  s.version.store(v + 2, std::memory_order_release);
}

void TraceRing::Transition(uint64_t seq, OpState state, int64_t now_ns,
                           int32_t status_code) {
  Slot& s = slots_[seq % capacity_];
  if (s.seq.load(kRelaxed) != seq) return;  // overwritten by a newer op
  const uint64_t v = s.version.load(kRelaxed);
  s.version.store(v + 1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const uint64_t p = s.packed.load(kRelaxed);
  s.packed.store((p & ~(uint64_t{0xff} << 24)) |
                     uint64_t{static_cast<uint8_t>(state)} << 24,
                 kRelaxed);
  if (state == OpState::kStarted) {
    s.started_ns.store(now_ns, kRelaxed);
  } else if (state != OpState::kEnqueued) {
    s.ended_ns.store(now_ns, kRelaxed);
    s.status_code.store(status_code, kRelaxed);
  }
  s.version.store(v + 2, std::memory_order_release);
}

std::vector<TraceRecord> TraceRing::Snapshot() const {
  std::vector<TraceRecord> out;
  out.reserve(capacity_);
  for (size_t i = 0; i < capacity_; ++i) {
    const Slot& s = slots_[i];
    for (;;) {
      const uint64_t v1 = s.version.load(std::memory_order_acquire);
      if (v1 & 1) continue;  // a write is in progress
      TraceRecord r;
      const bool used = s.used.load(kRelaxed);
      r.seq = s.seq.load(kRelaxed);
      r.generation = s.generation.load(kRelaxed);
      r.coll_seq = s.coll_seq.load(kRelaxed);
      Unpack(s.packed.load(kRelaxed), &r);
      r.count = s.count.load(kRelaxed);
      r.bytes = s.bytes.load(kRelaxed);
      r.enqueued_ns = s.enqueued_ns.load(kRelaxed);
      r.started_ns = s.started_ns.load(kRelaxed);
      r.ended_ns = s.ended_ns.load(kRelaxed);
      r.status_code = s.status_code.load(kRelaxed);
      r.tag = s.tag.load(kRelaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.version.load(kRelaxed) != v1) continue;
      if (used) out.push_back(r);
      break;
    }
  }
  std::sort(
      out.begin(), out.end(),
      [](const TraceRecord& a, const TraceRecord& b) { return a.seq < b.seq; });
  return out;
}

std::string ToJson(const std::vector<TraceRecord>& records, int rank, int size,
                   int64_t generation, int64_t now_mono_ns, int64_t now_unix_ns,
                   const std::string& abort_reason) {
  using nlohmann::json;
  json ops = json::array();
  for (const TraceRecord& r : records) ops.push_back(OpToJson(r));
  json doc = {
      {"schema", "holdfast.trace.v1"},
      {"rank", rank},
      {"size", size},
      {"generation", generation},
      {"clock", {{"mono_ns", now_mono_ns}, {"unix_ns", now_unix_ns}}},
      {"abort_reason", abort_reason},
      {"ops", std::move(ops)},
  };
  return doc.dump(1);
}

}  // namespace holdfast::trace
