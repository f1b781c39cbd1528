// A member's backup pipeline: the backup thread, which runs one backup
// round (src/checkpoint/backup.h) per snapshot the training thread queues,
// over the side communicator and backup links of the snapshot's
// generation; and what follows a commit: the test faults' damage to the
// member's own piece, and the disk tier, which takes the first committed
// step of every window of `checkpoint_every` steps.
//
// Threading: Start and Join belong to the thread that owns the pipeline;
// the rest runs on the backup thread, except last_disk_step and
// CapDiskStep, which any thread may call.
#ifndef HOLDFAST_SRC_RUNTIME_BACKUP_PIPELINE_H_
#define HOLDFAST_SRC_RUNTIME_BACKUP_PIPELINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "src/checkpoint/backup.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/piece_io.h"
#include "src/checkpoint/snapshots.h"
#include "src/checkpoint/state.h"
#include "src/fault/hooks.h"
#include "src/runtime/generation_view.h"

namespace holdfast {

class BackupPipeline {
 public:
  // A round holds its side channel, so a rebuild never destroys it under
  // a transfer.
  using SideChannel = GenerationView::SideChannel;

  // What the pipeline needs of its member. Called on the backup thread.
  class Member {
   public:
    virtual ~Member() = default;
    // The side channel of generation `gen`; an error when there is none.
    virtual absl::StatusOr<SideChannel> Side(int64_t gen) = 0;
    // The side channel of `gen` failed (`why`): the group is broken.
    virtual void SideFailed(const absl::Status& why, int64_t gen) = 0;
    // Acks `step` of `gen` to the controller.
    virtual void AckStep(int64_t step, int64_t gen) = 0;
    // Waits until `step` of `gen` is committed or cannot be, or until
    // `deadline`; whether one of those came first.
    virtual bool AwaitRoundEnd(int64_t step, int64_t gen,
                               absl::Time deadline) = 0;
    // The newest committed step the member knows of.
    virtual int64_t committed_step() const = 0;
  };

  struct Options {
    std::string checkpoint_dir;  // empty: no disk tier
    int64_t checkpoint_every = 1;
  };

  // Every pointer outlives the pipeline.
  BackupPipeline(Member* member, checkpoint::Snapshots* snapshots,
                 const checkpoint::StateRegistry* state,
                 checkpoint::PieceIo* io, std::shared_ptr<fault::Hooks> faults,
                 Options options)
      : member_(member),
        snapshots_(snapshots),
        state_(state),
        io_(io),
        faults_(std::move(faults)),
        options_(std::move(options)) {}
  ~BackupPipeline() { Join(); }

  // Starts the backup thread.
  void Start();
  // Waits for the backup thread, which returns once the snapshots stop
  // (Snapshots::Stop).
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  // The newest step on the disk tier this member wrote or restored.
  int64_t last_disk_step() const { return last_disk_step_; }
  // A restore from the disk tier: its step is the newest there.
  void NoteDiskStep(int64_t step) { last_disk_step_ = step; }
  // A rollback to `step`: the disk tier's steps after it belong to an
  // abandoned timeline, and the steps redone are written anew.
  void CapDiskStep(int64_t step) {
    if (last_disk_step_ > step) last_disk_step_ = step;
  }

 private:
  void Loop();
  checkpoint::BackupHooks Hooks();
  void AfterCommit(checkpoint::Piece* own);
  void WriteToDisk(const checkpoint::Piece& own);

  Member* const member_;
  checkpoint::Snapshots* const snapshots_;
  const checkpoint::StateRegistry* const state_;
  checkpoint::PieceIo* const io_;
  const std::shared_ptr<fault::Hooks> faults_;
  const Options options_;
  std::atomic<int64_t> last_disk_step_{0};
  std::thread thread_;
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_BACKUP_PIPELINE_H_
