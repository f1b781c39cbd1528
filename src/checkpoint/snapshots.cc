#include "src/checkpoint/snapshots.h"

#include <sys/mman.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "holdfast/status.h"
#include "src/common/logging.h"

namespace holdfast::checkpoint {
namespace {

// Asks for transparent huge pages under the 2 MiB-aligned part of a large
// buffer not touched yet. Its first write (a snapshot, a received or read
// piece) then takes a page fault per 2 MiB instead of per 4 KiB. A no-op
// where the kernel has them off ("never"); with "always" the kernel does
// this by itself.
void AdviseHugePages(void* p, size_t size) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (size < 2 * kHuge) return;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + size) & ~(kHuge - 1);
  if (last > first) {
    (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
}

}  // namespace

std::unique_ptr<uint8_t[]> Snapshots::Acquire(size_t size) {
  {
    absl::MutexLock lock(&mu_);
    auto it = pool_.find(size);
    if (it != pool_.end()) {
      std::unique_ptr<uint8_t[]> b = std::move(it->second);
      pool_.erase(it);
      return b;
    }
  }
  std::unique_ptr<uint8_t[]> b(new uint8_t[std::max<size_t>(1, size)]);
  AdviseHugePages(b.get(), size);
  return b;
}

std::unique_ptr<Piece> Snapshots::NewPiece(int64_t step, int64_t generation,
                                           int world, int slot,
                                           uint64_t checksum) {
  auto p = std::make_unique<Piece>();
  p->step = step;
  p->layout_generation = generation;
  p->world = world;
  p->slot = slot;
  p->checksum = checksum;
  p->size = state_->PieceSize(world, slot);
  p->bytes = Acquire(p->size);
  return p;
}

void Snapshots::Add(std::unique_ptr<Piece> p) {
  absl::MutexLock lock(&mu_);
  pieces_.push_back(std::move(p));
}

void Snapshots::EvictLocked(const std::function<bool(const Piece&)>& drop) {
  for (auto it = pieces_.begin(); it != pieces_.end();) {
    if (drop(**it)) {
      if (pool_.count((*it)->size) < 4) {
        pool_.emplace((*it)->size, std::move((*it)->bytes));
      }
      if (queued_ == it->get()) queued_ = nullptr;
      if (deferred_ == it->get()) deferred_ = nullptr;
      if (gate_ == it->get()) gate_ = nullptr;
      it = pieces_.erase(it);
    } else {
      ++it;
    }
  }
}

void Snapshots::Evict(const std::function<bool(const Piece&)>& drop) {
  absl::MutexLock lock(&mu_);
  EvictLocked(drop);
}

void Snapshots::SetKeep(int keep) {
  absl::MutexLock lock(&mu_);
  keep_ = std::max(1, keep);
}

void Snapshots::Committed(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (commits_.empty() || commits_.front() < step) {
    commits_.insert(commits_.begin(), step);
  }
  if (commits_.size() > static_cast<size_t>(keep_)) {
    commits_.resize(static_cast<size_t>(keep_));
  }
  const std::vector<int64_t> kept = commits_;
  EvictLocked([step, &kept](const Piece& p) {
    return p.step < step &&
           std::find(kept.begin(), kept.end(), p.step) == kept.end();
  });
}

void Snapshots::AbandonAfter(int64_t target) {
  absl::MutexLock lock(&mu_);
  EvictLocked([target](const Piece& p) { return p.step > target; });
  commits_.erase(std::remove_if(commits_.begin(), commits_.end(),
                                [target](int64_t c) { return c > target; }),
                 commits_.end());
  if (commits_.empty() || commits_.front() < target) {
    commits_.insert(commits_.begin(), target);
  }
}

std::vector<int64_t> Snapshots::kept_commits() const {
  absl::MutexLock lock(&mu_);
  return commits_;
}

void Snapshots::DropLocked(const Piece* p) {
  EvictLocked([p](const Piece& q) { return &q == p; });
}

void Snapshots::Drop(const Piece* p) {
  absl::MutexLock lock(&mu_);
  DropLocked(p);
}

std::vector<Piece*> Snapshots::At(int64_t step) const {
  absl::MutexLock lock(&mu_);
  std::vector<Piece*> at;
  for (const auto& p : pieces_) {
    if (p->step == step) at.push_back(p.get());
  }
  return at;
}

size_t Snapshots::count() const {
  absl::MutexLock lock(&mu_);
  return pieces_.size();
}

bool Snapshots::Busy(int64_t committed) const {
  absl::MutexLock lock(&mu_);
  // The next snapshot may wait behind a round that moves no bytes any
  // more: one at the gate of its deferred copy (past its transfer; the
  // fence of this step, or its end without one, decided it), one that
  // acked and waits for the commit or the verdict (idle_round_), one whose
  // step committed (only local work left: evicting older copies, the disk
  // tier), and one still in its agreement (idle_round_: it may wait for a
  // slot that skipped a step). Were the snapshot skipped there, this slot
  // would skip a step the others back up, and the rounds after would pair
  // different steps.
  const bool past_transfer = gate_ != nullptr;
  const bool settled = round_step_ <= committed;
  return queued_ != nullptr || deferred_ != nullptr ||
         (busy_ && !past_transfer && !settled && !idle_round_);
}

absl::Status Snapshots::Queue(std::unique_ptr<Piece> p, bool defer) {
  p->own = true;
  p->deferred = defer;
  if (!defer) {
    HOLDFAST_RETURN_IF_ERROR(
        state_->CopyPiece(p->world, p->slot, p->bytes.get()));
  }
  absl::MutexLock lock(&mu_);
  queued_ = p.get();
  if (defer) deferred_ = p.get();
  pieces_.push_back(std::move(p));
  return absl::OkStatus();
}

void Snapshots::BeginStateUpdate() {
  Piece* p;
  {
    absl::MutexLock lock(&mu_);
    if (early_write_.has_value()) return;  // this step is not fenced
    fence_seen_ = true;
    p = deferred_;
    if (p == nullptr) return;
    if (queued_ != p) {
      // The backup thread took it and copies it; a piece that is dropped
      // meanwhile clears deferred_ (EvictLocked), so p is only read alive.
      auto copied = [this, p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return deferred_ != p || p->copied;
      };
      mu_.Await(absl::Condition(&copied));
      if (deferred_ == p && !p->invalid) {
        p->validated = true;
        ++overlapped_;
      }
      deferred_ = nullptr;
      return;
    }
    // Not started: taken back while this thread copies it. Only this
    // thread drops a queued piece, and a round evicts other steps than
    // this newest one, so it stays listed.
    queued_ = nullptr;
    deferred_ = nullptr;
  }
  p->deferred = false;
  const absl::Status copied =
      state_->CopyPiece(p->world, p->slot, p->bytes.get());
  absl::MutexLock lock(&mu_);
  queued_ = p;
  if (!copied.ok()) {
    // Not a copy of the step's state: dropped at the step's end, as one
    // written under is (DropUnfenced), with the reason.
    p->deferred = true;
    deferred_ = p;
    fence_seen_ = false;
    early_write_ = absl::StrCat("the registered state could not be read (",
                                copied.message(), ")");
  }
}

void Snapshots::ReportEarlyWrite(absl::string_view what) {
  absl::MutexLock lock(&mu_);
  if (!early_write_.has_value()) early_write_ = std::string(what);
  fence_seen_ = false;
}

bool Snapshots::TakeFenceSeen(std::string* early) {
  absl::MutexLock lock(&mu_);
  std::optional<std::string> e = std::exchange(early_write_, std::nullopt);
  if (early != nullptr) *early = e.value_or("");
  return std::exchange(fence_seen_, false);
}

bool Snapshots::DropUnfenced() {
  absl::MutexLock lock(&mu_);
  Piece* p = deferred_;
  if (p == nullptr) return false;
  deferred_ = nullptr;
  p->invalid = true;
  if (queued_ == p) DropLocked(p);  // not taken: nobody else has it
  return true;
}

void Snapshots::Quiesce() {
  {
    absl::MutexLock lock(&mu_);
    if (queued_ != nullptr) DropLocked(queued_);
    // One the backup thread took is never acked now.
    if (deferred_ != nullptr) deferred_->invalid = true;
    deferred_ = nullptr;
  }
  // Only the training thread queues snapshots.
  AwaitIdle(absl::InfiniteFuture());
}

bool Snapshots::AwaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queued_ == nullptr && !busy_;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

int64_t Snapshots::overlapped() const {
  absl::MutexLock lock(&mu_);
  return overlapped_;
}

std::optional<int64_t> Snapshots::AwaitQueued() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return wake_ || queued_ != nullptr;
    };
    mu_.Await(absl::Condition(&ready));
    if (stop_) return std::nullopt;
    wake_ = false;
    if (queued_ != nullptr) return queued_->layout_generation;
  }
}

