#include "src/runtime/recovery.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "holdfast/status.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/store/keys.h"

namespace holdfast {
namespace {

// How long a member that found a mismatch waits for the controller's
// verdict on it (the controller reaches it within its diagnosis settle
// time, DetectionOptions::diagnosis_settle).
constexpr absl::Duration kMismatchVerdictWait = absl::Seconds(15);

}  // namespace

std::string Received(const RecoveryRecord& rec) {
  if (rec.from_disk) {
    return absl::StrCat(rec.bytes_received,
                        " bytes received, from the disk tier");
  }
  return absl::StrCat(rec.bytes_received, " bytes received",
                      rec.bytes_read_in_place > 0
                          ? absl::StrCat(", ", rec.bytes_read_in_place,
                                         " of them read in place on this host")
                          : "");
}

Recovery::Recovery(const RuntimeOptions* options, GenerationView* gens,
                   control::MemberClient* client,
                   std::shared_ptr<control::ControllerStore> store,
                   std::shared_ptr<fault::Hooks> faults, Member* member)
    : options_(options),
      gens_(gens),
      client_(client),
      store_(std::move(store)),
      faults_(std::move(faults)),
      member_(member) {}

namespace {

// A communicator that cannot be built by this program at all (an unknown
// backend, NCCL not linked, no GPU) will not be built by the next
// generation either: stop instead of cycling.
bool CannotBuild(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kFailedPrecondition;
}

}  // namespace

absl::StatusOr<int64_t> Recovery::RecoverIn(const GenerationView::View& v,
                                            RecoveryRecord* rec, bool* fatal) {
  absl::Status s = member_->BuildComms();
  if (CannotBuild(s)) {
    *fatal = true;
    return s;
  }
  if (!s.ok()) return s;
  rec->rebuilt_ms = NowMs();
  // The restore may run while the training communicator is still being
  // built (Member::BuildComms); it is awaited whatever the restore's
  // outcome, so that no build outlives this generation's attempt.
  absl::StatusOr<int64_t> restored = member_->Restore(rec);
  const int64_t restore_end = NowMs();
  absl::StatusOr<int64_t> up = member_->AwaitComms();
  if (!restored.ok()) {
    *fatal = !IsRecoverable(restored.status()) && up.ok() &&
             gens_->CommHealth().ok();
    return restored.status();
  }
  if (!up.ok()) {
    *fatal = CannotBuild(up.status());
    return up.status();
  }
  rec->comm_up_ms = *up;
  rec->restored_ms = restore_end;
  rec->generation = v.generation;
  rec->restored_step = *restored;
  rec->lost_steps = member_->lost_steps();
  HOLDFAST_LOG_INFO(
      "runtime: slot {} of {} recovered at generation {}: step {} "
      "restored ({}) in {} ms",
      v.slot, v.world, v.generation, *restored, Received(*rec),
      rec->restored_ms - rec->seen_ms);
  return *restored;
}

absl::StatusOr<RecoveryRecord> Recovery::Run(const absl::Status& cause) {
  RecoveryRecord rec;
  rec.cause = std::string(cause.message());
  rec.seen_ms = NowMs();
  int64_t failed = gens_->CommGeneration();
  rec.failed_generation = failed;
  gens_->Abort(INT64_MAX, absl::StrCat("recovering: ", cause.message()));
  HOLDFAST_RETURN_IF_ERROR(FoundMismatch(failed));
  rec.aborted_ms = NowMs();
  client_->SetPhase(control::PHASE_RECOVERING, 0);
  HOLDFAST_LOG_WARN("runtime: slot {} recovering from generation {}: {}",
                    slot(), failed, std::string(cause.message()));
  const absl::Time deadline = absl::Now() + options_->recovery_timeout;
  ++recoveries_;
  bool fault_point = true;
  std::string last_error = rec.cause;
  // A member that never came to the last rendezvous (alive as far as
  // the controller knows, but stuck): reported instead of a plain
  // communicator failure, which would rebuild the same group around it.
  int absent = AbsentPeer(cause);
  std::vector<int> unreachable = UnreachablePeers(cause);
  // Who this member could not reach goes to the controller at once (it
  // triangulates a data network fault from several members' word), also
  // when another member's report or a crash opens the next generation.
  ReportUnreachable(unreachable, last_error, failed);
  for (;;) {
    HOLDFAST_RETURN_IF_ERROR(gens_->Stopped());
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("recovery from generation ", rec.failed_generation,
                       " did not finish within ",
                       absl::FormatDuration(options_->recovery_timeout),
                       "; last error: ", last_error));
    }
    // The controller usually opens the next generation by itself (a
    // crash is seen at once). If it does not, nobody it knows of failed:
    // report the broken communicator, which rebuilds the group.
    if (!gens_->AwaitGeneration(failed, absl::Now() + options_->report_grace)) {
      ReportBroken(last_error, absent, failed, unreachable);
      gens_->AwaitGeneration(failed, deadline);
      continue;
    }
    HOLDFAST_RETURN_IF_ERROR(gens_->Stopped());
    // A peer may have found it after this member began to recover.
    HOLDFAST_RETURN_IF_ERROR(FoundMismatch(rec.failed_generation));
    if (failed != rec.failed_generation) {
      HOLDFAST_RETURN_IF_ERROR(FoundMismatch(failed));
    }
    rec.agreed_ms = NowMs();
    const GenerationView::View v = gens_->Current();
    if (v.standby) {
      return absl::InternalError("runtime: a worker was made a standby");
    }
    if (fault_point) {
      fault_point = false;
      faults_->AtRecovery(v.slot, recoveries_);
    }
    bool fatal = false;
    absl::StatusOr<int64_t> restored = RecoverIn(v, &rec, &fatal);
    if (restored.ok()) return rec;
    if (fatal) return restored.status();
    const absl::Status s = restored.status();
    last_error = std::string(s.message());
    absent = AbsentPeer(s);
    unreachable = UnreachablePeers(s);
    ReportUnreachable(unreachable, last_error, v.generation);
    HOLDFAST_LOG_WARN("runtime: generation {} failed during recovery: {}",
                      v.generation, last_error);
    gens_->Abort(INT64_MAX, last_error);
    failed = v.generation;
  }
}

