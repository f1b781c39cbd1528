// The backup thread's counters and timings, for tests and benchmarks
// (docs/benchmarks.md). Not part of the API a trainer uses: RunResult
// carries what a job needs to know.
#ifndef HOLDFAST_TESTING_BACKUP_STATS_H_
#define HOLDFAST_TESTING_BACKUP_STATS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace holdfast {
class Runtime;
}  // namespace holdfast

namespace holdfast::testing {

// What the backup thread did so far (this member).
struct BackupStats {
  int64_t rounds = 0;       // rounds that committed
  int64_t bytes = 0;        // sent to buddies plus received from owners
  int64_t transfer_us = 0;  // inside the sends and receives
  int64_t round_us = 0;     // from a round's start until this member saw
                            // its commit (after a deferred copy: not the
                            // copy; nor the verdict, eviction or disk
                            // write after the commit)
  // Of round_us, the time rounds of snapshots copied during a step spent
  // waiting, with their bytes moved, for that step's BeginStateUpdate()
  // (such a step commits only once fenced).
  int64_t gate_us = 0;
  // Of round_us, the time from this member's ack (its own piece sent, the
  // copies it keeps for others received, and checked with verify_backups
  // "arrival") until it saw the commit: the controller's part.
  int64_t commit_wait_us = 0;
  // When this member acked the newest round that committed (InfinitePast
  // before the first).
  absl::Time last_acked = absl::InfinitePast();
  int64_t disk_writes = 0;
};

// The stats of `runtime` (one made by Runtime::Create). Thread-safe.
BackupStats BackupStatsOf(const Runtime& runtime);

}  // namespace holdfast::testing

#endif  // HOLDFAST_TESTING_BACKUP_STATS_H_
