// Recovery: how a member recovers after its generation failed, in one
// object.
//
// The rules:
//   1. Every communicator of the failed generation is aborted: its work
//      in flight ends.
//   2. A collective mismatch found by any member is a program error that
//      every recovery would run into again: the controller names its
//      culprits from the members' traces, and a member it does not name
//      goes on; otherwise Run ends with it (InvalidArgument).
//   3. The controller opens the next generation by itself when it knows
//      who failed (a crash is seen at once). When it does not within
//      RuntimeOptions::report_grace, the member reports the broken
//      communicator, naming the peer that never came to the rendezvous
//      when there is one, which opens it. Who this member could not reach
//      on the data network goes to the controller at once, as evidence.
//   4. In the new generation the member builds its communicators and
//      restores the newest committed step, as every member does
//      (RuntimeImpl::Restore).
//   5. A failure during that is the next generation's: abort it and go
//      on, until RuntimeOptions::recovery_timeout. A communicator this
//      program cannot build at all, and a restore that cannot succeed,
//      end the recovery at once.
//   6. A member made a standby, fenced, or in a stopped job does not
//      recover (GenerationView::Stopped).
//
// Training thread only.
#ifndef HOLDFAST_SRC_RUNTIME_RECOVERY_H_
#define HOLDFAST_SRC_RUNTIME_RECOVERY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "holdfast/runtime.h"
#include "holdfast/store.h"
#include "src/control/member/member.h"
#include "src/fault/hooks.h"
#include "src/runtime/generation_view.h"

namespace holdfast {

// Now in Unix milliseconds, the unit of RecoveryRecord's times.
inline int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// What a restore received, for its log line.
std::string Received(const RecoveryRecord& rec);

class Recovery {
 public:
  // What recovery needs of the member it runs in.
  class Member {
   public:
    virtual ~Member() = default;
    // Builds the current generation's communicators (CommSet::Build),
    // leaving the training one building where the runtime's exchanges do
    // not need it.
    virtual absl::Status BuildComms() = 0;
    // Waits for the training communicator BuildComms left building and
    // installs it (CommSet::AwaitComm): the Unix ms it was up.
    virtual absl::StatusOr<int64_t> AwaitComms() = 0;
    // Restores the newest committed step (rule 4); fills what it received
    // into `rec`. The step restored.
    virtual absl::StatusOr<int64_t> Restore(RecoveryRecord* rec) = 0;
    // The steps done since the restored one (checkpoint::Progress).
    virtual int64_t lost_steps() const = 0;
  };

  // Every pointer must outlive this object.
  Recovery(const RuntimeOptions* options, GenerationView* gens,
           control::MemberClient* client,
           std::shared_ptr<control::ControllerStore> store,
           std::shared_ptr<fault::Hooks> faults, Member* member);

  // Recovers after `cause`: the record of it, with the step restored (the
  // loop goes on at restored_step + 1).
  absl::StatusOr<RecoveryRecord> Run(const absl::Status& cause);
  // Counts a recovery that is not Run's (a member joining a running job);
  // returns the count, for the fault points (fault::Hooks::AtRecovery).
  int Count() { return ++recoveries_; }

  // Reports the failure of generation `gen`'s communicator, which nobody
  // explained; the controller opens a generation with the same members
  // (gen < 0, no communicator built yet: the current generation). With a
  // `peer` (>= 0), the slot that never came to the rendezvous is reported
  // instead: the controller declares it failed, and its slot goes to a
  // standby or the world shrinks.
  void ReportBroken(const std::string& why, int peer, int64_t gen,
                    const std::vector<int>& unreachable = {});

 private:
  // Rule 2 for generation `gen`: OK when no member found a mismatch in
  // it, or the controller replaces others and this member goes on.
  absl::Status FoundMismatch(int64_t gen);
  // Rules 4 and 5 in generation `v`: the step restored; else the error,
  // with `fatal` set when retrying in the next generation cannot help.
  absl::StatusOr<int64_t> RecoverIn(const GenerationView::View& v,
                                    RecoveryRecord* rec, bool* fatal);
  // The slot to blame for a rendezvous that timed out, or -1.
  int AbsentPeer(const absl::Status& s) const;
  // The peers `s` says this member could not reach on the data network
  // (no route, or its data went unacknowledged; the backend attaches
  // them, SetUnreachable); empty otherwise.
  std::vector<int> UnreachablePeers(const absl::Status& s) const;
  // Sends the controller `peers`, as evidence only, at once; nothing if
  // none.
  void ReportUnreachable(const std::vector<int>& peers, const std::string& why,
                         int64_t gen);
  int slot() const { return gens_->Current().slot; }

  const RuntimeOptions* const options_;
  GenerationView* const gens_;
  control::MemberClient* const client_;
  const std::shared_ptr<control::ControllerStore> store_;
  const std::shared_ptr<fault::Hooks> faults_;
  Member* const member_;
  int recoveries_ = 0;
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_RECOVERY_H_
