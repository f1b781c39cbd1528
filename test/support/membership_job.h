// Test support: a Membership with fake members (sinks that record what
// the controller pushes) and a fake clock, for the membership tests.
#ifndef HOLDFAST_TEST_SUPPORT_MEMBERSHIP_JOB_H_
#define HOLDFAST_TEST_SUPPORT_MEMBERSHIP_JOB_H_

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "src/control/controller/membership.h"

namespace holdfast::control::test {

inline const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

// Records what Membership pushes to one member.
struct FakeSink : MemberSink {
  std::vector<HeartbeatResponse> pushed;
  absl::Status closed = absl::OkStatus();
  bool is_closed = false;
  void Push(const HeartbeatResponse& msg) override { pushed.push_back(msg); }
  void Close(const absl::Status& s) override {
    closed = s;
    is_closed = true;
  }
  bool Closed() const override { return is_closed; }
  bool relayed = false;  // as a host agent's stream
  bool Relayed() const override { return relayed; }
  // The last membership update pushed, or nullptr.
  const MembershipUpdate* LastUpdate() const {
    for (auto it = pushed.rbegin(); it != pushed.rend(); ++it) {
      if (it->has_membership()) return &it->membership();
    }
    return nullptr;
  }
  const JobEnd* End() const {
    for (const auto& m : pushed) {
      if (m.has_job_end()) return &m.job_end();
    }
    return nullptr;
  }
  bool GotAbortFor(int slot) const {
    for (const auto& m : pushed) {
      if (m.has_abort() && m.abort().failed_slot() == slot) return true;
    }
    return false;
  }
};

struct Job {
  explicit Job(int world, DetectionOptions d = Defaults(),
               RecoveryPolicy p = {})
      : m(world, d, kT0, {}, p) {}
  static DetectionOptions Defaults() {
    DetectionOptions d;
    d.silent_after = absl::Seconds(5);
    d.stall_floor = absl::Seconds(2);
    d.stall_factor = 5;
    d.stall_max_factor = 2;
    d.stall_min_history = 8;
    // Each generation pushed at once: these tests follow generations one
    // by one (the merge of close ones has a test of its own).
    d.push_merge = absl::ZeroDuration();
    return d;
  }
  // Registers a member and binds a sink with a first heartbeat.
  RegisterResponse Join(const std::string& host, absl::Time now,
                        const std::string& block = "") {
    RegisterRequest r;
    r.set_host(host);
    r.set_pid(1000 + static_cast<int>(sinks.size()));
    r.set_failure_domain(host);
    r.set_topology_block(block);
    auto resp = m.Register(r, now);
    REQUIRE(resp.ok());
    sinks.emplace_back(std::make_unique<FakeSink>());
    ids.push_back(resp->member_id());
    REQUIRE(Beat(ids.size() - 1, -1, now).ok());
    return *resp;
  }
  absl::Status Beat(size_t i, int64_t step, absl::Time now, int64_t step_us = 0,
                    Phase phase = PHASE_COMPUTING, int64_t coll = 0,
                    int64_t rendezvous = -1) {
    HeartbeatRequest h;
    h.set_member_id(ids[i]);
    h.set_generation(generation);
    h.mutable_report()->set_rendezvous_generation(rendezvous);
    h.mutable_report()->set_step(step);
    h.mutable_report()->set_phase(phase);
    h.mutable_report()->set_collective_seq(coll);
    h.mutable_report()->set_last_step_us(step_us);
    h.mutable_report()->set_step_end(step_us > 0);
    return m.Heartbeat(h, sinks[i].get(), now);
  }
  std::vector<Incident> Incidents(absl::Time now) {
    StatusRequest r;
    r.set_max_incidents(100);
    auto s = m.Status(r, now);
    return {s.incidents().begin(), s.incidents().end()};
  }
  Membership m;
  int64_t generation = 0;
  std::vector<std::unique_ptr<FakeSink>> sinks;
  std::vector<uint64_t> ids;
};

}  // namespace holdfast::control::test

#endif  // HOLDFAST_TEST_SUPPORT_MEMBERSHIP_JOB_H_