Snapshots::Taken Snapshots::TakeQueued(int64_t gen, bool run) {
  absl::MutexLock lock(&mu_);
  Taken t;
  if (stop_ || queued_ == nullptr || queued_->layout_generation != gen) {
    return t;  // a restore dropped it
  }
  t.found = true;
  Piece* own = std::exchange(queued_, nullptr);
  if (!run) {
    DropLocked(own);
    return t;
  }
  busy_ = true;
  round_step_ = own->step;
  t.piece = own;
  return t;
}

void Snapshots::CopyIn(Piece* p) {
  pieces::CopyHasher h;
  const absl::Status s =
      state_->CopyPiece(p->world, p->slot, p->bytes.get(), &h);
  p->checksum = h.Digest();
  absl::MutexLock lock(&mu_);
  p->copied = true;
  if (!s.ok()) {
    // Never validated: its round drops it at the gate.
    p->invalid = true;
    HOLDFAST_LOG_WARN("snapshot of step {} dropped: {}", p->step,
                      std::string(s.message()));
  }
}

void Snapshots::SetIdleRound(bool on) {
  absl::MutexLock lock(&mu_);
  idle_round_ = on;
}

bool Snapshots::AwaitValidated(Piece* own, int64_t gen) {
  absl::MutexLock lock(&mu_);
  gate_ = own;
  auto decided = [this, own, gen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return gate_ != own || own->validated || own->invalid || stop_ ||
           live_generation_ > gen;
  };
  mu_.Await(absl::Condition(&decided));
  return gate_ == own && own->validated && !own->invalid;
}

