// One traced op as JSON (the "ops" entries of docs/trace-schema.md), both
// ways: the dumps, the abort notices' trace tails and the controller's and
// `holdfast diagnose`'s readers share it.
#ifndef HOLDFAST_SRC_TRACE_TRACE_JSON_H_
#define HOLDFAST_SRC_TRACE_TRACE_JSON_H_

#include <vector>

#include <nlohmann/json.hpp>

#include "holdfast/trace.h"

namespace holdfast::trace {

nlohmann::json OpToJson(const TraceRecord& r);
// False when `o` is not an op of the schema (a missing or unknown name).
bool OpFromJson(const nlohmann::json& o, TraceRecord* r);

// The last `n` collectives of generation `generation` among `records`
// (sorted by seq), as a JSON array: what an abort notice carries.
nlohmann::json CollectiveTail(const std::vector<TraceRecord>& records,
                              int64_t generation, size_t n);

}  // namespace holdfast::trace

#endif  // HOLDFAST_SRC_TRACE_TRACE_JSON_H_
