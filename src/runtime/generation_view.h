// What a member knows of the job's generations, and the communicators it
// built for them:
//   - the view: the newest generation the controller announced, this
//     member's slot in it (or the standby role), its world size, and the
//     committed step a rollback returns to;
//   - the newest committed step, whether this member is fenced, whether
//     the job is over, and the data the job skips;
//   - the training communicator and the side communicator (with its
//     backup links), each with the generation it was built for.
// One mutex guards all of it, because every wait on it asks about both
// sides at once: a commit, a newer generation, a communicator that failed.
// The rules: a generation only moves forward; a communicator built for a
// generation older than the view is aborted as it is installed; an abort
// reaches every communicator of the generations it names, outside the
// lock (an abort writes a notice to the store).
//
// Thread-safe.
#ifndef HOLDFAST_SRC_RUNTIME_GENERATION_VIEW_H_
#define HOLDFAST_SRC_RUNTIME_GENERATION_VIEW_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "holdfast/runtime.h"
#include "src/checkpoint/bulk.h"
#include "src/control/member/member.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast {

class GenerationView {
 public:
  struct View {
    int64_t generation = 0;
    int slot = -1;
    int world = 0;
    bool standby = true;
    // This generation rolls back to this committed step (a numeric
    // anomaly), whatever newer commit a member heard of; -1: none.
    int64_t rollback_to = -1;
  };
  // The side communicator of a generation and its backup links; a holder
  // keeps them alive, so a rebuild never destroys them under a transfer.
  struct SideChannel {
    std::shared_ptr<Communicator> comm;
    std::shared_ptr<bulk::Links> links;
  };
  // The training or side communicator, and the backup links, of the side
  // communicator's generation.
  struct Comms {
    std::shared_ptr<Communicator> comm;
    std::shared_ptr<Communicator> side;
    std::shared_ptr<bulk::Links> links;
  };

  // `stopping`: whether the member's backup pipeline is stopping (its
  // waits end then too).
  explicit GenerationView(std::function<bool()> stopping)
      : stopping_(std::move(stopping)) {}

  // ---- what the controller says ----------------------------------------
  // The assignment of a member that just joined.
  void Join(const control::Assignment& a);
  // A membership update; false (and nothing changes) when it is older
  // than the view.
  bool Update(const control::MembershipUpdate& u);
  void NoteCommitted(int64_t c);
  // A rollback restored `step`: it is the committed step now.
  void SetCommitted(int64_t step);
  void Fence(const absl::Status& why);
  void EndJob(const control::JobEnd& end);

  // ---- what a member asks ----------------------------------------------
  View Current() const;
  int64_t committed() const;
  // OK, or why the job cannot go on for this member.
  absl::Status Stopped() const;
  // Why a rendezvous of generation `gen` is pointless now, if it is.
  std::optional<std::string> RendezvousAbandoned(int64_t gen) const;
  std::vector<std::pair<int64_t, int64_t>> JobSkip() const;

  // ---- the communicators -------------------------------------------------
  int64_t CommGeneration() const;
  // Whether a generation newer than the training communicator's opened.
  bool Moved() const;
  absl::Status CommHealth() const;
  Communicator* Comm() const;
  // The same, shared: it stays valid while the caller holds it, also
  // across a generation change.
  std::shared_ptr<Communicator> SharedComm() const;
  // The training communicator when it is the current generation's and
  // healthy, else null.
  Communicator* CurrentHealthyComm() const;
  // The communicator for the runtime's own exchanges, whose buffers are in
  // host memory: the training one, unless its backend takes device memory
  // only or BeginComm said they go on the side; then the side one of the
  // same generation (also while the training one is still being built).
  // Aborted when none.
  absl::StatusOr<Communicator*> HostComm() const;
  // Generation `gen`'s training communicator is about to be built: the
  // old one is handed back (to be destroyed outside the lock).
  // `exchanges_on_side`: the runtime's exchanges go over the side
  // communicator in this generation (HostComm).
  std::shared_ptr<Communicator> BeginComm(int64_t gen,
                                          bool exchanges_on_side = false);
  // Installs it; aborted at once when a newer generation opened meanwhile.
  void SetComm(int64_t gen, std::shared_ptr<Communicator> comm);
  // Generation `gen`'s side communicator is about to be built: the old
  // one and its links are handed back.
  Comms BeginSide(int64_t gen);
  // Installs its backup links (Aborted when a newer generation opened)
  // and the side communicator (aborted at once in that case).
  absl::Status SetLinks(int64_t gen, std::shared_ptr<bulk::Links> links);
  void SetSide(int64_t gen, std::shared_ptr<Communicator> side);
  // The side communicator of generation `gen` and its links; Aborted when
  // there is none, or its error when it failed.
  absl::StatusOr<SideChannel> Side(int64_t gen) const;
  // Aborts the communicators (and links) of generations <= `upto`.
  void Abort(int64_t upto, absl::string_view reason);
  // Takes every communicator out (the member leaves).
  Comms TakeAll();

  // ---- waits ---------------------------------------------------------------
  // Until `step` is committed; false on timeout, or when the training
  // communicator fails or the generation moves meanwhile.
  bool AwaitCommitted(int64_t step, absl::Time deadline);
  // Until a generation newer than `failed` is known, or a terminal event;
  // false on timeout.
  bool AwaitGeneration(int64_t failed, absl::Time deadline);
  // A standby waits here until it is given a slot.
  absl::Status AwaitSlot();
  // Until step `s` of generation `gen` is committed or cannot be (a newer
  // generation, fenced, the job over, the pipeline stopping), or until
  // `deadline`; whether one of those came first.
  bool AwaitRoundEnd(int64_t s, int64_t gen, absl::Time deadline);
  // Until this member may not go on (fenced, the job over), or `deadline`.
  void AwaitStopped(absl::Time deadline);
  // Makes every wait look again (the backup pipeline stopped).
  void Wake();

 private:
  // May this member still take part in the job (not fenced, not over)?
  bool MayGoOnLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ... and in generation `gen` (no newer one opened)?
  bool GoesOnLocked(int64_t gen) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<bool()> stopping_;
  mutable absl::Mutex mu_;
  View view_ ABSL_GUARDED_BY(mu_);
  int64_t committed_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status fenced_ ABSL_GUARDED_BY(mu_);
  std::optional<control::JobEnd> job_end_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> job_skip_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Communicator> comm_ ABSL_GUARDED_BY(mu_);
  int64_t comm_generation_ ABSL_GUARDED_BY(mu_) = -1;
  bool exchanges_on_side_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Communicator> side_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<bulk::Links> links_ ABSL_GUARDED_BY(mu_);
  int64_t side_generation_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_GENERATION_VIEW_H_
