// The controller's view of packet loss on the data network (a gray
// network, docs/gray-failures.md): every worker reports how many TCP
// segments it has retransmitted to each peer of its training communicator
// (StepReport::retransmits, cumulative in a generation). Loss on one host's
// data link shows on every connection that crosses it, from both ends, and
// on no connection between two other hosts. So the host that every other
// host retransmits to, or is retransmitted to by, while the other hosts'
// links are clean, is the host with the lossy link. Loss between one pair
// of hosts only, or everywhere, names no host.
//
// A link cut for a moment retransmits while training stalls, and the
// counts come with the first step after it: those are kept apart, as the
// stalls' (a stall), and the same host rule over the stalls of a longer
// window names a link that flaps.
//
// Not thread-safe: Membership's mutex guards it.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_LOSS_LEDGER_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_LOSS_LEDGER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::control {

class LossLedger {
 public:
  struct Verdict {
    std::string host;        // whose data link loses packets
    std::vector<int> slots;  // its workers, ascending
    std::string evidence;    // in words
  };

  // Slot `slot`'s retransmissions to its peers in `generation` so far, at
  // `now`. Those of an older generation than the newest seen are dropped.
  // `resumed`: the slot's first step after a stall; what it retransmitted
  // before is not counted (a link cut for a moment retransmits while
  // nothing moves, and the counts come with the step after).
  void Note(int slot, int64_t generation,
            const google::protobuf::RepeatedPtrField<PeerCount>& counts,
            absl::Time now, bool resumed = false);
  // The host whose data link lost packets over the last `window`: at least
  // `min_segments` retransmitted between it and each other host, and at
  // most a quarter of the least of those between any two other hosts.
  // `hosts`: the host of each slot. Needs 3 hosts or more.
  // Whether any member has retransmitted anything in the generation (a
  // cheap test before Decide).
  bool any() const { return any_; }
  std::optional<Verdict> Decide(const std::vector<std::string>& hosts,
                                absl::Time now, absl::Duration window,
                                int64_t min_segments) const;
  // The host whose data link flapped over the last `window`: at least
  // `min_stalls` stalls of one of its workers, and the host rule of Decide
  // over what the stalls retransmitted.
  std::optional<Verdict> DecideFlaps(const std::vector<std::string>& hosts,
                                     absl::Time now, absl::Duration window,
                                     int64_t min_segments,
                                     int min_stalls) const;

 private:
  using HostPair = std::pair<std::string, std::string>;
  struct Sample {
    absl::Time at;
    std::map<int, int64_t> counts;  // by peer slot
  };
  // A worker's first step after a stall, and what it retransmitted to
  // each peer during the stall.
  struct Stall {
    absl::Time at;
    int slot = 0;
    std::map<int, int64_t> grew;  // by peer slot
  };
  // The host rule over segments retransmitted between pairs of hosts:
  // the one host with at least `min_segments` with every other host and
  // at most a quarter of the least of those between any two others. Its
  // slots; the evidence lists its pairs' counts and the others' most.
  static std::optional<Verdict> NameHost(
      const std::map<HostPair, int64_t>& pairs,
      const std::vector<std::string>& hosts, int64_t min_segments);
  // Segments retransmitted between each pair of hosts over the window.
  std::map<HostPair, int64_t> HostPairs(const std::vector<std::string>& hosts,
                                        absl::Time now,
                                        absl::Duration window) const;

  int64_t generation_ = -1;
  bool any_ = false;
  // By reporter slot, oldest first, once any member has retransmitted
  // anything; a member that has retransmitted nothing has one (empty)
  // sample.
  std::map<int, std::deque<Sample>> samples_;
  std::deque<Stall> stalls_;  // oldest first
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_LOSS_LEDGER_H_
