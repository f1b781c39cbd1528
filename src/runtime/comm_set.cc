#include "src/runtime/comm_set.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/backend/backend.h"
#include "src/checkpoint/pieces.h"
#include "src/comm/create.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"
#include "src/store/keys.h"
#include "src/store/store_util.h"

namespace holdfast {

namespace {
constexpr absl::Duration kSideConnectTimeout = absl::Seconds(15);
}  // namespace

absl::StatusOr<std::shared_ptr<Communicator>> CommSet::CreateComm(
    std::shared_ptr<Store> store, int64_t gen, int world, int slot,
    absl::Duration connect_timeout, bool side, bulk::Cancelled cancelled) {
  if (cancelled == nullptr) {
    cancelled = [this, gen] { return gens_->RendezvousAbandoned(gen); };
  }
  CommunicatorOptions o = options_.comm;
  // The side communicator moves host snapshots: always Gloo. A fault spec
  // names an op of the training communicator, and the trace dumps on
  // abort are the training communicator's (the two would share a file
  // name).
  if (side) {
    o.backend = "gloo";
    o.trace_dir.clear();
  }
  o.rank = slot;
  o.size = world;
  o.generation = gen;
  o.connect_timeout = std::min(o.connect_timeout, connect_timeout);
  o.rendezvous_cancelled = cancelled;
  o.link_secret = options_.token;
  absl::StatusOr<std::unique_ptr<Communicator>> c =
      comm::Create(std::move(store), o, side ? nullptr : faults_);
  if (!c.ok()) {
    if (auto why = cancelled()) {
      // The peers it could not reach stay attached: evidence for the
      // controller even when a newer generation cancelled this one.
      absl::Status aborted = absl::AbortedError(*why);
      if (std::vector<int> u = GetUnreachable(c.status()); !u.empty()) {
        SetUnreachable(&aborted, u);
      }
      return aborted;
    }
    return c.status();
  }
  return std::shared_ptr<Communicator>(std::move(*c));
}

CommSet::~CommSet() {
  if (pending_.joinable()) pending_.join();
}

bool CommSet::ExchangesOnSide() const {
  return options_.side_exchanges ||
         !backend::TakesHostMemory(options_.comm.backend);
}

absl::Status CommSet::Build(bool defer) {
  // A deferred build of an earlier generation whose restore failed: it
  // ends once it sees that generation abandoned.
  (void)AwaitComm();
  const GenerationView::View v = gens_->Current();
  if (v.standby || v.slot < 0) {
    return absl::FailedPreconditionError("runtime: this member has no slot");
  }
  const bool on_side = ExchangesOnSide();
  gens_->BeginComm(v.generation, on_side)
      .reset();  // joins its threads; never blocks on a peer
  const int64_t gen = v.generation;
  at_rendezvous_(gen);
  // Both communicators are built at the same time, each on a thread,
  // while every member is in the same protocol step: Gloo's connect
  // phase cannot be cancelled, so building the side one later, while
  // peers train (and may die), could hold a member for Gloo's own
  // timeout. The side one gives up if the training one fails.
  comm_failed_ = false;
  bulk::Cancelled side_cancelled = [this, gen]() -> std::optional<std::string> {
    if (comm_failed_.load()) {
      return std::string("the training communicator failed");
    }
    return gens_->RendezvousAbandoned(gen);
  };
  pending_gen_ = gen;
  pending_ = std::thread([this, gen, world = v.world, slot = v.slot] {
    // A slow NCCL init (slow-init), which an abandoned rendezvous ends.
    const absl::Time slow_until =
        absl::Now() + absl::Milliseconds(faults_->InitDelayMs(slot));
    while (absl::Now() < slow_until && !gens_->RendezvousAbandoned(gen)) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    pending_comm_ =
        CreateComm(store_, gen, world, slot, options_.comm.connect_timeout);
    pending_up_ = absl::Now();
    if (!pending_comm_.ok()) comm_failed_ = true;
  });
  absl::Status side_status = BuildSide(gen, v.world, v.slot, side_cancelled);
  // The runtime's exchanges need the side communicator only: the
  // training one may come up while they run.
  if (defer && on_side && options_.overlap_init && side_status.ok()) {
    deferred_since_ = absl::Now();
    return absl::OkStatus();
  }
  HOLDFAST_RETURN_IF_ERROR(AwaitComm());
  return side_status;
}

absl::Status CommSet::AwaitComm() {
  if (!pending_.joinable()) return absl::OkStatus();
  const absl::Time t0 = absl::Now();
  pending_.join();
  const absl::Duration waited = absl::Now() - t0;
  absl::StatusOr<std::shared_ptr<Communicator>> built =
      std::move(pending_comm_);
  pending_comm_ = absl::AbortedError("no communicator is being built");
  const absl::Time deferred_since =
      std::exchange(deferred_since_, absl::InfinitePast());
  if (!built.ok()) return built.status();
  comm_up_ = pending_up_;
  if (deferred_since != absl::InfinitePast()) {
    const int64_t after = absl::ToInt64Milliseconds(comm_up_ - deferred_since);
    HOLDFAST_LOG_INFO(
        "runtime: slot {}: the training communicator of generation {} was up "
        "{} ms {} the side one; the runtime's exchanges ran meanwhile, then "
        "waited {} ms for it",
        gens_->Current().slot, pending_gen_, std::abs(after),
        after >= 0 ? "after" : "before", absl::ToInt64Milliseconds(waited));
  }
  gens_->SetComm(pending_gen_, *std::move(built));
  // Building it set the device on the thread that built it.
  return backend::BindDevice(options_.comm.backend, options_.comm.device);
}

absl::Status CommSet::AwaitArrivals(Store& store, int64_t gen, int world,
                                    int slot,
                                    const bulk::Cancelled& cancelled) {
  // Everyone arrives first. The training communicator of this
  // generation is being built at the same time, so every member is in
  // the same protocol step: one that does not come within the connect
  // timeout is stuck, and is named as absent (reported like a rendezvous
  // no-show). A new generation, leaving, or the failure of the training
  // communicator cancels the wait.
  const std::string arrived = absl::StrCat("g", gen, "/arrived/");
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(absl::StrCat(arrived, r));
  absl::Status here = store.Set(absl::StrCat(arrived, slot), "1");
  if (here.ok()) here = store.Wait(keys, options_.comm.connect_timeout);
  if (!here.ok()) {
    if (auto why = cancelled()) return absl::AbortedError(*why);
    std::vector<size_t> missing;
    if (here.code() == absl::StatusCode::kDeadlineExceeded) {
      missing = MissingKeys(store, keys);  // not this slot's: set above
    }
    if (!missing.empty()) {
      const int r = static_cast<int>(missing.front());
      here = absl::DeadlineExceededError(
          absl::StrCat("side communicator of generation ", gen, ": slot ", r,
                       " did not arrive within ",
                       absl::FormatDuration(options_.comm.connect_timeout),
                       " (", here.message(), ")"));
      SetAbsent(&here, r);
    }
    return here;
  }
  return absl::OkStatus();
}

absl::StatusOr<CommSet::PlacementLabels> CommSet::ExchangeLabels(
    Communicator& side, int world, int slot) {
  // Failure domains: each member's own labels, exchanged here, and
  // whether it checks backups on arrival (every member must run the same
  // round: if their settings differ, the stricter one is used).
  const int64_t labels[3] = {
      static_cast<int64_t>(
          XXH3_64bits(options_.host.data(), options_.host.size())),
      options_.topology_block.empty()
          ? 0
          : static_cast<int64_t>(XXH3_64bits(options_.topology_block.data(),
                                             options_.topology_block.size())),
      options_.verify_backups == VerifyBackups::kArrival ? 1 : 0};
  std::vector<int64_t> all(static_cast<size_t>(world) * 3);
  HOLDFAST_RETURN_IF_ERROR(
      side.AllGather(labels, all.data(), 3, DataType::kInt64)->Wait());
  PlacementLabels out;
  for (int r = 0; r < world; ++r) {
    const size_t at = static_cast<size_t>(r) * 3;
    out.input.domain.push_back(static_cast<uint64_t>(all[at]));
    out.input.block.push_back(static_cast<uint64_t>(all[at + 1]));
    out.arrival += all[at + 2] != 0 ? 1 : 0;
  }
  if (out.arrival > 0 && out.arrival < world && slot == 0) {
    HOLDFAST_LOG_WARN(
        "runtime: verify_backups differs between members ({} of {} check "
        "on arrival); all of them check on arrival",
        out.arrival, world);
  }
  return out;
}

absl::Status CommSet::BuildSide(int64_t gen, int world, int slot,
                                const bulk::Cancelled& cancelled) {
  gens_->BeginSide(gen);  // the old side communicator and links go
  std::shared_ptr<Store> store =
      NewPrefixStore(keys::kSidePrefix, NewCancellableStore(store_, cancelled));
  // The backup links' listener; its address is published before this
  // member arrives, so every member that saw it arrive can connect.
  HOLDFAST_ASSIGN_OR_RETURN(std::unique_ptr<bulk::Listener> listener,
                            bulk::Listener::Open(options_.comm.bind_address,
                                                 options_.comm.interface));
  const std::string bulk_key = absl::StrCat("g", gen, "/bulk/");
  HOLDFAST_RETURN_IF_ERROR(
      store->Set(absl::StrCat(bulk_key, slot), listener->address()));
  HOLDFAST_RETURN_IF_ERROR(AwaitArrivals(*store, gen, world, slot, cancelled));
  HOLDFAST_ASSIGN_OR_RETURN(
      std::shared_ptr<Communicator> side,
      CreateComm(store, gen, world, slot, kSideConnectTimeout,
                 /*side=*/true, cancelled));
  gens_->SetSide(gen, side);
  HOLDFAST_ASSIGN_OR_RETURN(PlacementLabels labels,
                            ExchangeLabels(*side, world, slot));
  pieces::PlacementInput& in = labels.input;
  in.replicas = options_.replicas;
  in.tp = options_.tp_size;
  in.pp = options_.pp_size;
  pieces::Placement pl = pieces::Place(in);
  HOLDFAST_RETURN_IF_ERROR(ConnectLinks(*store, *listener, bulk_key, gen, slot,
                                        pl.buddies, cancelled));
  // The backup thread reads it between rounds.
  snapshots_->SetPlacement({gen, std::move(pl.buddies), labels.arrival > 0});
  if (slot == 0 && !pl.warnings.empty()) {
    HOLDFAST_LOG_WARN(
        "runtime: placement of generation {}: {} of {} piece copies could "
        "not be placed as wanted, e.g. {} (label each machine with "
        "HOLDFAST_HOST, and racks with HOLDFAST_TOPOLOGY_BLOCK)",
        gen, pl.warnings.size(), world * std::min(options_.replicas, world - 1),
        pl.warnings[0]);
  }
  return absl::OkStatus();
}

absl::Status CommSet::ConnectLinks(Store& store, const bulk::Listener& listener,
                                   const std::string& key, int64_t gen,
                                   int slot,
                                   const std::vector<std::vector<int>>& buddies,
                                   const bulk::Cancelled& cancelled) {
  auto links = std::make_shared<bulk::Links>(gen, slot, options_.token,
                                             options_.comm.timeout);
  HOLDFAST_RETURN_IF_ERROR(gens_->SetLinks(gen, links));
  const absl::Time deadline = absl::Now() + kSideConnectTimeout;
  std::vector<int> owners;
  for (size_t o = 0; o < buddies.size(); ++o) {
    const std::vector<int>& bs = buddies[o];
    if (std::find(bs.begin(), bs.end(), slot) != bs.end()) {
      owners.push_back(static_cast<int>(o));
    }
  }
  // A link's owner waits for its buddy's challenge: the connects run on a
  // thread of their own while this one accepts (in any order of slots).
  std::atomic<bool> connects_failed{false};
  const bulk::Cancelled accept_cancelled = [&]() -> std::optional<std::string> {
    if (connects_failed) return "this member's backup links failed to connect";
    return cancelled ? cancelled() : std::nullopt;
  };
  auto connect = [&]() -> absl::Status {
    absl::Status connected;
    for (int b : buddies[static_cast<size_t>(slot)]) {
      absl::StatusOr<std::string> address =
          store.Get(absl::StrCat(key, b), deadline - absl::Now());
      connected = address.ok() ? links->ConnectTo(b, *address, deadline)
                               : address.status();
      if (!connected.ok()) break;
    }
    connects_failed = !connected.ok();
    return connected;
  };
  auto accept = [&] {
    return links->AcceptFrom(listener, owners, deadline, accept_cancelled);
  };
  // The connects' error first: a failed accept may only follow from it.
  // (With two jobs, none has started when a thread cannot.)
  return RunJobs("the backup links' connects", {connect, accept},
                 [](absl::string_view) {});
}

}  // namespace holdfast