void Snapshots::EndRound(Piece* own, bool committed, const RoundClock& clock,
                         int64_t moved, int64_t transfer_us, bool again) {
  absl::MutexLock lock(&mu_);
  busy_ = false;
  idle_round_ = false;
  gate_ = nullptr;
  stats_.bytes += moved;
  stats_.transfer_us += transfer_us;
  if (committed) {
    ++stats_.rounds;
    stats_.round_us += absl::ToInt64Microseconds(clock.seen - clock.start);
    stats_.gate_us += absl::ToInt64Microseconds(clock.gated);
    stats_.commit_wait_us +=
        absl::ToInt64Microseconds(clock.seen - clock.acked);
    stats_.last_acked = clock.acked;
  }
  // Offered again (unless a restore or an unfenced step dropped it
  // meanwhile) before a snapshot taken during the agreement: the other
  // slots offer this step next, and that one is dropped.
  if (again && own != nullptr &&
      std::any_of(
          pieces_.begin(), pieces_.end(),
          [own](const std::unique_ptr<Piece>& p) { return p.get() == own; })) {
    if (queued_ != nullptr) DropLocked(queued_);
    queued_ = own;
  }
}

void Snapshots::NoteDiskWrite() {
  absl::MutexLock lock(&mu_);
  ++stats_.disk_writes;
}

void Snapshots::SetPlacement(BackupPlacement p) {
  absl::MutexLock lock(&mu_);
  placement_ = std::move(p);
}

BackupPlacement Snapshots::placement() const {
  absl::MutexLock lock(&mu_);
  return placement_;
}

void Snapshots::EndGeneration(int64_t gen) {
  absl::MutexLock lock(&mu_);
  live_generation_ = std::max(live_generation_, gen);
}

bool Snapshots::Stop() {
  absl::MutexLock lock(&mu_);
  // Under the lock: the backup thread either sees the stop before it
  // starts a round, or the round is seen here and aborted.
  stop_ = true;
  wake_ = true;
  return busy_;
}

testing::BackupStats Snapshots::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace holdfast::checkpoint
