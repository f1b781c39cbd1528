#include "src/runtime/runtime_impl.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "src/runtime/report.h"
#include "src/store/keys.h"

namespace holdfast {

void RuntimeImpl::PublishRecovery(const RecoveryRecord& r) {
  // Every member that recovered offers its record; the first one kept
  // (they differ by a few milliseconds) speaks for the generation.
  nlohmann::json j = ToJson(r);
  (void)store_->CompareAndSet(keys::Recovery(r.generation), "", true, j.dump());
}

void RuntimeImpl::PublishFinalState(int slot) {
  nlohmann::json j = {
      {"replicated", absl::StrFormat("%016x", state_.LiveHash())},
      {"sharded", absl::StrFormat("%016x", state_.ShardedHash())}};
  (void)store_->Set(keys::FinalState(slot), j.dump());
}

void RuntimeImpl::PublishFinal(const RunResult& r) {
  nlohmann::json j;
  j["final_step"] = r.final_step;
  j["world_size"] = r.world_size;
  j["generation"] = r.generation;
  j["productive_ms"] = r.productive_ms;
  j["wall_ms"] = r.wall_ms;
  j["snapshots"] = r.snapshots;
  j["snapshots_skipped"] = r.snapshots_skipped;
  j["backups"] = r.backups;
  j["backup_bytes"] = r.backup_bytes;
  j["backup_ms"] = r.backup_ms;
  j["disk_writes"] = r.disk_writes;
  if (progress_.ledger[0] > 0) {
    j["first_step_done_unix_ms"] =
        progress_.ledger[0] + progress_.ledger[2] / 1000;
  }
  (void)store_->Set(keys::kFinal, j.dump());
}

}  // namespace holdfast
