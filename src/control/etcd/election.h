// Election: the controller's leader election on etcd (docs/multi-node.md,
// "Controller failover"). Candidates race to create one key, bound to a
// lease of `ttl` seconds that the leader keeps alive; the key's creation
// revision is the leader's epoch, which only grows. A leader that cannot
// renew its lease stops leading (Leading() turns false) before etcd can
// expire the lease and let another candidate win: at most one leader acts
// at a time, as long as clocks run at the same rate.
//
// Threading: Campaign and Resign from one thread; Leading() from any.
#ifndef HOLDFAST_SRC_CONTROL_ETCD_ELECTION_H_
#define HOLDFAST_SRC_CONTROL_ETCD_ELECTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace holdfast::control {

struct ElectionOptions {
  // etcd's client endpoints: "HOST:PORT", or "IP:PORT,IP:PORT,..." (any
  // member answers; a lost member is skipped).
  std::string endpoints;
  // The key candidates race for, e.g. "/holdfast/<job>/leader".
  std::string key;
  // What the leader writes there: its address for members.
  std::string value;
  // The lease's time to live, in whole seconds (etcd's unit). It must
  // outlast etcd electing a leader of its own (one to two election
  // timeouts, 1 s by default), or losing etcd's leader deposes ours too.
  int ttl_s = 4;
  // How often the leader renews the lease, and retries a failed renewal.
  absl::Duration renew_every = absl::Milliseconds(400);
  absl::Duration retry_every = absl::Milliseconds(100);
  // How often a candidate looks whether the key is free.
  absl::Duration poll_every = absl::Milliseconds(100);
};

class Election {
 public:
  // InvalidArgument for empty endpoints or key, or a ttl below 1 s.
  static absl::StatusOr<std::unique_ptr<Election>> Create(
      const ElectionOptions& options);
  virtual ~Election() = default;

  // Blocks until this candidate leads; its epoch. Cancelled once `stop`
  // returns true (checked every poll). etcd being unreachable is retried.
  virtual absl::StatusOr<int64_t> Campaign(
      const std::function<bool()>& stop) = 0;
  // Whether this candidate still surely leads: its last renewal, plus the
  // lease's time to live, is ahead (measured from before the renewal was
  // sent, so it ends no later than etcd's own expiry).
  virtual bool Leading() const = 0;
  // Gives the lead up at once (revokes the lease); a no-op when not
  // leading.
  virtual void Resign() = 0;
  // The current leader's value, or "" when there is none.
  virtual absl::StatusOr<std::string> Leader() = 0;
};

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_ETCD_ELECTION_H_
