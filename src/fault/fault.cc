#include "src/fault/fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "src/common/logging.h"

namespace holdfast::fault {
namespace {

// The faults that act on the process (or its thread) at a point.
bool IsProcessFault(Kind kind) {
  return kind == Kind::kKill || kind == Kind::kHang || kind == Kind::kStall ||
         kind == Kind::kExit;
}

absl::Status Bad(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("fault spec '", spec, "': ", why,
                   " (expected e.g. kill:slot=2:step=30, hang:slot=1:step=50, "
                   "stall:slot=1:recovery=1, kill:slot=2:restore=1, "
                   "exit:slot=0:step=10, slow:slot=3:ms=300, "
                   "slow-init:slot=2:ms=800 or "
                   "fail-op:slot=2:seq=120, mismatch:slot=2:seq=120, "
                   "corrupt-piece:slot=1:step=20, "
                   "corrupt-backup:slot=1:step=10, corrupt-restore:slot=1, "
                   "refuse-read:slot=1, "
                   "nan:slot=1:step=20, spike:slot=1:step=20, "
                   "bitflip:slot=1:step=20 or gradflip:slot=1:step=20)"));
}

// Every kind, in the order KindName and the error messages list them.
constexpr Kind kKinds[] = {
    Kind::kKill,          Kind::kHang,           Kind::kStall,
    Kind::kExit,          Kind::kSlow,           Kind::kSlowInit,
    Kind::kFailOp,        Kind::kMismatch,       Kind::kCorruptPiece,
    Kind::kCorruptBackup, Kind::kCorruptRestore, Kind::kRefuseRead,
    Kind::kNan,           Kind::kSpike,          Kind::kBitflip,
    Kind::kGradflip,
};

// Whether `key`, besides slot, applies to a fault of kind `k`.
bool Applies(Kind k, absl::string_view key) {
  const bool process = IsProcessFault(k);
  if (key == "step") return k != Kind::kSlowInit;  // slow-init: every build
  if (key == "seq") return k == Kind::kFailOp || k == Kind::kMismatch;
  if (key == "ms") return process || k == Kind::kSlow || k == Kind::kSlowInit;
  if (key == "recovery" || key == "restore" || key == "committed") {
    return process;
  }
  if (key == "bit") return k == Kind::kGradflip;
  if (key == "code") return k == Kind::kExit;
  return false;
}

// Sets the field of `f` that `key` names to `v`; an error for a key that
// does not apply to f's kind, or a value out of its range.
absl::Status SetKey(absl::string_view text, absl::string_view key, int64_t v,
                    FaultSpec* f) {
  if (key != "slot" && !Applies(f->kind, key)) {
    return Bad(text, absl::StrCat("key '", key, "' does not apply to ",
                                  KindName(f->kind)));
  }
  if (key == "slot") {
    if (v > (1 << 20)) return Bad(text, "slot out of range");
    f->slot = static_cast<int>(v);
  } else if (key == "step") {
    f->step = v;
  } else if (key == "seq") {
    f->seq = v;
  } else if (key == "ms") {
    if (v > 3600000) return Bad(text, "ms out of range");
    f->ms = v;
  } else if (key == "recovery" || key == "restore") {
    if (v < 1 || v > (1 << 20)) {
      return Bad(text, absl::StrCat(key, " counts from 1"));
    }
    (key == "recovery" ? f->recovery : f->restore) = static_cast<int>(v);
  } else if (key == "committed") {
    f->committed = v;
  } else if (key == "bit") {
    if (v > 31) return Bad(text, "bit out of range [0, 31] (a float32's)");
    f->bit = static_cast<int>(v);
  } else {  // code
    if (v > 255) return Bad(text, "code out of range [0, 255]");
    f->code = static_cast<int>(v);
  }
  return absl::OkStatus();
}

// The trigger of a process fault (kill, hang, stall, exit): exactly one
// of step, recovery and restore; ms and committed with a step only.
absl::Status CheckTrigger(absl::string_view text, const FaultSpec& f) {
  if ((f.step >= 0) + (f.recovery >= 0) + (f.restore >= 0) != 1) {
    return Bad(text, "give exactly one of step=N, recovery=N and restore=N");
  }
  if (f.ms > 0 && f.step < 0) {
    return Bad(text, "ms=N (into the step) applies with step=N only");
  }
  if (f.committed >= 0 && f.step < 0) {
    return Bad(text, "committed=N applies with step=N only");
  }
  return absl::OkStatus();
}

// The keys f's kind requires, and the combinations it refuses.
absl::Status CheckRequired(absl::string_view text, const FaultSpec& f) {
  if (f.slot < 0) return Bad(text, "slot=N is required");
  switch (f.kind) {
    case Kind::kKill:
    case Kind::kHang:
    case Kind::kStall:
    case Kind::kExit:
      return CheckTrigger(text, f);
    case Kind::kSlow:
    case Kind::kSlowInit:
      if (f.ms <= 0) return Bad(text, "ms=N (> 0) is required");
      break;
    case Kind::kFailOp:
    case Kind::kMismatch:
      if (f.seq < 0) return Bad(text, "seq=N is required");
      break;
    case Kind::kCorruptPiece:
    case Kind::kCorruptBackup:
    case Kind::kNan:
    case Kind::kSpike:
    case Kind::kBitflip:
    case Kind::kGradflip:
      if (f.step < 0) return Bad(text, "step=N is required");
      break;
    case Kind::kCorruptRestore:
    case Kind::kRefuseRead:
      break;  // step=N is optional: any restore that receives or reads
  }
  return absl::OkStatus();
}

absl::StatusOr<FaultSpec> ParseOne(absl::string_view text, int index) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  FaultSpec f;
  f.index = index;
  f.text = std::string(text);
  const absl::string_view kind = parts[0];
  const Kind* found = std::find_if(std::begin(kKinds), std::end(kKinds),
                                   [&](Kind k) { return kind == KindName(k); });
  if (found == std::end(kKinds)) {
    return Bad(text,
               absl::StrCat("unknown kind '", kind,
                            "' (kill, hang, stall, exit, slow, slow-init, "
                            "fail-op, mismatch, corrupt-piece, corrupt-backup, "
                            "corrupt-restore, refuse-read, nan, spike, bitflip "
                            "or gradflip)"));
  }
  f.kind = *found;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    int64_t v = 0;
    if (kv.second.empty() || !absl::SimpleAtoi(kv.second, &v) || v < 0) {
      return Bad(text, absl::StrCat("'", parts[i],
                                    "' is not key=non-negative integer"));
    }
    absl::Status set = SetKey(text, kv.first, v, &f);
    if (!set.ok()) return set;
  }
  absl::Status required = CheckRequired(text, f);
  if (!required.ok()) return required;
  return f;
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kKill:
      return "kill";
    case Kind::kHang:
      return "hang";
    case Kind::kStall:
      return "stall";
    case Kind::kExit:
      return "exit";
    case Kind::kSlow:
      return "slow";
    case Kind::kSlowInit:
      return "slow-init";
    case Kind::kFailOp:
      return "fail-op";
    case Kind::kMismatch:
      return "mismatch";
    case Kind::kCorruptPiece:
      return "corrupt-piece";
    case Kind::kCorruptBackup:
      return "corrupt-backup";
    case Kind::kCorruptRestore:
      return "corrupt-restore";
    case Kind::kRefuseRead:
      return "refuse-read";
    case Kind::kNan:
      return "nan";
    case Kind::kSpike:
      return "spike";
    case Kind::kBitflip:
      return "bitflip";
    case Kind::kGradflip:
      return "gradflip";
  }
  return "?";
}

