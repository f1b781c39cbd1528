// The communicators of a member's generation, and how they are built: the
// training communicator, and at the same time, on a thread of its own, the
// side communicator (always Gloo, host memory) with the backup links and
// the placement of every slot's buddies. Both meet in the rendezvous of
// their generation in the controller's store; a newer generation, fencing
// or the job's end cancels it. They are installed in the GenerationView,
// which holds them.
//
// When the runtime's own exchanges go over the side communicator (the
// training one takes device memory, or RuntimeOptions::side_exchanges),
// Build may return once the side communicator is up (unless
// RuntimeOptions::overlap_init is off) and leave the training one building
// on its thread (an NCCL init: tens of ms), so that a restore
// overlaps it; AwaitComm joins it and installs it.
//
// Threading: Build and AwaitComm belong to the training thread.
#ifndef HOLDFAST_SRC_RUNTIME_COMM_SET_H_
#define HOLDFAST_SRC_RUNTIME_COMM_SET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#include "holdfast/runtime.h"
#include "holdfast/store.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/pieces.h"
#include "src/checkpoint/snapshots.h"
#include "src/fault/hooks.h"
#include "src/runtime/generation_view.h"

namespace holdfast {

class CommSet {
 public:
  // `at_rendezvous(gen)`: tells the controller this member arrives at
  // generation gen's rendezvous. Every pointer outlives the set.
  CommSet(const RuntimeOptions& options, std::shared_ptr<Store> store,
          GenerationView* gens, checkpoint::Snapshots* snapshots,
          std::shared_ptr<fault::Hooks> faults,
          std::function<void(int64_t gen)> at_rendezvous)
      : options_(options),
        store_(std::move(store)),
        gens_(gens),
        snapshots_(snapshots),
        faults_(std::move(faults)),
        at_rendezvous_(std::move(at_rendezvous)) {}
  // Joins a training communicator still being built (its rendezvous gives
  // up once the member stops).
  ~CommSet();

  // Builds the communicators of the current generation (the training one,
  // and the side one with its backup links) and installs them.
  // FailedPrecondition for a member with no slot. With `defer`, when the
  // runtime's exchanges go over the side communicator, returns once the
  // side one is up, with the training one still building: the caller
  // must call AwaitComm before it uses the training communicator.
  absl::Status Build(bool defer = false);
  // Joins the training communicator a deferred Build left building and
  // installs it: its error, or OK (at once when there is none). Logs
  // (info) when it came up after the side one and how long it waited.
  absl::Status AwaitComm();
  // Whether the runtime's own exchanges go over the side communicator.
  bool ExchangesOnSide() const;
  // When the training communicator AwaitComm installed last was built.
  absl::Time comm_up() const { return comm_up_; }

 private:
  // A communicator of generation `gen` on `store` (rendezvous keys are
  // namespaced by generation); Aborted naming why when the rendezvous was
  // abandoned (a newer generation, fencing, the job's end). `cancelled`,
  // if given, replaces GenerationView::RendezvousAbandoned(gen).
  absl::StatusOr<std::shared_ptr<Communicator>> CreateComm(
      std::shared_ptr<Store> store, int64_t gen, int world, int slot,
      absl::Duration connect_timeout, bool side = false,
      bulk::Cancelled cancelled = nullptr);
  // Builds the side communicator of generation `gen` and places the
  // buddies of every slot in it.
  absl::Status BuildSide(int64_t gen, int world, int slot,
                         const bulk::Cancelled& cancelled);
  // Every member of generation `gen` arrives at the side rendezvous;
  // one that does not within the connect timeout is named as absent.
  absl::Status AwaitArrivals(Store& store, int64_t gen, int world, int slot,
                             const bulk::Cancelled& cancelled);
  // The failure domains of every member (its host label and topology
  // block), exchanged on the side communicator, and how many check backups
  // on arrival.
  struct PlacementLabels {
    pieces::PlacementInput input;
    int arrival = 0;
  };
  absl::StatusOr<PlacementLabels> ExchangeLabels(Communicator& side, int world,
                                                 int slot);
  // Opens this member's backup links of generation `gen`: to each of its
  // buddies (at the address each published under `key`) and from each
  // owner it is a buddy of.
  absl::Status ConnectLinks(Store& store, const bulk::Listener& listener,
                            const std::string& key, int64_t gen, int slot,
                            const std::vector<std::vector<int>>& buddies,
                            const bulk::Cancelled& cancelled);

  const RuntimeOptions& options_;
  const std::shared_ptr<Store> store_;
  GenerationView* const gens_;
  checkpoint::Snapshots* const snapshots_;
  const std::shared_ptr<fault::Hooks> faults_;
  const std::function<void(int64_t gen)> at_rendezvous_;
  // A deferred Build's training communicator: the thread building it for
  // generation pending_gen_, and what it built. Written by that thread
  // before it ends; read after the join.
  std::thread pending_;
  int64_t pending_gen_ = -1;
  absl::StatusOr<std::shared_ptr<Communicator>> pending_comm_;
  absl::Time pending_up_;
  // When a deferred Build returned (the side communicator up); else
  // InfinitePast.
  absl::Time deferred_since_ = absl::InfinitePast();
  absl::Time comm_up_;
  // Set when the training communicator failed: the side one gives up.
  std::atomic<bool> comm_failed_{false};
};

}  // namespace holdfast

#endif  // HOLDFAST_SRC_RUNTIME_COMM_SET_H_
