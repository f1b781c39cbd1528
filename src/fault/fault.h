// Fault injection inside the library, so every trainer can be chaos-tested.
// Faults come from HOLDFAST_FAULTS (or the launcher's --inject), a list
// separated by ',' or ';' of specs such as
//
//   kill:slot=2:step=30      SIGKILL itself at the start of step 30
//   kill:slot=2:step=30:ms=500
//                            ... 500 ms into step 30 (the step's own work
//                            waits: to its peers the rank dies inside the
//                            step; also hang, stall and exit)
//   kill:slot=2:step=30:committed=1
//                            ... at step 30 once step 1 or a later one is
//                            committed (the wait is on the step, like ms;
//                            with both, the ms count from the commit)
//   hang:slot=1:step=50      SIGSTOP itself (a frozen process)
//   stall:slot=1:step=50     the calling thread blocks; the process stays
//                            alive and keeps heartbeating (a rank hung
//                            inside its step or, with recovery=N, inside a
//                            recovery) until the member is released
//   exit:slot=0:step=10      exit(code), code=1 unless given
//   slow:slot=3:ms=300       sleep ms at the start of every step (a
//                            straggler), from step=S if given
//   slow-init:slot=2:ms=800  sleep ms before every build of the training
//                            communicator (an NCCL init that takes long;
//                            the peers' builds wait for it)
//   fail-op:slot=2:seq=120   collective number 120 of the communicator fails
//   mismatch:slot=2:seq=120  slot 2 issues a Barrier in place of its
//                            collective number 120 (a collective mismatch:
//                            its peers time out, and the mismatch is named)
//   kill:slot=1:recovery=1   SIGKILL itself inside its first recovery,
//                            before rendezvous (also hang, stall and exit)
//   kill:slot=2:restore=1    SIGKILL itself inside its first restore, as
//                            the pieces begin to move: the others know
//                            where its copies lie and may be reading them
//                            (also hang, stall and exit)
//   corrupt-piece:slot=1:step=20
//                            once step 20 is committed, flip a byte of
//                            slot 1's own copy of its checkpoint piece (a
//                            restore must notice and use a buddy's copy)
//   corrupt-backup:slot=1:step=10
//                            flip a byte of a backup copy slot 1 receives
//                            for step 10, as it lands (damage in transit:
//                            the round must refuse it, and step 10 is not
//                            committed)
//   corrupt-restore:slot=1[:step=9]
//                            flip a byte of a piece slot 1 receives in a
//                            restore (of step 9 if given, else its first
//                            restore that receives one): damage in transit;
//                            the restore must refuse it and receive it
//                            again from its next holder, or with none stop
//                            with DataLoss
//   refuse-read:slot=1[:step=12]
//                            in a live restore (of step 12 if given),
//                            slot 1's first read in place of a holder's
//                            live state is refused, as the CUDA driver's
//                            pinned memory may refuse process_vm_readv: that
//                            holder's share must come over the communicator
//   nan:slot=1:step=20       the values slot 1 hands to Runtime::CheckFinite
//                            at step 20 (its local gradients) become NaN
//   spike:slot=1:step=20     the loss slot 1 reports at step 20 is 1000
//                            times what it was (a loss spike)
//   bitflip:slot=1:step=20   after step 20 (a snapshot step), before its
//                            snapshot, one bit of slot 1's replicated
//                            registered state flips (the lowest bit of the
//                            middle byte of its first replicated buffer):
//                            silent corruption at rest
//   gradflip:slot=1:step=20[:bit=30]
//                            the values slot 1 hands to Runtime::CheckFinite
//                            at step 20 (its local gradients, before the
//                            all-reduce): bit 30 (an exponent bit; 0-31 of
//                            a float32) of the largest value whose bit is
//                            clear and stays finite flips
//
// `slot` is the rank at the time the point is reached, so a fault on a slot
// also hits a standby that took it over. Each fault fires once per job: the
// runtime claims it in the controller's store before firing (without a
// claim, once per injector).
//
// Ownership: each Runtime owns one injector (configured from
// RuntimeOptions::faults) and hands it, as fault::Hooks (hooks.h), to its
// step loop, its checkpoints and the training communicators it builds;
// they see the points only. Threading: every method is thread-safe.
#ifndef HOLDFAST_SRC_FAULT_FAULT_H_
#define HOLDFAST_SRC_FAULT_FAULT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "src/fault/hooks.h"