absl::Status Recovery::FoundMismatch(int64_t gen) {
  absl::StatusOr<std::optional<std::string>> found =
      store_->TryGet(keys::Mismatch(gen));
  if (!found.ok() || !found->has_value()) return absl::OkStatus();
  const std::string what = **found;
  // The controller names the culprit from every rank's trace: with a
  // majority call, the ranks that called otherwise are replaced and the
  // others go on; else the job stops on the mismatch.
  ReportBroken(what, -1, gen);
  absl::StatusOr<std::string> raw =
      store_->Get(keys::Verdict(gen), kMismatchVerdictWait);
  std::string why = "no verdict came from the controller";
  if (raw.ok()) {
    const nlohmann::json v =
        nlohmann::json::parse(*raw, nullptr, /*allow_exceptions=*/false);
    if (v.is_object() && v.value("kind", "") == "mismatch" &&
        v.value("action", "") == "replace" && v.contains("culprits") &&
        v["culprits"].is_array()) {
      const bool culprit = std::find(v["culprits"].begin(), v["culprits"].end(),
                                     slot()) != v["culprits"].end();
      if (!culprit) {
        HOLDFAST_LOG_WARN(
            "runtime: slot {}: {}; the controller replaces slot(s) {}, and "
            "this slot goes on",
            slot(), what, v["culprits"].dump());
        return absl::OkStatus();
      }
      // Its fence is on its way: end as fenced, not with an error of the
      // job's.
      gens_->AwaitStopped(absl::Now() + kMismatchVerdictWait);
      HOLDFAST_RETURN_IF_ERROR(gens_->Stopped());
      why = "this slot was named its culprit and is replaced";
    } else if (v.is_object()) {
      why = absl::StrCat("the controller's verdict: ", v.value("kind", "?"),
                         ", action ", v.value("action", "?"), " (",
                         v.value("action_reason", ""), ")");
    }
  }
  HOLDFAST_LOG_ERROR(
      "runtime: slot {} does not recover from generation {}: "
      "{}; {}",
      slot(), gen, what, why);
  return absl::InvalidArgumentError(absl::StrCat(what, "; ", why));
}

int Recovery::AbsentPeer(const absl::Status& s) const {
  if (s.code() != absl::StatusCode::kDeadlineExceeded) return -1;
  const int r = GetAbsent(s).value_or(-1);
  return r == slot() ? -1 : r;
}

std::vector<int> Recovery::UnreachablePeers(const absl::Status& s) const {
  std::vector<int> out;
  for (int r : GetUnreachable(s)) {
    if (r >= 0 && r != slot()) out.push_back(r);
  }
  return out;
}

void Recovery::ReportUnreachable(const std::vector<int>& peers,
                                 const std::string& why, int64_t gen) {
  if (peers.empty()) return;
  absl::StatusOr<bool> r = client_->ReportUnreachable(peers, why, gen);
  if (!r.ok() && r.status().code() != absl::StatusCode::kFailedPrecondition) {
    HOLDFAST_LOG_WARN("runtime: reporting unreachable peers: {}",
                      std::string(r.status().message()));
  }
}

void Recovery::ReportBroken(const std::string& why, int peer, int64_t gen,
                            const std::vector<int>& unreachable) {
  if (gen < 0) gen = gens_->Current().generation;
  absl::StatusOr<bool> r = client_->ReportFailure(peer, why, gen, unreachable);
  if (!r.ok() && r.status().code() != absl::StatusCode::kFailedPrecondition) {
    HOLDFAST_LOG_WARN("runtime: reporting the failure: {}",
                      std::string(r.status().message()));
  }
}

}  // namespace holdfast
