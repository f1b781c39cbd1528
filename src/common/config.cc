#include "src/common/config.h"

#include <algorithm>

#include <cstdlib>
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace holdfast::config {
namespace {

// kInt: an integer > 0; kCount: an integer >= 0.
enum class Kind { kInt, kCount, kString };

struct Entry {
  Param param;
  Kind kind;
  // For a string parameter: the values it may take (empty: any).
  std::vector<absl::string_view> choices = {};
};

// The registry. Keep docs/configuration.md in step with it.
const std::vector<Entry>& Registry() {
  static const auto* entries = new std::vector<Entry>{
      {{"HOLDFAST_TIMEOUT_MS", "60000",
        "default deadline of one operation, in milliseconds"},
       Kind::kInt},
      {{"HOLDFAST_CONNECT_TIMEOUT_MS", "60000",
        "deadline for all ranks to meet when a communicator is created"},
       Kind::kInt},
      {{"HOLDFAST_CONNECT_THREADS", "64",
        "a rank with at most this many peers connects its pairs at once"},
       Kind::kInt},
      {{"HOLDFAST_LINK_HANDSHAKE", "1",
        "0 turns off the Gloo pairs' handshake that proves the job's "
        "secret (to measure its cost; then any process that reaches a "
        "pair's listener during a rendezvous can take the pair)"},
       Kind::kString,
       {"1", "0"}},
      {{"HOLDFAST_TCP_USER_TIMEOUT_MS", "4000",
        "a Gloo connection whose sent data stays unacknowledged this long "
        "fails (a peer cut off on the data network); 0: the kernel's "
        "default (minutes)"},
       Kind::kInt},
      {{"HOLDFAST_WATCHDOG_INTERVAL_MS", "10",
        "how often the watchdog checks in-flight deadlines"},
       Kind::kInt},
      {{"HOLDFAST_TRACE_CAPACITY", "4096",
        "entries in the per-rank trace ring"},
       Kind::kInt},
      {{"HOLDFAST_TRACE_DIR", "${TMPDIR:-/tmp}/holdfast-trace",
        "directory the trace ring is written to on abort (set empty: none)"},
       Kind::kString},
      {{"HOLDFAST_BIND_ADDR", "127.0.0.1",
        "address or host name the transport listens on"},
       Kind::kString},
      {{"HOLDFAST_IFACE", "",
        "network interface the transport listens on (wins over the address)"},
       Kind::kString},
      {{"HOLDFAST_LOG_LEVEL", "info", "trace, debug, info, warn, error or off"},
       Kind::kString,
       {"trace", "debug", "info", "warn", "error", "off"}},
      {{"HOLDFAST_CONTROLLER", "",
        "host:port of the job's controller (the runtime joins it)"},
       Kind::kString},
      {{"HOLDFAST_HOST", "",
        "this process's host label (failure domain); default: the host name"},
       Kind::kString},
      {{"HOLDFAST_TOPOLOGY_BLOCK", "",
        "this process's topology block (rack, leaf switch), optional"},
       Kind::kString},
      {{"HOLDFAST_RECOVERY_TIMEOUT_MS", "300000",
        "how long one recovery may take before the runtime gives up"},
       Kind::kInt},
      {{"HOLDFAST_FAULTS", "",
        "faults to inject, e.g. kill:slot=2:step=30 (see docs/recovery.md)"},
       Kind::kString},
      {{"HOLDFAST_PREFERRED_SLOT", "",
        "the slot to ask for when joining (a launcher's placement), or "
        "'standby'; empty: the controller chooses"},
       Kind::kString},
      {{"HOLDFAST_START_GATE_FD", "",
        "a pipe's read end: the runtime joins the job once it reads the "
        "pipe's end (holdfast-run sets it for workers, and closes the pipe "
        "once the node's standbys have registered); empty: join at once"},
       Kind::kString},
      {{"HOLDFAST_REPLICAS", "1",
        "copies of every checkpoint piece kept by buddies in other failure "
        "domains"},
       Kind::kInt},
      {{"HOLDFAST_TP_SIZE", "1",
        "tensor-parallel group size (buddies are placed outside a slot's "
        "groups)"},
       Kind::kInt},
      {{"HOLDFAST_PP_SIZE", "1", "pipeline-parallel group size"}, Kind::kInt},
      {{"HOLDFAST_CHECKPOINT_DIR", "",
        "directory of the disk tier (empty: no disk tier)"},
       Kind::kString},
      {{"HOLDFAST_VERIFY_BACKUPS", "arrival",
        "when a buddy checks a received copy against its owner's checksum: "
        "arrival (a damaged copy keeps its step from committing) or restore "
        "(the round only moves bytes; a damaged copy is found when needed)"},
       Kind::kString,
       {"arrival", "restore"}},
      {{"HOLDFAST_LIVE_RESTORE", "on",
        "on: after a fault, when all registered state is replicated and "
        "the survivors' live state is a completed step past the committed "
        "one (the same bytes on each), the job goes on from it: the "
        "survivors restore nothing and a newcomer receives it from all of "
        "them at once; off: always the committed step"},
       Kind::kString,
       {"on", "off"}},
      {{"HOLDFAST_SIDE_EXCHANGES", "off",
        "on: the runtime's own exchanges (a restore's agreements and "
        "transfers, the start's checks) go over the side communicator "
        "(Gloo) while the training communicator is still being built, as "
        "they always do when the training one is NCCL; off: over the "
        "training communicator when it is Gloo"},
       Kind::kString,
       {"on", "off"}},
      {{"HOLDFAST_OVERLAP_INIT", "on",
        "where the runtime's exchanges go over the side communicator (NCCL, "
        "HOLDFAST_SIDE_EXCHANGES=on), on: a restore and the start's checks "
        "run while the training communicator is still being built; off: "
        "once it is built (for comparison)"},
       Kind::kString,
       {"on", "off"}},
      {{"HOLDFAST_SAME_HOST_RESTORE", "on",
        "on: a restore reads the pieces a member on the same host holds "
        "straight from its memory (process_vm_readv), where the kernel "
        "allows it, instead of over the communicator; off: always the "
        "communicator"},
       Kind::kString,
       {"on", "off"}},
      {{"HOLDFAST_MAX_STEP_RETRIES", "10",
        "recoveries in a row with no new step done in between after which "
        "Runtime::Run gives up (0: no limit)"},
       Kind::kCount},
      {{"HOLDFAST_REPLICA_CHECK_EVERY", "0",
        "compare the slots' replicated state (a hash of all of it) at every "
        "N-th snapshot, to find a bit flipped at rest; 0: off"},
       Kind::kCount},
      {{"HOLDFAST_KEEP_SNAPSHOTS", "2",
        "committed snapshots kept in memory (2 to 64): a rollback past a "
        "numeric anomaly restores the newest clean one"},
       Kind::kInt},
      {{"HOLDFAST_CHECKPOINT_EVERY", "100",
        "the disk tier writes committed steps that are multiples of this"},
       Kind::kInt},
      {{"HOLDFAST_BACKEND", "gloo",
        "transport of the training communicator: gloo (host memory) or nccl "
        "(CUDA device memory)"},
       Kind::kString,
       {"gloo", "nccl"}},
      {{"HOLDFAST_DEVICE", "",
        "CUDA device of the NCCL backend (default: LOCAL_RANK, else 0)"},
       Kind::kString},
      {{"HOLDFAST_NCCL_STOP", "revoke",
        "how an NCCL communicator stops when its generation ends in a "
        "fault: revoke (ncclCommRevoke, where the NCCL has it, else an "
        "abort: the kernels stop at once, the teardown follows in the "
        "background) or abort (ncclCommAbort at once, about half a second); "
        "see docs/gpu.md"},
       Kind::kString,
       {"revoke", "abort"}},
      {{"HOLDFAST_NCCL_PRECONNECT", "1",
        "1: a new NCCL communicator connects its peers at once, in the "
        "background, while the runtime restores state (NCCL would connect "
        "them in the first step); 0: NCCL's own, at the first call that "
        "needs them; see docs/gpu.md"},
       Kind::kString,
       {"1", "0"}},
      {{"HOLDFAST_MUTEX_DEADLOCK_CHECK", "off",
        "Abseil's mutex deadlock detector: off or on. Debian builds libabsl "
        "with it on, which takes one process-wide lock on every mutex "
        "acquisition (gRPC's included); holdfast turns it off unless this "
        "is on"},
       Kind::kString,
       {"on", "off"}},
  };
  return *entries;
}

const Entry* Find(const char* env) {
  for (const Entry& e : Registry()) {
    if (absl::string_view(e.param.env) == env) return &e;
  }
  return nullptr;
}

// An integer value of a parameter of `kind` (kInt or kCount).
bool ParseInt(const char* text, Kind kind, int64_t* out) {
  return absl::SimpleAtoi(text, out) && *out >= (kind == Kind::kCount ? 0 : 1);
}

}  // namespace

const std::vector<Param>& AllParams() {
  static const auto* params = [] {
    auto* v = new std::vector<Param>;
    for (const Entry& e : Registry()) v->push_back(e.param);
    return v;
  }();
  return *params;
}

absl::Status Validate() {
  for (const Entry& e : Registry()) {
    const char* value = std::getenv(e.param.env);
    if (value == nullptr) continue;
    if (!e.choices.empty()) {
      if (std::find(e.choices.begin(), e.choices.end(),
                    absl::string_view(value)) == e.choices.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(e.param.env, "='", value, "' is not one of ",
                         absl::StrJoin(e.choices, ", ")));
      }
      continue;
    }
    if (absl::string_view(e.param.env) == "HOLDFAST_DEVICE" && *value != 0) {
      int64_t device;
      if (!absl::SimpleAtoi(value, &device) || device < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "HOLDFAST_DEVICE='", value, "' is not a device index (0, 1, ...)"));
      }
      continue;
    }
    if (absl::string_view(e.param.env) == "HOLDFAST_START_GATE_FD" &&
        *value != 0) {
      int64_t fd;
      if (!absl::SimpleAtoi(value, &fd) || fd < 0 || fd > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("HOLDFAST_START_GATE_FD='", value,
                         "' is not a file descriptor number (0, 1, ...)"));
      }
      continue;
    }
    if (absl::string_view(e.param.env) == "HOLDFAST_PREFERRED_SLOT" &&
        *value != 0 && absl::string_view(value) != "standby") {
      int64_t slot;
      if (!absl::SimpleAtoi(value, &slot) || slot < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("HOLDFAST_PREFERRED_SLOT='", value,
                         "' is neither a slot number nor 'standby'"));
      }
      continue;
    }
    if (e.kind == Kind::kString) continue;
    int64_t parsed;
    if (!ParseInt(value, e.kind, &parsed)) {
      return absl::InvalidArgumentError(absl::StrCat(
          e.param.env, "='", value, "' is not ",
          e.kind == Kind::kCount ? "an integer >= 0" : "a positive integer",
          " (", e.param.help, ")"));
    }
  }
  return absl::OkStatus();
}

int64_t IntParam(const char* env) {
  const Entry* e = Find(env);
  const Kind kind = e != nullptr ? e->kind : Kind::kInt;
  int64_t fallback = 0;
  if (e != nullptr) ParseInt(e->param.default_value, kind, &fallback);
  const char* value = std::getenv(env);
  int64_t parsed;
  if (value != nullptr && ParseInt(value, kind, &parsed)) return parsed;
  return fallback;
}

std::string StringParam(const char* env) {
  const char* value = std::getenv(env);
  if (value != nullptr) return value;
  const Entry* e = Find(env);
  return e != nullptr ? e->param.default_value : "";
}

void ApplyMutexMode() {
  if (StringParam("HOLDFAST_MUTEX_DEADLOCK_CHECK") != "on") {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
}

}  // namespace holdfast::config
