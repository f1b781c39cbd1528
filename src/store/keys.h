// Every key holdfast writes in a job's store (the controller's, or the
// store a program gives a Communicator), in one place. All begin with
// "holdfast/"; a program's own keys must not. Keys of one generation's
// communicator begin with "holdfast/g<generation>/".
#ifndef HOLDFAST_SRC_STORE_KEYS_H_
#define HOLDFAST_SRC_STORE_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace holdfast::keys {

// ---- a communicator of generation `g` ---------------------------------------
// Under this prefix each rank of the Gloo mesh publishes its addresses (by
// rank number).
inline std::string GlooRendezvousPrefix(int64_t g) {
  return absl::StrCat("holdfast/g", g, "/gloo/");
}
// The NCCL unique id, published by rank 0.
inline std::string NcclUniqueId(int64_t g) {
  return absl::StrCat("holdfast/nccl/g", g, "/unique_id");
}
// The abort notice rank `rank` leaves before it closes its connections: a
// JSON object with why it aborted ("code", "message", "peer") and the
// collective it was in ("op": {"coll_seq", "signature"}) or its Send or
// Recv ("p2p": {"kind", "peer", "tag", "seq", "elements"}), if any, and
// its last collectives of the generation ("trace": ops as in
// docs/trace-schema.md), which the controller's diagnosis compares.
inline std::string AbortNotice(int64_t g, int rank) {
  return absl::StrCat("holdfast/g", g, "/abort/", rank);
}
// Where a rank that finds a mismatch (collective or point-to-point) in
// generation `g` leaves its description, for the ranks that saw only a
// timeout.
inline std::string Mismatch(int64_t g) {
  return absl::StrCat("holdfast/g", g, "/mismatch");
}

// The controller's verdict on an incident of generation `g`: a JSON
// object (control::VerdictJson) with "kind", "culprits", "victims",
// "evidence", "confidence" and "action" ("replace": the culprits are
// fenced and replaced; "none"), among others.
inline std::string Verdict(int64_t g) {
  return absl::StrCat("holdfast/g", g, "/verdict");
}

// ---- the runtime ------------------------------------------------------------
// The side communicators' rendezvous, under which their own generation
// keys above follow.
inline constexpr char kSidePrefix[] = "holdfast/side/";
// Claimed by the first process to fire injected fault number `index`.
inline std::string FaultClaim(int index) {
  return absl::StrCat("holdfast/faults/", index);
}

// ---- reports the runtime leaves for the launcher's summary ------------------
// One per recovery, by the first member of generation `g` to offer it.
inline std::string Recovery(int64_t g) {
  return absl::StrCat("holdfast/report/recovery/", g);
}
// The final result (slot 0 at the end).
inline constexpr char kFinal[] = "holdfast/report/final";
// The first error that ended a member's Run (other than being fenced or an
// unused standby), as {"slot", "code", "message"}.
inline constexpr char kError[] = "holdfast/report/error";
// A fresh job that resumed from the disk tier, as {"step", "dir"} (slot 0).
inline constexpr char kResumed[] = "holdfast/report/resumed";
// Slot `slot`'s state at the end of the job, as {"replicated", "sharded"}:
// hex hashes of its registered replicated state (the same on every slot)
// and of its own partition of the sharded state.
inline std::string FinalState(int slot) {
  return absl::StrCat("holdfast/report/state/", slot);
}

}  // namespace holdfast::keys

#endif  // HOLDFAST_SRC_STORE_KEYS_H_
