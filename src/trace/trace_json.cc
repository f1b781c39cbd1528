#include "src/trace/trace_json.h"

#include <string>

#include "absl/status/status.h"
#include "holdfast/types.h"

namespace holdfast::trace {
namespace {

using nlohmann::json;

template <typename E>
bool Named(const std::string& name, absl::string_view (*to_name)(E), int n,
           E* out) {
  for (int i = 0; i < n; ++i) {
    const E e = static_cast<E>(i);
    if (to_name(e) == name) {
      *out = e;
      return true;
    }
  }
  return false;
}

}  // namespace

json OpToJson(const TraceRecord& r) {
  json o = {
      {"seq", r.seq},
      {"generation", r.generation},
      {"coll_seq", r.coll_seq},
      {"op", std::string(OpTypeName(r.op))},
      {"dtype", std::string(DataTypeName(r.dtype))},
      {"count", r.count},
      {"bytes", r.bytes},
      {"state", std::string(OpStateName(r.state))},
      {"enqueued_ns", r.enqueued_ns},
      {"started_ns", r.started_ns},
      {"ended_ns", r.ended_ns},
  };
  if (r.op == OpType::kAllReduce || r.op == OpType::kReduceScatter) {
    o["reduce"] = std::string(ReduceOpName(r.reduce));
  }
  if (r.op == OpType::kBroadcast) o["root"] = r.peer;
  if (r.op == OpType::kSend || r.op == OpType::kRecv) {
    o["peer"] = r.peer;
    o["tag"] = r.tag;
  }
  if (r.ended_ns != 0) {
    o["status"] =
        absl::StatusCodeToString(static_cast<absl::StatusCode>(r.status_code));
  }
  return o;
}

bool OpFromJson(const json& o, TraceRecord* r) {
  if (!o.is_object()) return false;
  for (const char* k :
       {"seq", "generation", "coll_seq", "count", "bytes", "started_ns",
        "ended_ns", "enqueued_ns", "root", "peer", "tag"}) {
    if (o.contains(k) && !o.at(k).is_number_integer()) return false;
  }
  for (const char* k : {"op", "dtype", "state", "reduce"}) {
    if (o.contains(k) && !o.at(k).is_string()) return false;
  }
  r->seq = o.value("seq", uint64_t{0});
  r->generation = o.value("generation", int64_t{0});
  r->coll_seq = o.value("coll_seq", int64_t{-1});
  r->count = o.value("count", uint64_t{0});
  r->bytes = o.value("bytes", uint64_t{0});
  r->started_ns = o.value("started_ns", int64_t{0});
  r->ended_ns = o.value("ended_ns", int64_t{0});
  r->enqueued_ns = o.value("enqueued_ns", int64_t{0});
  r->peer = o.value("root", o.value("peer", -1));
  r->tag = o.value("tag", uint32_t{0});
  return Named(o.value("op", std::string()), &OpTypeName, 8 /* kRecv + 1 */,
               &r->op) &&
         Named(o.value("dtype", std::string()), &DataTypeName, kNumDataTypes,
               &r->dtype) &&
         Named(o.value("state", std::string()), &OpStateName,
               6 /* kAborted + 1 */, &r->state) &&
         (!o.contains("reduce") ||
          Named(o.value("reduce", std::string()), &ReduceOpName, kNumReduceOps,
                &r->reduce));
}

json CollectiveTail(const std::vector<TraceRecord>& records, int64_t generation,
                    size_t n) {
  std::vector<const TraceRecord*> tail;
  for (auto it = records.rbegin(); it != records.rend() && tail.size() < n;
       ++it) {
    if (it->generation == generation && IsCollective(it->op)) {
      tail.push_back(&*it);
    }
  }
  json out = json::array();
  for (auto it = tail.rbegin(); it != tail.rend(); ++it) {
    out.push_back(OpToJson(**it));
  }
  return out;
}

}  // namespace holdfast::trace
