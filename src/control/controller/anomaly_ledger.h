// The controller's ledger of numeric anomalies (a NaN or Inf in a step's
// loss or gradients, or a loss spike; docs/gray-failures.md): the reports
// of the open case, the committed steps the members still keep, those found
// unclean, the data skipped, and the data at which each member was the
// source of non-finite values. It decides a case; Membership acts on the
// decision (an incident, a rollback to a new generation, fencing).
//
// The rules:
//   - a case is the reports of one generation; it is decided when every
//     worker has reported, or `settle` after the first report;
//   - it began at the earliest step reported; the job rolls back to the
//     newest committed step before it that the members still keep and
//     that is not unclean (a step restored whose next step went wrong
//     again is unclean: the update that made it may have been bad);
//   - the step's data is skipped from then on, unless a source slot was
//     the source before at other data: then its hardware, not the data, is
//     suspected of silent data corruption; it is fenced, and the data is
//     not skipped (unless every worker was a source: then the state they
//     share is, and nobody is suspected);
//   - a replica check's case (kind "replica", made by the controller:
//     slots whose replicated state differs from the majority's) begins
//     after the newest step where every slot agreed, skips no data, and
//     does not make the restored step unclean; a member outside the
//     majority a second time is fenced;
//   - a gradient check's case (kind "gradient", made by the controller:
//     slots whose local gradient norm of a step was far above the others')
//     rolls back to before the step and skips no data, as for a bit
//     flipped in flight; redone, the step that shows the same slot far off
//     again at the same data shows the data as the cause, and that data is
//     skipped; a member far off again at another step is fenced;
//   - with no clean step kept, the job stops.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_ANOMALY_LEDGER_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_ANOMALY_LEDGER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

class AnomalyLedger {
 public:
  // The reports of one generation, by slot.
  struct Case {
    int64_t generation = -1;
    absl::Time since;
    std::map<int, Anomaly> reports;
  };

  struct Decision {
    int64_t step = 0;  // where the anomaly began
    // The step to roll back to; -1: none is clean, and the job stops with
    // `evidence`.
    int64_t target = -1;
    bool skip = false;  // whether the step's data is skipped from now on
    DataRange data;     // that data (empty when no report named any)
    // The slot the incident names: a source of non-finite values, else a
    // reporter (-1: none, a replica check without a majority).
    int named_slot = -1;
    // Members suspected of silent data corruption, with the evidence of
    // each.
    std::vector<std::pair<uint64_t, std::string>> suspects;
    std::string evidence;  // in words
  };

  // OK if `a` is a report the ledger takes; InvalidArgument naming the
  // field otherwise.
  static absl::Status Check(const Anomaly& a);

  // Adds `slot`'s report to the case of `generation` (a case of an older
  // generation is dropped first).
  void Report(int slot, const Anomaly& a, int64_t generation, absl::Time now);
  // The open case once it is to be decided: every one of `workers` has
  // reported, or `settle` has passed since the first report. A case of
  // another generation than `generation` is dropped (another failure
  // opened a generation first; a step that goes wrong again is reported
  // again).
  std::optional<Case> TakeReady(int64_t generation, int workers,
                                absl::Duration settle, absl::Time now);

  // Decides `c`. `slots`: the member of each slot (0: empty);
  // `generation`: the current one. A decision with a target trims the
  // commits to those the members keep after restoring it, and marks a
  // rollback pending.
  Decision Decide(const Case& c, const std::vector<uint64_t>& slots,
                  int64_t generation);
  // The generation the rollback opened (after Decide).
  void NoteRollbackGeneration(int64_t generation) {
    rollback_generation_ = generation;
  }
  // A step committed: a rollback is no longer pending.
  void NoteCommit(int64_t step);

  bool rollback_pending() const { return rollback_pending_; }
  int rollbacks() const { return rollbacks_; }
  void FillSkipData(google::protobuf::RepeatedPtrField<DataRange>* out) const;
  // The data each suspect was the source at, in words.
  std::string SourcesText(uint64_t member) const;

 private:
  // Of the reports of `c`: the step where it began (into d->step) and its
  // data (d->data), the slots that were its sources, the least number of
  // snapshots kept, and the report that speaks for it (a source's first).
  static const Anomaly& Gather(const Case& c, Decision* d,
                               std::vector<int>* sources, int* keep);
  // Why no step is rolled back to.
  std::string NoCleanStepText(int keep) const;
  // The newest kept commit before `step` that is clean, or -1.
  int64_t CleanTarget(int64_t step, int keep) const;
  // The slots among `sources` whose member was the source before at data
  // other than `data`; records `data` for the others. None when every
  // worker is among `sources`.
  std::vector<int> Suspects(const std::vector<int>& sources,
                            const DataRange& data,
                            const std::vector<uint64_t>& slots);
  // The slots among `sources` (outside a replica check's majority) whose
  // member was outside it before; records the others.
  std::vector<int> ReplicaSuspects(const std::vector<int>& sources,
                                   const std::vector<uint64_t>& slots);
  // The slots among `sources` (whose local gradient norm was far above
  // the others' at `step`, reading `data`) whose member was such an
  // outlier before at another step or data; sets `data_cause` when one was
  // at the same (the replay reproduced it: its data, not a flip); records
  // the others.
  std::vector<int> GradientSuspects(const std::vector<int>& sources,
                                    int64_t step, const DataRange& data,
                                    const std::vector<uint64_t>& slots,
                                    bool* data_cause);
  // Why the member of `slot` is suspected, for a case of `kind`.
  std::string SuspectText(const std::string& kind, int slot,
                          const DataRange& data, uint64_t member) const;
  // Keeps the commits the members hold after restoring `target`.
  void TrimCommits(int64_t target, int keep);

  std::optional<Case> open_;
  // The committed steps, newest first (after a rollback, only those the
  // members still keep), and those found unclean.
  std::deque<int64_t> commits_;
  std::set<int64_t> poisoned_;
  // The generation opened by the last rollback, and the step it restored.
  int64_t rollback_generation_ = -1;
  int64_t rollback_target_ = -1;
  // Generations opened since the last rollback and before the next commit
  // carry MembershipUpdate::rollback.
  bool rollback_pending_ = false;
  int rollbacks_ = 0;
  std::vector<std::pair<int64_t, int64_t>> skip_data_;
  // Per member: the data at which it was the source of non-finite values.
  std::map<uint64_t, std::vector<std::pair<int64_t, int64_t>>> nan_sources_;
  // The members that were outside a replica check's majority.
  std::set<uint64_t> replica_sources_;
  // Per member: where (data, or step and -1) its gradient norm was an
  // outlier.
  std::map<uint64_t, std::vector<std::pair<int64_t, int64_t>>>
      gradient_sources_;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_ANOMALY_LEDGER_H_
