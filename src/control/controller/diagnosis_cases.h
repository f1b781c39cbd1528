// The controller's diagnosis cases: one per generation that an incident
// ended (a member crashed, went silent, hung, or was reported), holding
// the generation's roster (slot -> member) and when it began, until the
// culprit analysis (src/diagnosis/diagnosis.h) returns its verdict; and
// the verdicts, by generation, which later incidents of the generation
// carry.
//
// The rules:
//   - the first incident of a generation that names a member in a slot
//     opens its case; incidents that are verdicts or judgements of their
//     own (diagnosed, straggler, numeric, corruption, unreachable) do not;
//   - a case takes one verdict; a generation with a verdict opens no case;
//   - at most `max_cases` cases and verdicts are kept, the newest.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_DIAGNOSIS_CASES_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_DIAGNOSIS_CASES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/time/time.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

class DiagnosisCases {
 public:
  struct Case {
    absl::Time since;
    std::vector<uint64_t> roster;  // slot -> member (0: vacant)
  };

  explicit DiagnosisCases(size_t max_cases) : max_(max_cases) {}

  // `incident` was recorded while `roster` held the slots: it takes the
  // verdict of its generation if there is one, else may open its case.
  void NoteIncident(Incident* incident, const std::vector<uint64_t>& roster);
  // The cases that await a verdict, by generation.
  std::map<int64_t, const Case*> Pending() const;
  // The case of `generation` if it awaits a verdict, else null.
  const Case* Awaiting(int64_t generation) const;
  // Records the verdict of `generation`'s case.
  void Decide(int64_t generation, const Verdict& v);

 private:
  const size_t max_;
  std::map<int64_t, Case> cases_;
  std::map<int64_t, Verdict> verdicts_;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_DIAGNOSIS_CASES_H_