namespace holdfast::fault {

struct FaultSpec {
  int index = 0;  // position in the list: the job-wide identity
  Kind kind = Kind::kKill;
  int slot = -1;           // required
  int64_t step = -1;       // at this step (slow: from this step)
  int64_t seq = -1;        // fail-op, mismatch: the collective number
  int recovery = -1;       // at the start of this recovery (1 = the first)
  int restore = -1;        // as the pieces of this restore move (1 = first)
  int64_t ms = 0;          // slow: delay per step; kill etc.: into the step
  int64_t committed = -1;  // kill etc.: first wait for this step's commit
  int code = 1;            // exit: the exit code
  int bit = 30;            // gradflip: the bit of a float32 to flip
  std::string text;        // the spec as written
};

// Parses a list. InvalidArgument naming the spec and what is wrong: an
// unknown kind or key, a missing slot, a value out of range, or a kind
// without its trigger (kill/hang/stall/exit need step, recovery or restore,
// fail-op seq, slow ms).
absl::StatusOr<std::vector<FaultSpec>> Parse(absl::string_view list);

const char* KindName(Kind kind);

class Injector final : public Hooks {
 public:
  // An injector with no faults.
  Injector() = default;
  Injector(const Injector&) = delete;
  Injector& operator=(const Injector&) = delete;

  // Replaces the fault list; InvalidArgument (as Parse) leaves it as it
  // was.
  absl::Status Configure(absl::string_view list);
  // Decides whether fault `index` may fire (true once per job). Default:
  // once per process.
  void SetClaim(std::function<bool(const FaultSpec&)> claim);
  // Ends a stall: polled by a stalled thread, which returns once it says
  // true (the runtime: once the member is fenced or the job ended). Default:
  // a stall lasts until the process is killed.
  void SetRelease(std::function<bool()> release);
  // The job's committed step, for faults with committed=N (the runtime's).
  // Without it such a fault fires without waiting, with a warning.
  void SetCommitted(std::function<int64_t()> committed);

  bool empty() const;

  // Points. Kill and exit do not return when they fire; hang returns when
  // the process is continued, stall when it is released.
  void AtStep(int slot, int64_t step) override;
  int64_t InitDelayMs(int slot) override;
  void AtRecovery(int slot, int recovery) override;
  void AtRestore(int slot, int restore) override;
  // Non-OK (Internal, "injected fault ...") when fail-op fires.
  absl::Status AtCollective(int slot, int64_t seq) override;
  // Whether `slot` issues a Barrier in place of its collective `seq`
  // (mismatch); claims the fault when so.
  bool MismatchAt(int slot, int64_t seq) override;
  // True once when a fault of `kind` that the caller carries out
  // (corrupt-piece, corrupt-backup, corrupt-restore, refuse-read, nan,
  // spike) fires for
  // this slot at `step`.
  bool FiresAt(Kind kind, int slot, int64_t step) override;
  int FlipBitAt(int slot, int64_t step) override;

 private:
  // Fires kill/exit now (does not return), hang and stall (return when
  // continued or released), or returns at once for the others.
  void Fire(const FaultSpec& f, absl::string_view where);
  // Waits (bounded) until step f.committed is committed.
  void AwaitCommitted(const FaultSpec& f);
  bool ClaimLocked(const FaultSpec& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first fault of `kind` for `slot` at `step` (any step for one
  // without) that may fire, claimed and logged; null when none.
  const FaultSpec* ClaimAtLocked(Kind kind, int slot, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fires the first fault for `slot` whose `count` field (recovery or
  // restore) is `n`.
  void AtCount(int slot, int FaultSpec::*count, int n, absl::string_view what);

  mutable absl::Mutex mu_;
  std::vector<FaultSpec> faults_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> fired_ ABSL_GUARDED_BY(mu_);
  std::function<bool(const FaultSpec&)> claim_ ABSL_GUARDED_BY(mu_);
  std::function<bool()> release_ ABSL_GUARDED_BY(mu_);
  std::function<int64_t()> committed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::fault

#endif  // HOLDFAST_SRC_FAULT_FAULT_H_