absl::StatusOr<std::vector<FaultSpec>> Parse(absl::string_view list) {
  std::vector<FaultSpec> out;
  for (absl::string_view item :
       absl::StrSplit(list, absl::ByAnyChar(",;"), absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    absl::StatusOr<FaultSpec> f = ParseOne(item, static_cast<int>(out.size()));
    if (!f.ok()) return f.status();
    out.push_back(std::move(*f));
  }
  return out;
}

absl::Status Injector::Configure(absl::string_view list) {
  absl::StatusOr<std::vector<FaultSpec>> parsed = Parse(list);
  if (!parsed.ok()) return parsed.status();
  absl::MutexLock lock(&mu_);
  faults_ = std::move(*parsed);
  fired_.assign(faults_.size(), false);
  return absl::OkStatus();
}

void Injector::SetClaim(std::function<bool(const FaultSpec&)> claim) {
  absl::MutexLock lock(&mu_);
  claim_ = std::move(claim);
}

void Injector::SetRelease(std::function<bool()> release) {
  absl::MutexLock lock(&mu_);
  release_ = std::move(release);
}

void Injector::SetCommitted(std::function<int64_t()> committed) {
  absl::MutexLock lock(&mu_);
  committed_ = std::move(committed);
}

void Injector::AwaitCommitted(const FaultSpec& f) {
  // Bounded, so a step that never commits (its snapshot was skipped, the
  // job went on without it) cannot stall the job for good.
  constexpr absl::Duration kLongest = absl::Seconds(60);
  std::function<int64_t()> committed;
  {
    absl::MutexLock lock(&mu_);
    committed = committed_;
  }
  if (!committed) {
    HOLDFAST_LOG_WARN(
        "fault '{}': no committed step is known here (no runtime); it fires "
        "without waiting",
        f.text);
    return;
  }
  const absl::Time deadline = absl::Now() + kLongest;
  while (committed() < f.committed) {
    if (absl::Now() > deadline) {
      HOLDFAST_LOG_WARN(
          "fault '{}': step {} was not committed within {}; it fires anyway",
          f.text, f.committed, absl::FormatDuration(kLongest));
      return;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

bool Injector::empty() const {
  absl::MutexLock lock(&mu_);
  return faults_.empty();
}

bool Injector::ClaimLocked(const FaultSpec& f) {
  if (fired_[static_cast<size_t>(f.index)]) return false;
  fired_[static_cast<size_t>(f.index)] = true;
  return !claim_ || claim_(f);
}

void Injector::Fire(const FaultSpec& f, absl::string_view where) {
  // The Unix time lets a reader (recovery_bench) measure detection from
  // the fault itself rather than from the rank's last heartbeat.
  HOLDFAST_LOG_WARN("injecting fault '{}' {} (pid {}, unix ms {})", f.text,
                    std::string(where), getpid(),
                    absl::ToUnixMillis(absl::Now()));
  switch (f.kind) {
    case Kind::kKill:
      kill(getpid(), SIGKILL);
      break;
    case Kind::kHang:
      kill(getpid(), SIGSTOP);
      // Woken with SIGCONT: carry on; the controller has fenced us, and
      // the runtime finds out at its next call.
      return;
    case Kind::kStall:
      for (;;) {
        absl::SleepFor(absl::Milliseconds(100));
        std::function<bool()> release;
        {
          absl::MutexLock lock(&mu_);
          release = release_;
        }
        if (release && release()) break;
      }
      HOLDFAST_LOG_WARN("stalled fault '{}' released (pid {})", f.text,
                        getpid());
      return;
    case Kind::kExit:
      std::fflush(nullptr);
      _exit(f.code);
    case Kind::kSlow:
    case Kind::kSlowInit:
    case Kind::kFailOp:
    case Kind::kMismatch:
    case Kind::kCorruptPiece:
    case Kind::kCorruptBackup:
    case Kind::kCorruptRestore:
    case Kind::kRefuseRead:
    case Kind::kNan:
    case Kind::kSpike:
    case Kind::kBitflip:
    case Kind::kGradflip:
      return;
  }
  for (;;) pause();  // SIGKILL is on its way
}

void Injector::AtStep(int slot, int64_t step) {
  int64_t slow_ms = 0;
  const FaultSpec* fire = nullptr;
  FaultSpec copy;
  {
    absl::MutexLock lock(&mu_);
    for (const FaultSpec& f : faults_) {
      if (f.slot != slot) continue;
      if (f.kind == Kind::kSlow) {
        if (step < f.step) continue;
        slow_ms += f.ms;
        // Its onset, once per process (for the benchmarks' time to
        // detect).
        if (!fired_[static_cast<size_t>(f.index)]) {
          fired_[static_cast<size_t>(f.index)] = true;
          HOLDFAST_LOG_WARN("injecting fault '{}' (pid {}, unix ms {})", f.text,
                            getpid(), absl::ToUnixMillis(absl::Now()));
        }
      } else if (IsProcessFault(f.kind) && f.step == step && fire == nullptr &&
                 ClaimLocked(f)) {
        copy = f;
        fire = &copy;
      }
    }
  }
  if (slow_ms > 0) absl::SleepFor(absl::Milliseconds(slow_ms));
  if (fire != nullptr) {
    if (fire->committed >= 0) AwaitCommitted(*fire);
    // That far into the step.
    if (fire->ms > 0) absl::SleepFor(absl::Milliseconds(fire->ms));
    std::string where = fire->ms > 0
                            ? absl::StrCat(fire->ms, " ms into step ", step)
                            : absl::StrCat("at step ", step);
    if (fire->committed >= 0) {
      absl::StrAppend(&where, " (after step ", fire->committed, " committed)");
    }
    Fire(*fire, where);
  }
}

int64_t Injector::InitDelayMs(int slot) {
  int64_t ms = 0;
  absl::MutexLock lock(&mu_);
  for (const FaultSpec& f : faults_) {
    if (f.kind != Kind::kSlowInit || f.slot != slot) continue;
    ms += f.ms;
    if (!fired_[static_cast<size_t>(f.index)]) {  // its onset, once
      fired_[static_cast<size_t>(f.index)] = true;
      HOLDFAST_LOG_WARN("injecting fault '{}' (pid {}, unix ms {})", f.text,
                        getpid(), absl::ToUnixMillis(absl::Now()));
    }
  }
  return ms;
}

void Injector::AtRecovery(int slot, int recovery) {
  AtCount(slot, &FaultSpec::recovery, recovery, "recovery");
}

void Injector::AtRestore(int slot, int restore) {
  AtCount(slot, &FaultSpec::restore, restore, "restore");
}

void Injector::AtCount(int slot, int FaultSpec::*count, int n,
                       absl::string_view what) {
  FaultSpec copy;
  bool fire = false;
  {
    absl::MutexLock lock(&mu_);
    for (const FaultSpec& f : faults_) {
      if (f.slot == slot && f.*count >= 1 && f.*count == n && ClaimLocked(f)) {
        copy = f;
        fire = true;
        break;
      }
    }
  }
  if (fire) Fire(copy, absl::StrCat("in ", what, " ", n));
}

absl::Status Injector::AtCollective(int slot, int64_t seq) {
  absl::MutexLock lock(&mu_);
  for (const FaultSpec& f : faults_) {
    if (f.kind == Kind::kFailOp && f.slot == slot && f.seq == seq &&
        ClaimLocked(f)) {
      HOLDFAST_LOG_WARN("injecting fault '{}' (pid {}, unix ms {})", f.text,
                        getpid(), absl::ToUnixMillis(absl::Now()));
      return absl::InternalError(absl::StrCat("injected fault '", f.text, "'"));
    }
  }
  return absl::OkStatus();
}

bool Injector::MismatchAt(int slot, int64_t seq) {
  absl::MutexLock lock(&mu_);
  for (const FaultSpec& f : faults_) {
    if (f.kind == Kind::kMismatch && f.slot == slot && f.seq == seq &&
        ClaimLocked(f)) {
      HOLDFAST_LOG_WARN("injecting fault '{}' (pid {}, unix ms {})", f.text,
                        getpid(), absl::ToUnixMillis(absl::Now()));
      return true;
    }
  }
  return false;
}

const FaultSpec* Injector::ClaimAtLocked(Kind kind, int slot, int64_t step) {
  for (const FaultSpec& f : faults_) {
    // Only corrupt-restore may leave the step out (any step).
    if (f.kind == kind && f.slot == slot && (f.step < 0 || f.step == step) &&
        ClaimLocked(f)) {
      HOLDFAST_LOG_WARN("injecting fault '{}' (pid {}, unix ms {})", f.text,
                        getpid(), absl::ToUnixMillis(absl::Now()));
      return &f;
    }
  }
  return nullptr;
}

bool Injector::FiresAt(Kind kind, int slot, int64_t step) {
  absl::MutexLock lock(&mu_);
  return ClaimAtLocked(kind, slot, step) != nullptr;
}

int Injector::FlipBitAt(int slot, int64_t step) {
  absl::MutexLock lock(&mu_);
  const FaultSpec* f = ClaimAtLocked(Kind::kGradflip, slot, step);
  return f != nullptr ? f->bit : -1;
}

}  // namespace holdfast::fault
