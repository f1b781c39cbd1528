// The points where the runtime and its communicators let faults in: the
// seam between them and fault injection. Hooks does nothing; the injector
// (src/fault/fault.h) implements it from a fault list, and a test may
// implement it its own way. The runtime and the communicators call these
// points and nothing else of fault injection.
#ifndef HOLDFAST_SRC_FAULT_HOOKS_H_
#define HOLDFAST_SRC_FAULT_HOOKS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace holdfast::fault {

enum class Kind {
  kKill,
  kHang,
  kStall,
  kExit,
  kSlow,
  kSlowInit,
  kFailOp,
  kMismatch,
  kCorruptPiece,
  kCorruptBackup,
  kCorruptRestore,
  kRefuseRead,
  kNan,
  kSpike,
  kBitflip,
  kGradflip
};

class Hooks {
 public:
  virtual ~Hooks() = default;

  // At the start of `step` (kill, hang, stall, exit, slow).
  virtual void AtStep(int /*slot*/, int64_t /*step*/) {}
  // How long `slot` waits before each build of its training communicator
  // (slow-init), in ms.
  virtual int64_t InitDelayMs(int /*slot*/) { return 0; }
  // At the start of recovery number `recovery` (1 = the first).
  virtual void AtRecovery(int /*slot*/, int /*recovery*/) {}
  // As the pieces of restore number `restore` begin to move.
  virtual void AtRestore(int /*slot*/, int /*restore*/) {}
  // Non-OK when collective `seq` must fail.
  virtual absl::Status AtCollective(int /*slot*/, int64_t /*seq*/) {
    return absl::OkStatus();
  }
  // Whether `slot` issues a Barrier in place of its collective `seq`.
  virtual bool MismatchAt(int /*slot*/, int64_t /*seq*/) { return false; }
  // Whether a fault of `kind` that the caller carries out (corrupt-piece,
  // corrupt-backup, corrupt-restore, nan, spike) fires for `slot` at
  // `step`; true once per fault.
  virtual bool FiresAt(Kind /*kind*/, int /*slot*/, int64_t /*step*/) {
    return false;
  }
  // The bit a gradflip fault flips in `slot`'s own values at `step`, or -1
  // when none fires; a fault fires once.
  virtual int FlipBitAt(int /*slot*/, int64_t /*step*/) { return -1; }
};

}  // namespace holdfast::fault

#endif  // HOLDFAST_SRC_FAULT_HOOKS_H_
