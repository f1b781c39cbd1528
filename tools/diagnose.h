// `holdfast diagnose DIR`: the culprit analysis (src/diagnosis/diagnosis.h)
// run offline on what holdfast-run left in its log directory: the trace
// dumps (DIR/trace/trace-g<G>-r<R>-p<pid>.json, docs/trace-schema.md) and
// the incidents of DIR/summary.json.
#ifndef HOLDFAST_TOOLS_DIAGNOSE_H_
#define HOLDFAST_TOOLS_DIAGNOSE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "src/diagnosis/diagnosis.h"

namespace holdfast::diagnose {

// The evidence of one generation, as the log directory holds it.
struct Evidence {
  int64_t generation = -1;
  std::vector<diagnosis::SlotEvidence> slots;
};

// Reads `dir`. `generation`: the one to analyze; unset, the lowest one with
// an incident in summary.json, else the lowest with a dump. A slot that an
// incident of that generation names crashed or left is dead; silent or
// absent, frozen; a slot with a dump answered with its trace. NotFound
// when `dir` holds no dump of the generation; InvalidArgument for a dump
// or summary that does not parse, naming the file.
absl::StatusOr<Evidence> Load(const std::string& dir,
                              std::optional<int64_t> generation);
// The same with the incidents given (summary.json's "incidents" array).
absl::StatusOr<Evidence> Load(const std::string& dir,
                              std::optional<int64_t> generation,
                              const nlohmann::json& incidents);

// The verdict as JSON (kind, culprits, victims, collective, evidence,
// confidence).
nlohmann::json ToJson(int64_t generation, const diagnosis::Diagnosis& d);

}  // namespace holdfast::diagnose

#endif  // HOLDFAST_TOOLS_DIAGNOSE_H_
