// Who lost whom on the data network: from the peers each member could not
// reach (its rendezvous's or collective's connects that failed: refused,
// no route, timed out, reset), the member, host or link at fault. A pure
// function of its input, so the controller and the tests run it alike.
//
// The rules (the verdict names the one that decided):
//   - a host is cut off (its data link or switch port is down) when
//     members on two or more other hosts failed to reach it, or when its
//     members failed to reach two or more other hosts and every failed
//     connect involves it: its members are the culprits, unless only one
//     of them took part in any failed connect while it has others: then
//     that member's NIC is bad, and it alone is the culprit;
//   - two hosts that failed to reach each other and nobody else: the link
//     between them; the side with fewer members is evicted (ties: the
//     host later in name order). With two hosts in the job a host cut off
//     looks the same, and is handled the same;
//   - anything else is undecided.
#ifndef HOLDFAST_SRC_DIAGNOSIS_REACHABILITY_H_
#define HOLDFAST_SRC_DIAGNOSIS_REACHABILITY_H_

#include <string>
#include <utility>
#include <vector>

namespace holdfast::diagnosis {

struct ReachInput {
  // The host of each slot (slot s's host at index s).
  std::vector<std::string> host_of_slot;
  // (reporter slot, slot it could not reach), in any order; repeats and
  // out-of-range entries are ignored.
  std::vector<std::pair<int, int>> failed;
};

// The rule that decided a verdict (see above).
enum class ReachRule { kUndecided, kHostCutOff, kBadNic, kLink };

// "undecided", "host cut off", "bad NIC" or "link": the rule's name in
// incidents' evidence.
const char* ReachRuleName(ReachRule rule);

struct ReachVerdict {
  std::vector<int> culprits;  // ascending slots; empty: undecided
  ReachRule rule = ReachRule::kUndecided;
  std::string evidence;  // in words
  // A link between two hosts with as many members each: the evicted side
  // is picked by name. A host cut off looks so until a third host reports
  // it, so the caller waits a little for more reports (Membership).
  bool tie = false;
};

ReachVerdict Triangulate(const ReachInput& in);

}  // namespace holdfast::diagnosis

#endif  // HOLDFAST_SRC_DIAGNOSIS_REACHABILITY_H_
