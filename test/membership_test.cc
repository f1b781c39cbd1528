// Membership logic with a fake time: slots and standbys, resume after a
// controller restart, the four detectors, fencing, generations and the
// checkpoint ledger. No sleeping: every call takes `now`.
#include <catch2/catch.hpp>
#include <functional>
#include <set>
#include <vector>

#include "src/control/controller/checkpoint_ledger.h"
#include "src/control/controller/membership.h"
#include "src/control/controller/slot_table.h"
#include "src/control/controller/straggler_watch.h"
#include "test/support/membership_job.h"

using namespace holdfast::control;

using namespace holdfast::control::test;

TEST_CASE(
    "membership: slots fill in order and extra registrants are standbys") {
  Job job(2);
  CHECK(job.Join("a", kT0).slot() == 0);
  CHECK(job.Join("b", kT0).slot() == 1);
  RegisterResponse c = job.Join("c", kT0);
  CHECK(c.role() == ROLE_STANDBY);
  CHECK(c.slot() == -1);
  CHECK(c.world_size() == 2);
  CHECK(job.ids[0] != job.ids[1]);
}

TEST_CASE("membership: a preferred slot is honoured while it is vacant") {
  Job job(3);
  auto join = [&](int preferred) {
    RegisterRequest r;
    r.set_host("h");
    r.set_pid(1);
    r.set_preferred_slot(preferred);
    auto resp = job.m.Register(r, kT0);
    REQUIRE(resp.ok());
    return *resp;
  };
  CHECK(join(2).slot() == 2);
  // The standby role on request, though slots are vacant.
  RegisterResponse standby = join(-1);
  CHECK(standby.role() == ROLE_STANDBY);
  CHECK(join(0).slot() == 0);
  // Taken: the lowest vacant slot instead.
  CHECK(join(2).slot() == 1);
  // Full: a standby, whatever it asked for.
  CHECK(join(1).role() == ROLE_STANDBY);
  RegisterRequest bad;
  bad.set_host("h");
  bad.set_preferred_slot(-2);
  auto s = job.m.Register(bad, kT0).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("preferred slot -2") != absl::string_view::npos);
}

TEST_CASE("membership: bad registrations and reports get InvalidArgument") {
  Job job(2);
  RegisterRequest r;
  r.set_host(std::string(300, 'h'));
  CHECK(job.m.Register(r, kT0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  r.set_host("h");
  r.set_resume(true);
  r.set_member_id(77);
  r.set_slot(2);  // world of 2: slots 0 and 1
  auto s = job.m.Register(r, kT0).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("slot 2 is out of range") != absl::string_view::npos);
  r.set_slot(0);
  r.set_generation(-1);
  CHECK(job.m.Register(r, kT0).status().code() ==
        absl::StatusCode::kInvalidArgument);

  job.Join("a", kT0);
  CHECK(job.Beat(0, -5, kT0).code() == absl::StatusCode::kInvalidArgument);
  HeartbeatRequest h;
  h.set_member_id(12345);  // never registered
  FakeSink sink;
  auto unknown = job.m.Heartbeat(h, &sink, kT0);
  CHECK(unknown.code() == absl::StatusCode::kInvalidArgument);
  CHECK(unknown.message().find("unknown member id") != absl::string_view::npos);
  h.set_member_id(job.ids[0]);
  for (int i = 0; i < 100; ++i) {
    (*h.mutable_report()->mutable_metrics())["m" + std::to_string(i)] = i;
  }
  CHECK(job.m.Heartbeat(h, job.sinks[0].get(), kT0).code() ==
        absl::StatusCode::kInvalidArgument);
  h.mutable_report()->clear_metrics();
  h.set_generation(9);  // never opened
  CHECK(job.m.Heartbeat(h, job.sinks[0].get(), kT0).code() ==
        absl::StatusCode::kInvalidArgument);

  ReportFailureRequest f;
  f.set_member_id(job.ids[0]);
  f.set_peer_slot(5);
  CHECK(job.m.ReportFailure(f, kT0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  AckCheckpointRequest a;
  a.set_member_id(job.ids[0]);
  a.set_step(-3);
  CHECK(job.m.AckCheckpoint(a, kT0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "membership: a silent member is declared dead and fenced and a "
    "standby takes its slot") {
  Job job(2);
  job.Join("a", kT0, "rack1");
  job.Join("b", kT0, "rack2");
  job.Join("c", kT0, "rack9");  // standby, other block
  job.Join("d", kT0, "rack2");  // standby, same block as b
  absl::Time t = kT0;
  for (int step = 0; step < 4; ++step) {
    t += absl::Seconds(1);
    for (size_t i : {0, 2, 3}) REQUIRE(job.Beat(i, step, t, 1000000).ok());
    // b (slot 1) stops sending after step 0.
    if (step == 0) REQUIRE(job.Beat(1, step, t, 1000000).ok());
    job.m.Scan(t);
  }
  CHECK(job.Incidents(t).empty());
  t += absl::Seconds(3);  // b silent for 6 s
  for (size_t i : {0, 2, 3}) REQUIRE(job.Beat(i, 4, t, 1000000).ok());
  job.m.Scan(t);
  auto inc = job.Incidents(t);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_SILENT);
  CHECK(inc[0].member_id() == job.ids[1]);
  CHECK(inc[0].slot() == 1);
  CHECK(inc[0].time_to_detect_ms() == 6000);
  CHECK(inc[0].evidence().find("no heartbeat for 6.0 s") != std::string::npos);
  // Fenced: its stream is closed, and every call with its id is refused.
  CHECK(job.sinks[1]->is_closed);
  CHECK(job.sinks[1]->closed.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(job.Beat(1, 5, t).code() == absl::StatusCode::kFailedPrecondition);
  AckCheckpointRequest ack;
  ack.set_member_id(job.ids[1]);
  CHECK(job.m.AckCheckpoint(ack, t).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  RegisterRequest resume;
  resume.set_resume(true);
  resume.set_member_id(job.ids[1]);
  resume.set_slot(1);
  resume.set_generation(0);
  CHECK(job.m.Register(resume, t).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // Generation 1: the standby in b's block (d) took slot 1; everyone alive
  // got the abort order and their place in the new generation.
  for (size_t i : {0, 2, 3}) CHECK(job.sinks[i]->GotAbortFor(1));
  const auto& last_d = job.sinks[3]->pushed.back();
  REQUIRE(last_d.has_membership());
  CHECK(last_d.membership().generation() == 1);
  CHECK(last_d.membership().slot() == 1);
  CHECK(last_d.membership().role() == ROLE_WORKER);
  CHECK(job.sinks[2]->pushed.back().membership().role() == ROLE_STANDBY);
  StatusResponse s = job.m.Status({}, t);
  CHECK(s.generation() == 1);
  CHECK(s.alive() == 3);
  CHECK(s.dead() == 1);
  CHECK(s.standbys() == 1);
  CHECK(s.vacant_slots() == 0);
}

TEST_CASE(
    "membership: a silent member's slot goes to a standby on another host "
    "before one on its own host, in its block first") {
  // b's host "h2" went quiet: its standby there (c, in b's block and the
  // longest waiting) may be as dead as b, even while its last heartbeat is
  // recent enough. d, in b's block on another host, takes the slot; with
  // no d, e on a third host in another block does; only with neither, c.
  const int others = GENERATE(2, 1, 0);
  INFO(others << " standbys on other hosts");
  Job job(2);
  job.Join("h1", kT0, "rack1");
  job.Join("h2", kT0, "rack2");
  job.Join("h2", kT0, "rack2");                   // c: b's host and block
  if (others >= 1) job.Join("h4", kT0, "rack9");  // e: another block
  if (others >= 2) job.Join("h3", kT0, "rack2");  // d: b's block
  const size_t n = job.ids.size();
  absl::Time t = kT0;
  for (int step = 0; step < 4; ++step) {
    t += absl::Seconds(1);
    for (size_t i = 0; i < n; ++i) {
      if (i != 1 || step == 0) REQUIRE(job.Beat(i, step, t, 1000000).ok());
    }
    job.m.Scan(t);
  }
  t += absl::Seconds(3);  // b silent for 6 s
  for (size_t i = 0; i < n; ++i) {
    if (i != 1) REQUIRE(job.Beat(i, 4, t, 1000000).ok());
  }
  job.m.Scan(t);
  REQUIRE(job.Incidents(t).size() == 1);
  const size_t taker = others == 2 ? 4 : others == 1 ? 3 : 2;
  for (size_t i = 2; i < n; ++i) {
    INFO("standby " << i);
    REQUIRE(job.sinks[i]->pushed.back().has_membership());
    const auto& m = job.sinks[i]->pushed.back().membership();
    CHECK(m.role() == (i == taker ? ROLE_WORKER : ROLE_STANDBY));
    if (i == taker) CHECK(m.slot() == 1);
  }
}

TEST_CASE("membership: a broken stream is a crash and a goodbye is not") {
  Job job(3);
  job.Join("a", kT0);
  job.Join("b", kT0);
  job.Join("c", kT0);
  job.m.Detach(job.ids[1], job.sinks[1].get(), /*clean=*/false,
               /*finished=*/false, "reset", kT0 + absl::Milliseconds(5));
  job.m.Detach(job.ids[2], job.sinks[2].get(), /*clean=*/true,
               /*finished=*/true, "bye", kT0 + absl::Milliseconds(5));
  auto inc = job.Incidents(kT0 + absl::Seconds(1));
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_CRASHED);
  CHECK(inc[0].member_id() == job.ids[1]);
  CHECK(job.sinks[0]->GotAbortFor(1));
  StatusResponse s = job.m.Status({}, kT0);
  CHECK(s.left() == 1);
  CHECK(s.dead() == 1);
  // No standby: the world shrank to the two that were alive.
  CHECK(s.world_size() == 2);
  CHECK(s.vacant_slots() == 1);
  // A detach from a superseded stream changes nothing.
  FakeSink old;
  job.m.Detach(job.ids[0], &old, false, false, "old stream", kT0);
  CHECK(job.m.Status({}, kT0).alive() == 1);
}

TEST_CASE(
    "membership: a stream that breaks after its member went quiet is left to "
    "the silence rule") {
  DetectionOptions d = Job::Defaults();
  d.heartbeat_interval = absl::Milliseconds(500);
  d.silent_after = absl::Seconds(3);
  Job job(3, d);
  job.Join("a", kT0);
  job.Join("b", kT0);
  job.Join("c", kT0);
  const absl::Time t = kT0 + absl::Milliseconds(1100);
  REQUIRE(job.Beat(0, 1, t).ok());
  REQUIRE(job.Beat(2, 1, t - absl::Milliseconds(200)).ok());
  // b was last heard 1.1 s ago (its link went down; the break is late
  // news); c 200 ms ago (a killed process).
  job.m.Detach(job.ids[1], job.sinks[1].get(), false, false, "late FIN", t);
  job.m.Detach(job.ids[2], job.sinks[2].get(), false, false, "reset", t);
  auto inc = job.Incidents(t);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_CRASHED);
  CHECK(inc[0].member_id() == job.ids[2]);
  // b may still resume on a new stream; unheard past the grace it is
  // declared silent (a is heard: one of two unheard is no majority).
  absl::Time u = kT0 + absl::Milliseconds(3100);
  REQUIRE(job.Beat(0, 2, u).ok());
  job.m.Scan(u);
  inc = job.Incidents(u);
  REQUIRE(inc.size() == 2);
  CHECK(inc[1].kind() == INCIDENT_SILENT);
  CHECK(inc[1].member_id() == job.ids[1]);
}

TEST_CASE(
    "membership: a controller that hears fewer than half of its members "
    "declares nobody silent, then waits out the outage") {
  DetectionOptions d = Job::Defaults();
  d.heartbeat_interval = absl::Milliseconds(500);
  d.silent_after = absl::Seconds(3);
  Job job(3, d);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);  // d: standby
  // The controller's link is down from kT0: nobody is heard. At 1.6 s
  // everyone is unheard for more than half the grace: isolated.
  job.m.Scan(kT0 + absl::Milliseconds(1600));
  for (int s = 2; s <= 10; ++s) job.m.Scan(kT0 + absl::Seconds(s));
  CHECK(job.Incidents(kT0 + absl::Seconds(10)).empty());
  CHECK(job.m.Status({}, kT0 + absl::Seconds(10)).generation() == 0);
  // Back at 10 s: the workers are heard, the standby's heartbeats are
  // still in TCP's back-off. Nobody is declared silent for the outage's
  // length (8.4 s isolated + the 3 s before it: until 21.4 s).
  absl::Time t = kT0 + absl::Seconds(10);
  for (; t <= kT0 + absl::Seconds(21); t += absl::Milliseconds(500)) {
    for (size_t i : {0, 1, 2}) REQUIRE(job.Beat(i, 1, t).ok());
    job.m.Scan(t);
  }
  CHECK(job.Incidents(t).empty());
  for (; t <= kT0 + absl::Seconds(22); t += absl::Milliseconds(100)) {
    for (size_t i : {0, 1, 2}) REQUIRE(job.Beat(i, 1, t).ok());
    job.m.Scan(t);
  }
  // The standby never came back: now it is silent.
  auto inc = job.Incidents(t);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_SILENT);
  CHECK(inc[0].member_id() == job.ids[3]);
  CHECK(job.m.Status({}, t).generation() == 0);  // a standby's loss
}

TEST_CASE(
    "membership: the lease is told at Register, two thirds of the "
    "grace unless set") {
  DetectionOptions d = Job::Defaults();
  d.silent_after = absl::Seconds(3);
  Job job(1, d);
  CHECK(job.Join("a", kT0).lease_ms() == 2000);
  d.lease = absl::Milliseconds(700);
  Job set(1, d);
  CHECK(set.Join("a", kT0).lease_ms() == 700);
  CHECK(Lease(d) == absl::Milliseconds(700));
}

TEST_CASE(
    "membership: a newer stream supersedes the old one, and a heartbeat the "
    "old one read late does not take the member back") {
  Job job(2);
  job.Join("a", kT0);
  job.Join("b", kT0);
  // Member 0 reconnects: its new stream binds, the old one is closed.
  std::unique_ptr<FakeSink> old = std::move(job.sinks[0]);
  job.sinks[0] = std::make_unique<FakeSink>();
  REQUIRE(job.Beat(0, 1, kT0 + absl::Milliseconds(1)).ok());
  CHECK(old->is_closed);
  CHECK(old->closed.code() == absl::StatusCode::kAborted);
  CHECK(!job.sinks[0]->is_closed);
  // A heartbeat the old stream had read before its close arrives now.
  HeartbeatRequest late;
  late.set_member_id(job.ids[0]);
  late.set_generation(0);
  late.mutable_report()->set_step(1);
  absl::Status s =
      job.m.Heartbeat(late, old.get(), kT0 + absl::Milliseconds(2));
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK(std::string(s.message()).find("superseded") != std::string::npos);
  // The new stream stays bound: it is not closed and the commit reaches it.
  CHECK(!job.sinks[0]->is_closed);
  const size_t before = job.sinks[0]->pushed.size();
  for (size_t i = 0; i < 2; ++i) {
    AckCheckpointRequest a;
    a.set_member_id(job.ids[i]);
    a.set_generation(0);
    a.set_step(1);
    REQUIRE(job.m.AckCheckpoint(a, kT0 + absl::Milliseconds(3)).ok());
  }
  bool committed = false;
  for (size_t k = before; k < job.sinks[0]->pushed.size(); ++k) {
    committed = committed || job.sinks[0]->pushed[k].committed_step() == 1;
  }
  CHECK(committed);
  CHECK(job.m.Status({}, kT0 + absl::Milliseconds(3)).alive() == 2);
}

TEST_CASE(
    "membership: a member whose step stops advancing is declared stalled") {
  Job job(4);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
  absl::Time t = kT0;
  // 1 s steps. Member 2 hangs inside step 10 (computing); the others finish
  // step 10 and then wait for it inside collective #11.
  for (int step = 0; step <= 10; ++step) {
    t += absl::Seconds(1);
    for (size_t i = 0; i < 4; ++i) {
      if (i == 2 && step == 10) continue;
      REQUIRE(job.Beat(i, step, t, 1000000).ok());
    }
    job.m.Scan(t);
  }
  // Heartbeats go on (the process is alive) until the detector fires.
  for (int tick = 0; tick < 20 && job.Incidents(t).empty(); ++tick) {
    t += absl::Seconds(1);
    for (size_t i = 0; i < 4; ++i) {
      if (i == 2) {
        REQUIRE(job.Beat(i, 9, t, 0, PHASE_COMPUTING, 10).ok());
      } else {
        REQUIRE(job.Beat(i, 10, t, 0, PHASE_COLLECTIVE, 11).ok());
      }
    }
    job.m.Scan(t);
  }
  CHECK(t == kT0 + absl::Seconds(16));  // step 9 ended at 10 s; 6 s > 5 s
  // Threshold: max(2 s floor, 5 x 1 s median, 2 x 1 s longest) = 5 s. Only
  // the laggard is declared, though everyone stopped advancing.
  auto inc = job.Incidents(t);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_STALLED);
  CHECK(inc[0].member_id() == job.ids[2]);
  CHECK(inc[0].evidence().find("step 9 has not advanced") != std::string::npos);
  CHECK(inc[0].evidence().find("threshold 5.0 s") != std::string::npos);
  CHECK(job.sinks[2]->closed.code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "stall rule: the workers furthest behind are the laggards, and a job "
    "stuck alike everywhere has none to fence") {
  // Slot 1 hangs in step 7's compute; the others wait in its collective.
  Stall s = Laggards({{8, 41}, {7, 40}, {8, 41}}, 3);
  CHECK(s.laggards == std::vector<size_t>{1});
  CHECK_FALSE(s.job_wide);
  // The same step, an earlier collective: the collective decides.
  s = Laggards({{7, 40}, {7, 39}}, 4);
  CHECK(s.laggards == std::vector<size_t>{1});
  // Two stuck at the same point while others still move: both named.
  s = Laggards({{7, 39}, {7, 39}}, 4);
  CHECK(s.laggards == std::vector<size_t>{0, 1});
  CHECK_FALSE(s.job_wide);
  // Every live worker at the same point: the job's stall, no culprit.
  s = Laggards({{7, 39}, {7, 39}, {7, 39}}, 3);
  CHECK(s.job_wide);
  // One worker alone is its own culprit.
  s = Laggards({{7, 39}}, 1);
  CHECK(s.laggards == std::vector<size_t>{0});
  CHECK_FALSE(s.job_wide);
  CHECK(Laggards({}, 3).laggards.empty());
}

TEST_CASE("membership: uneven step times raise no false stall") {
  // An RL-like job: every 4th step is a rollout 6x as long. Stall detection
  // takes the job's own longest recent step into account.
  Job job(3);
  for (const char* h : {"a", "b", "c"}) job.Join(h, kT0);
  absl::Time t = kT0;
  for (int step = 0; step < 200; ++step) {
    const absl::Duration d =
        step % 4 == 3 ? absl::Seconds(6) : absl::Seconds(1);
    // Heartbeats every second while the step runs, then the step end.
    for (absl::Duration in = absl::Seconds(1); in < d; in += absl::Seconds(1)) {
      for (size_t i = 0; i < 3; ++i)
        REQUIRE(job.Beat(i, step - 1, t + in).ok());
      job.m.Scan(t + in);
    }
    t += d;
    for (size_t i = 0; i < 3; ++i) {
      REQUIRE(job.Beat(i, step, t, absl::ToInt64Microseconds(d)).ok());
    }
    job.m.Scan(t);
  }
  CHECK(job.Incidents(t).empty());
  // Median 1 s x 5 = 5 s would have fired on the 6 s rollouts.
  CHECK(job.m.Status({}, t).stall_threshold_ms() == 12000);
}

TEST_CASE(
    "membership: a job-wide stall with no culprit is recorded once and "
    "fences nobody") {
  Job job(2);
  job.Join("a", kT0);
  job.Join("b", kT0);
  absl::Time t = kT0;
  for (int step = 0; step < 10; ++step) {
    t += absl::Seconds(1);
    for (size_t i = 0; i < 2; ++i) REQUIRE(job.Beat(i, step, t, 1000000).ok());
  }
  for (int tick = 0; tick < 20; ++tick) {
    t += absl::Seconds(1);
    for (size_t i = 0; i < 2; ++i) {
      REQUIRE(job.Beat(i, 9, t, 0, PHASE_COLLECTIVE, 10).ok());
    }
    job.m.Scan(t);
  }
  auto inc = job.Incidents(t);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_STALLED);
  CHECK(inc[0].member_id() == 0);
  CHECK(inc[0].evidence().find("no culprit") != std::string::npos);
  CHECK(job.m.Status({}, t).alive() == 2);
}

TEST_CASE(
    "membership: a reported peer is declared and stale reports are "
    "refused") {
  Job job(3);
  for (const char* h : {"a", "b", "c"}) job.Join(h, kT0);
  ReportFailureRequest f;
  f.set_member_id(job.ids[0]);
  f.set_generation(0);
  f.set_peer_slot(2);
  f.set_reason("allreduce #7 lost its connection to rank 2");
  auto r = job.m.ReportFailure(f, kT0 + absl::Seconds(1));
  REQUIRE(r.ok());
  CHECK(*r);
  auto inc = job.Incidents(kT0 + absl::Seconds(1));
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_REPORTED);
  CHECK(inc[0].reporter_id() == job.ids[0]);
  CHECK(inc[0].evidence().find("allreduce #7") != std::string::npos);
  // A second report of the same failure, from the old generation.
  f.set_member_id(job.ids[1]);
  CHECK(job.m.ReportFailure(f, kT0).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // The dead member cannot report either.
  f.set_member_id(job.ids[2]);
  f.set_generation(1);
  f.set_peer_slot(0);
  CHECK(job.m.ReportFailure(f, kT0).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("membership: a step commits when every slot acked it") {
  Job job(2);
  job.Join("a", kT0);
  job.Join("b", kT0);
  AckCheckpointRequest a;
  a.set_generation(0);
  a.set_step(3);
  a.set_member_id(job.ids[0]);
  CHECK(*job.m.AckCheckpoint(a, kT0) == -1);
  CHECK(*job.m.AckCheckpoint(a, kT0) == -1);  // a duplicate counts once
  a.set_member_id(job.ids[1]);
  CHECK(*job.m.AckCheckpoint(a, kT0) == 3);
  bool pushed = false;
  for (const auto& m : job.sinks[0]->pushed) {
    pushed = pushed || (m.has_committed_step() && m.committed_step() == 3);
  }
  CHECK(pushed);
  a.set_generation(1);
  CHECK(job.m.AckCheckpoint(a, kT0).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(job.m.Status({}, kT0).committed_step() == 3);
}

TEST_CASE(
    "checkpoint ledger: the newest step every slot acked commits, older and "
    "pending steps go, and a generation or a rollback drops the acks") {
  CheckpointLedger l(/*max_pending_steps=*/3);
  CHECK_FALSE(l.Ack(0, 5, 3));
  CHECK_FALSE(l.Ack(1, 5, 3));
  CHECK_FALSE(l.Ack(1, 5, 3));  // a duplicate counts once
  CHECK_FALSE(l.Ack(3, 5, 3));  // no such slot
  CHECK(l.committed() == -1);
  // Step 6 completes before step 5: 6 commits, and 5 is gone with it.
  for (int s = 0; s < 3; ++s) CHECK(l.Ack(s, 6, 3) == (s == 2));
  CHECK(l.committed() == 6);
  CHECK_FALSE(l.Ack(2, 5, 3));  // at or before the committed step
  CHECK(l.committed() == 6);
  // Four pending steps: the oldest (7) is dropped, so its acks are gone.
  CHECK_FALSE(l.Ack(0, 7, 3));
  CHECK_FALSE(l.Ack(1, 7, 3));
  for (int64_t step : {8, 9, 10}) CHECK_FALSE(l.Ack(0, step, 3));
  CHECK_FALSE(l.Ack(2, 7, 3));  // older than every pending step: dropped
  CHECK(l.committed() == 6);
  // A new generation acks again, in its world.
  CHECK_FALSE(l.Ack(0, 11, 2));
  l.NewGeneration();
  CHECK_FALSE(l.Ack(1, 11, 2));
  CHECK(l.Ack(0, 11, 2));
  CHECK(l.committed() == 11);
  // A rollback restores an older step.
  CHECK_FALSE(l.Ack(0, 12, 2));
  l.Restore(4);
  CHECK(l.committed() == 4);
  CHECK_FALSE(l.Ack(1, 12, 2));  // the ack of slot 0 went with the rollback
  CHECK(l.Ack(0, 12, 2));
  CHECK(l.committed() == 12);
}

TEST_CASE(
    "slot table: members take the lowest vacant slot, standbys wait in "
    "order, a shrink renumbers the holders and a resize keeps held slots") {
  SlotTable t(4);
  CHECK(t.world_size() == 4);
  CHECK(t.LowestVacant() == 0);
  t.Take(0, 10);
  t.Take(2, 12);
  CHECK(t.LowestVacant() == 1);
  CHECK(t.held() == 2);
  CHECK_FALSE(t.vacant(2));
  CHECK(t.vacant(3));
  CHECK_FALSE(t.vacant(4));  // out of range
  CHECK_FALSE(t.vacant(-1));
  t.Take(1, 11);
  t.Take(3, 13);
  CHECK(t.LowestVacant() == -1);
  // Standbys: the one that came first is first.
  const uint64_t a = t.AddStandby(20);
  const uint64_t b = t.AddStandby(21);
  CHECK(a < b);
  CHECK(t.standbys().begin()->second == 20);
  t.RemoveStandby(a);
  CHECK(t.standbys().begin()->second == 21);
  CHECK(t.standbys().size() == 1);
  // Slot 1 is lost; a shrink renumbers 10, 12, 13 into slots 0, 1, 2.
  t.Vacate(1);
  CHECK(t.LowestVacant() == 1);
  CHECK(t.holder(1) == 0);
  CHECK(t.Compact() == 1);
  CHECK(t.holders() == std::vector<uint64_t>{10, 12, 13});
  CHECK(t.LowestVacant() == -1);
  CHECK(t.held() == 3);
  // A resize may not drop a held slot; it may drop a vacant one.
  CHECK_FALSE(t.Resize(2));
  CHECK(t.holders() == std::vector<uint64_t>{10, 12, 13});
  t.Vacate(2);
  CHECK(t.Resize(2));
  CHECK(t.holders() == std::vector<uint64_t>{10, 12});
  CHECK(t.Resize(5));
  CHECK(t.world_size() == 5);
  CHECK(t.vacant_count() == 3);
  CHECK(t.LowestVacant() == 2);
}

TEST_CASE(
    "straggler watch: a slow slot is found after a window more, a burst "
    "passes, a replacement is due after replace_after steps, and a "
    "generation starts the steps over") {
  DetectionOptions d;
  d.straggler_window = 8;
  StragglerWatch w(d, /*replace_after=*/16, /*budget=*/1);
  // One step of every slot (work in ms), then a scan at median step 0
  // (the window is straggler_window steps).
  auto step = [&](int world, int64_t gen, int64_t s, int slow_slot,
                  double slow_ms) {
    for (int slot = 0; slot < world; ++slot) {
      const double ms = slot == slow_slot ? slow_ms : 30.0;
      w.NoteStepEnd(slot, gen,
                    StepSample{s, static_cast<int64_t>(ms * 1000),
                               /*arrival_us=*/0});
    }
    CHECK(w.TakeStepEnds());
    CHECK_FALSE(w.TakeStepEnds());
    return w.Scan(world, gen, absl::ZeroDuration());
  };
  // Generation 0: slot 2 works twice as long from step 0. The rule holds
  // once 8 steps are complete (newest 7), and is found a window later.
  for (int64_t s = 0; s < 15; ++s) CHECK(step(4, 0, s, 2, 60).empty());
  std::vector<StragglerWatch::Finding> f = step(4, 0, 15, 2, 60);
  REQUIRE(f.size() == 1);
  CHECK(f[0].slot == 2);
  CHECK(f[0].window.steps == 8);
  CHECK(f[0].window.slow == 8);
  CHECK(f[0].window.mine == 8 * 60000.0);
  CHECK(f[0].window.peers == 8 * 30000.0);
  CHECK_FALSE(f[0].replace_due);  // not reported yet
  CHECK_FALSE(w.reported(2, 0));
  w.MarkReported(2, 0);
  CHECK(w.reported(2, 0));
  CHECK_FALSE(w.reported(2, 1));
  // Due once the rule held for replace_after (16) steps more: newest 31.
  for (int64_t s = 16; s < 31; ++s) {
    f = step(4, 0, s, 2, 60);
    REQUIRE(f.size() == 1);
    CHECK_FALSE(f[0].replace_due);
  }
  f = step(4, 0, 31, 2, 60);
  REQUIRE(f.size() == 1);
  CHECK(f[0].replace_due);
  // The budget of one replacement.
  CHECK(w.CanReplace(1));
  CHECK_FALSE(w.CanReplace(2));
  CHECK(w.SpendReplacement() == 1);
  CHECK_FALSE(w.CanReplace(1));
  // Generation 1: nothing until every slot has steps of it.
  w.NoteStepEnd(0, 1, StepSample{40, 30000, 0});
  CHECK(w.Scan(4, 1, absl::ZeroDuration()).empty());
  // A burst (slot 1 five times as slow on two steps) holds for fewer
  // steps than a window, and passes.
  for (int64_t s = 40; s < 80; ++s) {
    CHECK(step(4, 1, s, s == 50 || s == 51 ? 1 : -1, 150).empty());
  }
  // Steps redone after a rollback start a slot's steps over.
  for (int64_t s = 60; s < 75; ++s) CHECK(step(4, 1, s, 3, 90).empty());
  CHECK(step(4, 1, 75, 3, 90).size() == 1);
  // Fewer than 3 slots: no rule.
  for (int64_t s = 0; s < 40; ++s) CHECK(step(2, 2, s, 1, 90).empty());
}

TEST_CASE(
    "straggler watch: with short steps the window covers a second of the "
    "job, so half a second of contention on a healthy slot is not a "
    "straggler, and a CPU quota's regular stops are") {
  // Measured on 2 cores (2026-11-28): 4 DDP ranks with 2.5 ms of work a
  // step and 10 ms steps. A healthy rank preempted now and then for a
  // while showed 1.31-1.38x over 32 steps and was reported; the rank
  // capped at 25 % of a core stops about 75 ms in every 100.
  DetectionOptions d;
  StragglerWatch w(d, /*replace_after=*/0, /*budget=*/0);
  const absl::Duration median = absl::Milliseconds(10);
  CHECK(StragglerWindow(d, median) == 100);
  CHECK(StragglerWindow(d, absl::Milliseconds(3)) == 128);  // 16 windows
  CHECK(StragglerWindow(d, absl::Milliseconds(200)) == 8);
  // Slot 0 is preempted for 15 ms on every 12th step from step 100 to 148
  // (about half a second); from step 400 slot 3 stops for 75 ms on every
  // 10th step.
  auto work_ms = [](int64_t s, int slot) {
    double ms = 2.5;
    if (slot == 0 && s >= 100 && s <= 148 && (s - 100) % 12 == 0) ms += 15;
    if (slot == 3 && s >= 400 && s % 10 == 0) ms += 75;
    return ms;
  };
  std::vector<StragglerWatch::Finding> found;
  int64_t first = -1;
  for (int64_t s = 0; s < 700 && found.empty(); ++s) {
    for (int slot = 0; slot < 4; ++slot) {
      w.NoteStepEnd(slot, 0,
                    StepSample{s, static_cast<int64_t>(work_ms(s, slot) * 1000),
                               /*arrival_us=*/0});
    }
    found = w.Scan(4, 0, median);
    if (!found.empty()) first = s;
  }
  REQUIRE(found.size() == 1);
  CHECK(found[0].slot == 3);
  CHECK(found[0].window.steps == 100);
  CHECK(found[0].window.slow == 10);
  // Found a window after the rule began to hold (step 410: two stops).
  CHECK(first == 510);
}

TEST_CASE(
    "membership: a member whose host agent hears nothing from it for "
    "quiet_after is silent at once, and a shorter quiet or another stream "
    "is not") {
  DetectionOptions d = Job::Defaults();  // heartbeat 500 ms, silent 5 s
  CHECK(QuietAfter(d) == absl::Milliseconds(750));
  Job job(3, d);
  for (const char* h : {"a", "b", "c"}) job.Join(h, kT0);
  const absl::Time t = kT0 + absl::Milliseconds(800);
  // Shorter than the bound, or reported on a stream that no longer
  // carries the member: nothing.
  job.m.NoteQuiet(job.ids[1], job.sinks[1].get(), absl::Milliseconds(700), t);
  FakeSink other;
  job.m.NoteQuiet(job.ids[1], &other, absl::Seconds(1), t);
  CHECK(job.Incidents(t).empty());
  job.m.NoteQuiet(job.ids[1], job.sinks[1].get(), absl::Milliseconds(760), t);
  const std::vector<Incident> inc = job.Incidents(t);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_SILENT);
  CHECK(inc[0].slot() == 1);
  CHECK(inc[0].evidence().find("host agent on b heard nothing from it") !=
        std::string::npos);
  CHECK(inc[0].time_to_detect_ms() == 760);
  // Once declared, a later report changes nothing.
  job.m.NoteQuiet(job.ids[1], job.sinks[1].get(), absl::Seconds(1), t);
  CHECK(job.Incidents(t).size() == 1);
}

TEST_CASE(
    "quiet bound: the heartbeat interval and half of it, at least 250 ms "
    "more, never over silent_after, and zero turns it off") {
  DetectionOptions d;
  CHECK(QuietAfter(d) == absl::Milliseconds(750));
  d.heartbeat_interval = absl::Milliseconds(100);
  CHECK(QuietAfter(d) == absl::Milliseconds(350));
  d.heartbeat_interval = absl::Seconds(2);
  CHECK(QuietAfter(d) == absl::Seconds(3));  // 2 + 1 s, silent_after 3 s
  d.silent_after = absl::Seconds(2);
  CHECK(QuietAfter(d) == absl::Seconds(2));
  d.quiet_after = absl::Milliseconds(400);
  CHECK(QuietAfter(d) == absl::Milliseconds(400));
  d.quiet_after = absl::ZeroDuration();
  CHECK(QuietAfter(d) == absl::ZeroDuration());
  Job job(3, [] {
    DetectionOptions o = Job::Defaults();
    o.quiet_after = absl::ZeroDuration();
    return o;
  }());
  for (const char* h : {"a", "b", "c"}) job.Join(h, kT0);
  job.m.NoteQuiet(job.ids[0], job.sinks[0].get(), absl::Seconds(2),
                  kT0 + absl::Seconds(2));
  CHECK(job.Incidents(kT0 + absl::Seconds(2)).empty());
}

TEST_CASE(
    "membership: an ack on a heartbeat stream is answered on that stream") {
  Job job(2);
  job.Join("a", kT0);
  job.Join("b", kT0);
  auto commits = [&](int i, int64_t step) {
    int n = 0;
    for (const auto& m : job.sinks[static_cast<size_t>(i)]->pushed) {
      n += m.has_committed_step() && m.committed_step() == step ? 1 : 0;
    }
    return n;
  };
  AckCheckpointRequest a;
  a.set_generation(0);
  a.set_step(3);
  a.set_member_id(job.ids[0]);
  CHECK(*job.m.AckCheckpoint(a, kT0, job.sinks[0].get()) == -1);
  CHECK(commits(0, 3) == 0);
  // The ack that completes the step: one commit message on every stream.
  a.set_member_id(job.ids[1]);
  CHECK(*job.m.AckCheckpoint(a, kT0, job.sinks[1].get()) == 3);
  CHECK(commits(0, 3) == 1);
  CHECK(commits(1, 3) == 1);
  // An ack of a step committed already (a repeat, say after a reconnect)
  // is answered with the commit on its own stream only.
  a.set_step(2);
  CHECK(*job.m.AckCheckpoint(a, kT0, job.sinks[1].get()) == 3);
  CHECK(commits(1, 3) == 2);
  CHECK(commits(0, 3) == 1);
  // Without a stream (the unary call) nothing is pushed.
  CHECK(*job.m.AckCheckpoint(a, kT0) == 3);
  CHECK(commits(1, 3) == 2);
}

TEST_CASE(
    "membership: after a controller restart members resume their slots "
    "and generation") {
  Job job(3);  // a fresh controller that knows nothing
  auto resume = [&](uint64_t id, int slot, int64_t gen) {
    RegisterRequest r;
    r.set_host("h");
    r.set_resume(true);
    r.set_member_id(id);
    r.set_slot(slot);
    r.set_generation(gen);
    return job.m.Register(r, kT0);
  };
  auto a = resume(111, 2, 4);
  REQUIRE(a.ok());
  CHECK(a->member_id() == 111);
  CHECK(a->slot() == 2);
  CHECK(a->generation() == 4);
  CHECK(resume(222, 0, 4).ok());
  // Conflicts are refused: a taken slot, a generation older than the job's.
  auto taken = resume(333, 2, 4);
  CHECK(taken.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(taken.status().message().find("member 111 holds") !=
        absl::string_view::npos);
  CHECK(resume(444, 1, 3).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // A new registrant takes the remaining slot at the adopted generation.
  RegisterRequest fresh;
  fresh.set_host("n");
  auto n = job.m.Register(fresh, kT0);
  REQUIRE(n.ok());
  CHECK(n->slot() == 1);
  CHECK(n->generation() == 4);
  CHECK(job.m.Status({}, kT0).vacant_slots() == 0);
}

TEST_CASE("membership: shrink mode renumbers the survivors in order") {
  RecoveryPolicy p;
  p.shrink = true;
  Job job(4, Job::Defaults(), p);
  for (const char* h : {"a", "b", "c", "d", "e"}) job.Join(h, kT0);
  job.m.Detach(job.ids[1], job.sinks[1].get(), false, false, "reset",
               kT0 + absl::Seconds(1));
  // The standby is not used in shrink mode.
  const MembershipUpdate* c = job.sinks[2]->LastUpdate();
  REQUIRE(c != nullptr);
  CHECK(c->generation() == 1);
  CHECK(c->world_size() == 3);
  CHECK(c->slot() == 1);
  CHECK(job.sinks[3]->LastUpdate()->slot() == 2);
  CHECK(job.sinks[0]->LastUpdate()->slot() == 0);
  CHECK(job.sinks[4]->LastUpdate()->role() == ROLE_STANDBY);
  CHECK(job.sinks[2]->GotAbortFor(1));
  StatusResponse s = job.m.Status({}, kT0 + absl::Seconds(1));
  CHECK(s.world_size() == 3);
  CHECK(s.initial_world_size() == 4);
  CHECK(s.standbys() == 1);
  CHECK(s.job_state() == JOB_RUNNING);
}

TEST_CASE(
    "membership: the world grows up to max_world with standbys that join "
    "later, once the group is built and they settled") {
  RecoveryPolicy p;
  p.max_world = 4;  // above the start's 3
  p.grow_settle = absl::Seconds(1);
  Job job(3, Job::Defaults(), p);
  for (const char* h : {"a", "b", "c"}) job.Join(h, kT0);
  for (size_t i : {0, 1, 2})
    REQUIRE(job.Beat(i, 5, kT0, 0, PHASE_COMPUTING, 0, 0).ok());
  const absl::Time t = kT0 + absl::Seconds(1);
  // No standby: slot 2's loss shrinks the world to 2 (generation 1).
  job.m.Detach(job.ids[2], job.sinks[2].get(), false, false, "reset", t);
  REQUIRE(job.m.world_size() == 2);
  job.generation = 1;
  job.Join("d", t);  // a node added: its standbys
  // Not while the survivors rebuild generation 1's group.
  job.m.Scan(t + absl::Milliseconds(1200));
  CHECK(job.m.world_size() == 2);
  for (size_t i : {0, 1}) {
    REQUIRE(
        job.Beat(i, 5, t + absl::Milliseconds(1200), 0, PHASE_COMPUTING, 0, 1)
            .ok());
  }
  REQUIRE(job.Beat(3, -1, t + absl::Milliseconds(1200)).ok());
  job.Join("e", t + absl::Milliseconds(1300));
  // Not before the newest standby it would take joined grow_settle ago.
  job.m.Scan(t + absl::Milliseconds(1500));
  CHECK(job.m.world_size() == 2);
  job.m.Scan(t + absl::Milliseconds(2400));
  CHECK(job.m.world_size() == 4);
  // The standby that waited longest takes slot 2, the next slot 3; the
  // survivors keep theirs and abort generation 1 without a failed slot.
  for (size_t i : {3, 4}) {
    const MembershipUpdate* u = job.sinks[i]->LastUpdate();
    REQUIRE(u != nullptr);
    CHECK(u->generation() == 2);
    CHECK(u->world_size() == 4);
    CHECK(u->role() == ROLE_WORKER);
    CHECK(u->slot() == static_cast<int>(i) - 1);
  }
  CHECK(job.sinks[0]->LastUpdate()->slot() == 0);
  CHECK(job.sinks[1]->LastUpdate()->slot() == 1);
  bool grew = false;
  for (const auto& m : job.sinks[0]->pushed) {
    grew = grew || (m.has_abort() && m.abort().generation() == 1 &&
                    m.abort().failed_slot() == -1 &&
                    m.abort().reason().find("the world grows from 2 to 4") !=
                        std::string::npos);
  }
  CHECK(grew);
  // At max_world a standby that joins stays one.
  job.Join("f", t + absl::Milliseconds(2500));
  job.generation = 2;
  for (size_t i : {0, 1, 3, 4}) {
    REQUIRE(
        job.Beat(i, 5, t + absl::Seconds(3), 0, PHASE_COMPUTING, 0, 2).ok());
  }
  job.m.Scan(t + absl::Seconds(4));
  StatusResponse s = job.m.Status({}, t + absl::Seconds(4));
  CHECK(s.world_size() == 4);
  CHECK(s.max_world() == 4);
  CHECK(s.standbys() == 1);
  CHECK(s.generation() == 2);
}

TEST_CASE(
    "membership: replace mode shrinks without a standby and stops below the "
    "minimum world") {
  RecoveryPolicy p;
  p.min_world = 2;
  Job job(3, Job::Defaults(), p);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
  absl::Time t = kT0 + absl::Seconds(1);
  job.m.Detach(job.ids[0], job.sinks[0].get(), false, false, "reset", t);
  // The standby takes slot 0; the world keeps 3 slots.
  CHECK(job.sinks[3]->LastUpdate()->slot() == 0);
  CHECK(job.sinks[3]->LastUpdate()->role() == ROLE_WORKER);
  CHECK(job.m.world_size() == 3);
  job.m.Detach(job.ids[1], job.sinks[1].get(), false, false, "reset", t);
  // No standby left: slot 2 becomes slot 1 of 2. The push counts the
  // slots removed and does not list every renumbered one.
  CHECK(job.sinks[2]->LastUpdate()->slot() == 1);
  CHECK(job.sinks[2]->LastUpdate()->world_size() == 2);
  CHECK(job.sinks[2]->LastUpdate()->slots_removed() == 1);
  CHECK(job.sinks[2]->LastUpdate()->changes_size() == 0);
  CHECK(job.sinks[2]->End() == nullptr);
  const size_t before = job.sinks[3]->pushed.size();
  job.m.Detach(job.ids[2], job.sinks[2].get(), false, false, "reset", t);
  // The last worker gets the stop, never a world of 1 to train in.
  for (size_t i = before; i < job.sinks[3]->pushed.size(); ++i) {
    CHECK_FALSE(job.sinks[3]->pushed[i].has_membership());
  }
  const JobEnd* end = job.sinks[3]->End();
  REQUIRE(end != nullptr);
  CHECK(end->state() == JOB_STOPPED);
  CHECK_THAT(end->reason(), Catch::Contains("below the minimum world size 2"));
  CHECK(job.m.job_state() == JOB_STOPPED);
  RegisterRequest late;
  late.set_host("z");
  auto r = job.m.Register(late, t);
  CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "membership: a communicator failure report rebuilds the group and fences "
    "nobody") {
  Job job(2);
  job.Join("a", kT0);
  job.Join("b", kT0);
  ReportFailureRequest req;
  req.set_member_id(job.ids[0]);
  req.set_generation(0);
  req.set_peer_slot(-1);
  req.set_reason("injected fail-op");
  auto r = job.m.ReportFailure(req, kT0);
  REQUIRE(r.ok());
  CHECK(*r);
  // The second rank's report of the same failure comes too late.
  req.set_member_id(job.ids[1]);
  CHECK(job.m.ReportFailure(req, kT0).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  StatusResponse s = job.m.Status({}, kT0);
  CHECK(s.generation() == 1);
  CHECK(s.world_size() == 2);
  CHECK(s.dead() == 0);
  auto inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_COMM_FAILED);
  CHECK(job.sinks[1]->GotAbortFor(-1));
  CHECK(job.sinks[1]->LastUpdate()->generation() == 1);
  req.set_peer_slot(-2);
  req.set_generation(1);
  CHECK(job.m.ReportFailure(req, kT0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "membership: the job finishes when every worker has finished and a "
    "worker that leaves early is lost") {
  Job job(2);
  for (const char* h : {"a", "b", "c"}) job.Join(h, kT0);
  // Each acks step 5: it commits, and the next generation carries it.
  for (size_t i = 0; i < 2; ++i) {
    AckCheckpointRequest ack;
    ack.set_member_id(job.ids[i]);
    ack.set_step(5);
    REQUIRE(job.m.AckCheckpoint(ack, kT0).ok());
  }
  job.m.Detach(job.ids[0], job.sinks[0].get(), true, false, "bye", kT0);
  auto inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_LEFT);
  const MembershipUpdate* u = job.sinks[2]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->slot() == 0);
  CHECK(u->committed_step() == 5);
  job.generation = 1;
  job.m.Detach(job.ids[1], job.sinks[1].get(), true, true, "done", kT0);
  CHECK(job.sinks[2]->End() == nullptr);  // slot 0 still runs
  job.m.Detach(job.ids[2], job.sinks[2].get(), true, true, "done", kT0);
  CHECK(job.m.job_state() == JOB_FINISHED);
  CHECK(job.Incidents(kT0).size() == 1);
}

TEST_CASE("membership: a resume after a restart adopts a shrunken world") {
  Job job(4);
  RegisterRequest r;
  r.set_host("a");
  r.set_resume(true);
  r.set_member_id(77);
  r.set_slot(1);
  r.set_generation(3);
  r.set_world_size(2);
  auto resp = job.m.Register(r, kT0);
  REQUIRE(resp.ok());
  CHECK(resp->world_size() == 2);
  CHECK(resp->generation() == 3);
  r.set_member_id(78);
  r.set_slot(2);
  CHECK(job.m.Register(r, kT0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "membership: a member that does not come to a recovery's rendezvous is "
    "left out once the others are there") {
  DetectionOptions d = Job::Defaults();
  d.silent_after = absl::Seconds(30);  // far beyond the bounds below
  d.rendezvous_grace = absl::Seconds(1);
  d.rendezvous_timeout = absl::Seconds(10);
  Job job(4, d);
  for (const char* h : {"a", "b", "c", "d", "e"}) job.Join(h, kT0);
  // Slot 3 crashes: generation 1, the standby (member 4) takes slot 3.
  job.m.Detach(job.ids[3], job.sinks[3].get(), false, false, "reset", kT0);
  job.generation = 1;
  absl::Time t = kT0 + absl::Milliseconds(10);
  // Slot 2 froze before it heard of generation 1: no heartbeat after it.
  // Slot 1 heard of it (its heartbeat carries generation 1) but its
  // training thread has not reached the rendezvous.
  for (size_t i : {0, 4})
    REQUIRE(job.Beat(i, 9, t, 0, PHASE_RECOVERING, 0, 1).ok());
  REQUIRE(job.Beat(1, 9, t, 0, PHASE_COMPUTING).ok());
  // Not yet: the others became ready less than the grace ago.
  job.m.Scan(t + absl::Milliseconds(900));
  CHECK(job.Incidents(t).size() == 1);
  // Slot 1 keeps heartbeating; slot 2 is silent. After the grace, only
  // slot 2 is left out, long before its silent threshold.
  REQUIRE(
      job.Beat(1, 9, t + absl::Milliseconds(1000), 0, PHASE_COMPUTING).ok());
  job.m.Scan(t + absl::Milliseconds(1100));
  auto inc = job.Incidents(t + absl::Milliseconds(1100));
  REQUIRE(inc.size() == 2);
  CHECK(inc[1].kind() == INCIDENT_ABSENT);
  CHECK(inc[1].slot() == 2);
  CHECK(inc[1].member_id() == job.ids[2]);
  CHECK(inc[1].evidence().find(
            "did not come to the rendezvous of generation 1") !=
        std::string::npos);
  CHECK(job.sinks[0]->GotAbortFor(2));
  CHECK(job.m.Status({}, t).world_size() == 3);  // no standby left: shrunk
  // Generation 2: slot 2's member is gone. Slot 1 (now slot 1 of 3) still
  // heartbeats but never comes: left out after the longer timeout only.
  job.generation = 2;
  const absl::Time t2 = t + absl::Milliseconds(1200);
  for (size_t i : {0, 4})
    REQUIRE(job.Beat(i, 9, t2, 0, PHASE_RECOVERING, 0, 2).ok());
  for (int k = 1; k <= 11; ++k) {
    const absl::Time now = t2 + absl::Seconds(k) - absl::Milliseconds(50);
    REQUIRE(job.Beat(1, 9, now, 0, PHASE_COMPUTING).ok());
    REQUIRE(job.Beat(0, 9, now, 0, PHASE_RECOVERING, 0, 2).ok());
    REQUIRE(job.Beat(4, 9, now, 0, PHASE_RECOVERING, 0, 2).ok());
    job.m.Scan(now);
    CHECK(job.Incidents(now).size() == (k <= 10 ? 2u : 3u));
  }
  inc = job.Incidents(t2 + absl::Seconds(11));
  REQUIRE(inc.size() == 3);
  CHECK(inc[2].kind() == INCIDENT_ABSENT);
  CHECK(inc[2].member_id() == job.ids[1]);
}

TEST_CASE("membership: the first generation's rendezvous has no bound") {
  // Workers set up (load a model, compile) between registering and their
  // first rendezvous, at their own pace: only recoveries are bounded.
  DetectionOptions d = Job::Defaults();
  d.silent_after = absl::Seconds(30);
  d.rendezvous_grace = absl::Seconds(1);
  Job job(3, d);
  for (const char* h : {"a", "b", "c"}) job.Join(h, kT0);
  for (size_t i : {0, 1})
    REQUIRE(job.Beat(i, -1, kT0, 0, PHASE_IDLE, 0, 0).ok());
  job.m.Scan(kT0 + absl::Seconds(20));
  CHECK(job.Incidents(kT0 + absl::Seconds(20)).empty());
}

namespace {

// Runs steps `first` to `first + steps - 1` of four workers in `job`: step
// s's work on slot i is
// `work(s, i)` ms; every slot's step takes the longest work plus 2 ms of
// transfer, and the rest of it is spent inside the all-reduce. With
// `arrival`, slot i issued its collectives `arrival(s, i)` ms into step s.
void RunSteps(Job& job, int steps, const std::function<double(int, int)>& work,
              absl::Time* t, int first = 0,
              const std::function<double(int, int)>& arrival = nullptr) {
  for (int step = first; step < first + steps; ++step) {
    std::vector<int64_t> us(4);
    int64_t longest = 0;
    for (int i = 0; i < 4; ++i) {
      us[i] = static_cast<int64_t>(work(step, i) * 1000);
      longest = std::max(longest, us[i]);
    }
    const int64_t step_us = longest + 2000;
    *t += absl::Microseconds(step_us);
    for (size_t i = 0; i < 4; ++i) {
      HeartbeatRequest h;
      h.set_member_id(job.ids[i]);
      h.set_generation(job.generation);
      h.mutable_report()->set_step(step);
      h.mutable_report()->set_phase(PHASE_COMPUTING);
      h.mutable_report()->set_last_step_us(step_us);
      h.mutable_report()->set_collective_us(step_us - us[i]);
      if (arrival) {
        h.mutable_report()->set_arrival_us(
            static_cast<int64_t>(arrival(step, static_cast<int>(i)) * 1000));
      }
      h.mutable_report()->set_step_end(true);
      REQUIRE(job.m.Heartbeat(h, job.sinks[i].get(), *t).ok());
    }
    job.m.Scan(*t);
  }
}

int Stragglers(const std::vector<Incident>& incidents) {
  int n = 0;
  for (const Incident& i : incidents) n += i.kind() == INCIDENT_STRAGGLER;
  return n;
}

}  // namespace

TEST_CASE(
    "membership: a worker whose own work is twice its peers' is reported a "
    "straggler once and nobody is fenced") {
  Job job(4);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
  absl::Time t = kT0;
  // Seven slow steps are not enough (the window is 8).
  RunSteps(
      job, 7, [](int, int i) { return i == 2 ? 60.0 : 30.0; }, &t);
  CHECK(Stragglers(job.Incidents(t)) == 0);
  RunSteps(
      job, 30, [](int, int i) { return i == 2 ? 60.0 : 30.0; }, &t, 7);
  const std::vector<Incident> inc = job.Incidents(t);
  REQUIRE(Stragglers(inc) == 1);
  CHECK(inc[0].slot() == 2);
  CHECK_FALSE(inc[0].evicted());
  CHECK_FALSE(inc[0].has_diagnosis());
  CHECK(inc[0].evidence().find("(2.00x)") != std::string::npos);
  const StatusResponse s = job.m.Status({}, t);
  CHECK(s.generation() == 0);
  CHECK(s.alive() == 4);
}

TEST_CASE(
    "membership: a worker stopped from outside part of the time (slow on "
    "every other step) is reported a straggler") {
  // A SIGSTOP/SIGCONT duty cycle of 60 ms in 100 (measured on the dp
  // trainer with 20 ms steps): the stopped worker's step after each stop
  // takes 80 ms, the one between them 20 ms; never two slow steps in a row.
  Job job(4);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
  absl::Time t = kT0;
  RunSteps(
      job, 40,
      [](int step, int i) { return i == 3 && step % 2 == 1 ? 80.0 : 20.0; },
      &t);
  const std::vector<Incident> inc = job.Incidents(t);
  REQUIRE(Stragglers(inc) == 1);
  CHECK(inc[0].slot() == 3);
  // Steps of 22 and 82 ms: the window spans a second of the job's median
  // step (DetectionOptions::straggler_span), 13 steps, 7 of them slow.
  CHECK(inc[0].evidence().find("(2.62x) over the last 13 steps") !=
        std::string::npos);
  CHECK(inc[0].evidence().find("slow on 7 of them") != std::string::npos);
}

TEST_CASE(
    "membership: a worker that issues its collectives late is reported a "
    "straggler though its own work looks like its peers'") {
  // Its slowness falls inside its collective time (its op thread is
  // throttled with it): every worker's step time less collective time is
  // 10 ms, but slot 3 issues its collectives 11 ms into the step, the
  // others 1 ms (StepReport::arrival_us).
  Job job(4);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
  absl::Time t = kT0;
  RunSteps(
      job, 180, [](int, int) { return 10.0; }, &t, 0,
      [](int, int i) { return i == 3 ? 11.0 : 1.0; });
  const std::vector<Incident> inc = job.Incidents(t);
  REQUIRE(Stragglers(inc) == 1);
  CHECK(inc[0].slot() == 3);
  // 10 ms of work plus 10 ms later than the median worker.
  CHECK(inc[0].evidence().find("20.0 ms a step against its peers' 10.0 ms") !=
        std::string::npos);
}

TEST_CASE(
    "membership: a worker's single long steps far apart (a pause, a "
    "checkpoint write) raise no straggler") {
  Job job(4);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
  absl::Time t = kT0;
  RunSteps(
      job, 60,
      [](int step, int i) {
        return i == 1 && (step == 20 || step == 45) ? 400.0 : 30.0;
      },
      &t);
  CHECK(Stragglers(job.Incidents(t)) == 0);
}

TEST_CASE(
    "membership: uneven steps that are long on every worker and a 1.2x "
    "slowdown raise no straggler") {
  Job job(4);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
  absl::Time t = kT0;
  // An RL job: every 7th step is a rollout 8x as long, on every worker,
  // with 5 % noise per worker; one worker is 1.2x slower throughout.
  RunSteps(
      job, 300,
      [](int step, int i) {
        const double base = step % 7 == 6 ? 240.0 : 30.0;
        const double noise =
            1.0 + 0.05 * (((step * 7 + i * 13) % 21) - 10) / 10;
        return base * noise * (i == 1 ? 1.2 : 1.0);
      },
      &t);
  CHECK(Stragglers(job.Incidents(t)) == 0);
}

TEST_CASE(
    "membership: under the replace policy a straggler is replaced once it "
    "has been slow for 16 steps after its report and only while the budget "
    "and a standby last") {
  RecoveryPolicy p;
  p.replace_stragglers = true;
  p.straggler_budget = 1;
  Job job(4, Job::Defaults(), p);
  for (const char* h : {"a", "b", "c", "d", "spare"}) job.Join(h, kT0);
  absl::Time t = kT0;
  auto slot2_slow = [](int, int i) { return i == 2 ? 90.0 : 30.0; };
  // Steps of 92 ms: the window is 11 steps (a second). The rule holds
  // from step 10 on; the report comes a window later (step 21), the
  // replacement 16 steps after that (step 37).
  RunSteps(job, 21, slot2_slow, &t);
  CHECK(Stragglers(job.Incidents(t)) == 0);
  RunSteps(job, 16, slot2_slow, &t, 21);
  std::vector<Incident> inc = job.Incidents(t);
  REQUIRE(Stragglers(inc) == 1);  // reported at 21, not replaced before 37
  CHECK_FALSE(inc[0].evicted());
  RunSteps(job, 1, slot2_slow, &t, 37);
  inc = job.Incidents(t);
  REQUIRE(Stragglers(inc) == 2);
  CHECK(inc[1].slot() == 2);
  CHECK(inc[1].evicted());
  CHECK(inc[1].evidence().find("a standby replaces it (1 of the job's "
                               "budget of 1)") != std::string::npos);
  CHECK(job.m.Status({}, t).generation() == 1);
  CHECK(job.sinks[2]->is_closed);  // fenced
}

TEST_CASE(
    "membership: under the replace policy a straggler is only reported with "
    "no standby or no budget left") {
  for (const bool spare : {false, true}) {
    RecoveryPolicy p;
    p.replace_stragglers = true;
    p.straggler_budget = spare ? 0 : 2;  // with a spare: no budget
    Job job(4, Job::Defaults(), p);
    for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);
    if (spare) job.Join("spare", kT0);
    absl::Time t = kT0;
    RunSteps(
        job, 40, [](int, int i) { return i == 2 ? 90.0 : 30.0; }, &t);
    const std::vector<Incident> inc = job.Incidents(t);
    REQUIRE(Stragglers(inc) == 1);
    CHECK_FALSE(inc[0].evicted());
    CHECK(job.m.Status({}, t).generation() == 0);
  }
}

TEST_CASE(
    "membership: generations opened close together are pushed as one after "
    "the first") {
  DetectionOptions d = Job::Defaults();
  d.push_merge = absl::Milliseconds(50);
  Job job(6, d);
  // Six workers and four standbys, all on one sink each.
  for (int i = 0; i < 10; ++i) job.Join("h" + std::to_string(i), kT0);
  const absl::Time t = kT0 + absl::Seconds(1);
  // A host's four workers (slots 0-3) lost at once.
  for (size_t i = 0; i < 4; ++i) {
    job.m.Detach(job.ids[i], job.sinks[i].get(), false, false, "reset", t);
  }
  CHECK(job.m.Status({}, t).generation() == 4);
  // A survivor has heard the first generation at once, and nothing else.
  FakeSink& survivor = *job.sinks[5];
  int updates = 0;
  for (const auto& msg : survivor.pushed) updates += msg.has_membership();
  CHECK(updates == 1);
  CHECK(survivor.LastUpdate()->generation() == 1);
  CHECK(job.m.PushDue() == t + absl::Milliseconds(50));
  job.m.FlushPushes(t + absl::Milliseconds(20));  // not due yet
  CHECK(survivor.LastUpdate()->generation() == 1);
  job.m.FlushPushes(t + absl::Milliseconds(50));
  CHECK(job.m.PushDue() == absl::InfiniteFuture());
  updates = 0;
  for (const auto& msg : survivor.pushed) updates += msg.has_membership();
  CHECK(updates == 2);
  // The merged push: the newest generation, every slot taken over since
  // the first push, and the abort of the generation the members are in.
  const HeartbeatResponse& last = survivor.pushed.back();
  REQUIRE(last.has_membership());
  CHECK(last.membership().generation() == 4);
  CHECK(last.membership().changes_size() == 3);
  CHECK(last.abort().generation() == 1);
  // Each standby learns its own slot.
  std::set<int> slots;
  for (size_t i = 6; i < 10; ++i) {
    const MembershipUpdate* u = job.sinks[i]->LastUpdate();
    REQUIRE(u != nullptr);
    CHECK(u->role() == ROLE_WORKER);
    slots.insert(u->slot());
  }
  CHECK(slots == std::set<int>{0, 1, 2, 3});
  // After a quiet spell, the next generation goes at once again.
  const absl::Time later = t + absl::Seconds(1);
  job.generation = 4;
  REQUIRE(job.Beat(4, 0, later).ok());
  job.m.Detach(job.ids[4], job.sinks[4].get(), false, false, "reset", later);
  CHECK(survivor.LastUpdate()->generation() == 5);
}

TEST_CASE(
    "membership: among 3000 workers the one whose work is twice its peers' "
    "is the only straggler") {
  // Each worker's own work differs a little from the others' (so the
  // median of a worker's peers depends on where its own value sits).
  constexpr int kWorkers = 3000;
  Job job(kWorkers);
  for (int i = 0; i < kWorkers; ++i) job.Join("h" + std::to_string(i), kT0);
  absl::Time t = kT0;
  // Steps of 100 ms: a window of 10 steps, held for 10 more.
  for (int step = 0; step < 20; ++step) {
    t += absl::Milliseconds(100);
    for (size_t i = 0; i < kWorkers; ++i) {
      const int64_t work = i == 1234 ? 60000 : 30000 + static_cast<int64_t>(i);
      HeartbeatRequest h;
      h.set_member_id(job.ids[i]);
      h.mutable_report()->set_step(step);
      h.mutable_report()->set_phase(PHASE_COMPUTING);
      h.mutable_report()->set_last_step_us(100000);
      h.mutable_report()->set_collective_us(100000 - work);
      h.mutable_report()->set_step_end(true);
      REQUIRE(job.m.Heartbeat(h, job.sinks[i].get(), t).ok());
    }
    job.m.Scan(t);
  }
  const std::vector<Incident> inc = job.Incidents(t);
  REQUIRE(Stragglers(inc) == 1);
  CHECK(inc[0].slot() == 1234);
  // Against its peers' median (30000 + 1499 or 1500 us, not its own).
  CHECK(inc[0].evidence().find("against its peers' 31.5 ms") !=
        std::string::npos);
}

namespace {

// A report of generation `gen` by member `i` that its communicator failed,
// naming `unreachable` slots it could not reach on the data network.
absl::StatusOr<bool> ReportUnreachable(Job& job, size_t i, int64_t gen,
                                       std::vector<int> unreachable,
                                       absl::Time now) {
  ReportFailureRequest req;
  req.set_member_id(job.ids[i]);
  req.set_generation(gen);
  req.set_peer_slot(-1);
  req.set_reason("connecting to rank: No route to host");
  for (int u : unreachable) req.add_unreachable_slots(u);
  return job.m.ReportFailure(req, now);
}

// How many members were fenced by `now`; each must be on `host` and fenced
// with `evidence` in its incident's evidence.
int Fenced(Job& job, absl::Time now, const std::string& host,
           const std::string& evidence) {
  int fenced = 0;
  for (const Incident& i : job.Incidents(now)) {
    if (!i.evicted()) continue;
    ++fenced;
    CHECK(i.host() == host);
    CHECK(i.evidence().find(evidence) != std::string::npos);
  }
  return fenced;
}

}  // namespace

TEST_CASE(
    "membership: a host that members on two other hosts could not reach is "
    "fenced (from a late report too) and its standby takes no slot") {
  Job job(4);
  // Slots 0, 1 on a; 2 on b; 3 on c. Standbys on b (the cut host) and c.
  for (const char* h : {"a", "a", "b", "c", "b", "c"}) job.Join(h, kT0);
  // The first report rebuilds the group (one member's word fences nobody).
  auto r = ReportUnreachable(job, 0, 0, {2}, kT0);
  REQUIRE(r.ok());
  CHECK(job.m.Status({}, kT0).generation() == 1);
  CHECK(job.Incidents(kT0).back().kind() == INCIDENT_COMM_FAILED);
  // A second host's member lost b too; its report comes late (generation
  // 0), and is evidence all the same.
  r = ReportUnreachable(job, 3, 0, {2}, kT0 + absl::Milliseconds(5));
  REQUIRE(r.ok());
  CHECK(*r);
  auto inc = job.Incidents(kT0);
  REQUIRE(inc.back().kind() == INCIDENT_UNREACHABLE);
  CHECK(inc.back().slot() == 2);
  CHECK(inc.back().host() == "b");
  CHECK(inc.back().evidence().find(
            "host cut off: host b: members on a, c failed to reach it") !=
        std::string::npos);
  // Slot 2 went to the standby on c, not to the one on b.
  StatusRequest with_members;
  with_members.set_include_members(true);
  StatusResponse s = job.m.Status(with_members, kT0);
  bool found = false;
  for (const MemberInfo& m : s.members()) {
    if (m.role() == ROLE_WORKER && m.slot() == 2 && m.state() == STATE_ALIVE) {
      CHECK(m.host() == "c");
      CHECK(m.member_id() == job.ids[5]);
      found = true;
    }
  }
  CHECK(found);
  // Nobody on a or c was fenced.
  for (const Incident& i : job.Incidents(kT0)) {
    if (i.evicted()) CHECK(i.host() == "b");
  }
}

TEST_CASE(
    "membership: the two sides of a host cut off are not taken for a link "
    "between equals before a third host had time to report") {
  // Slots 0-1 on h0, 2-3 on h1 (cut off), 4-5 on h2; a standby on h2.
  Job job(6);
  for (const char* h : {"h0", "h0", "h1", "h1", "h2", "h2", "h2"}) {
    job.Join(h, kT0);
  }
  // h0 and h1 report each other first: alone, that is the link between
  // two equal hosts, and a side would be picked by name.
  REQUIRE(ReportUnreachable(job, 0, 0, {2, 3}, kT0).ok());
  // (A late report of generation 0: refused as such, its evidence kept.)
  (void)ReportUnreachable(job, 2, 0, {0, 1}, kT0 + absl::Milliseconds(100));
  for (const Incident& i : job.Incidents(kT0)) CHECK_FALSE(i.evicted());
  // h2's word comes a second later: h1 is the host cut off.
  auto r = ReportUnreachable(job, 4, 0, {2, 3}, kT0 + absl::Seconds(1));
  REQUIRE(r.ok());
  CHECK(*r);
  CHECK(Fenced(job, kT0, "h1", "host cut off: host h1") == 2);
}

TEST_CASE(
    "membership: a link between two equal hosts is acted on once the other "
    "hosts had time to report and did not") {
  Job job(4);
  for (const char* h : {"a", "a", "b", "b", "c"})
    job.Join(h, kT0);  // c: standby
  REQUIRE(ReportUnreachable(job, 0, 0, {2, 3}, kT0).ok());
  (void)ReportUnreachable(job, 2, 0, {0, 1}, kT0 + absl::Milliseconds(50));
  for (const Incident& i : job.Incidents(kT0)) CHECK_FALSE(i.evicted());
  // The rebuilt group fails the same way past the settle time.
  const absl::Time later = kT0 + Job::Defaults().link_settle;
  auto r = ReportUnreachable(job, 0, 1, {2, 3}, later);
  REQUIRE(r.ok());
  CHECK(*r);
  // b: the later name.
  CHECK(Fenced(job, later, "b", "link: hosts a and b") == 2);
}

namespace {

// Slots 0-1 on h0, 2-3 on h1, 4-5 on h2, a standby on h2 (`job`: 6
// slots). Members on h0 and h2 report that they lost slot 2, and nobody
// else: alone, slot 2's NIC. Nobody is fenced yet.
void NameSlotTwoFromTwoHosts(Job& job) {
  for (const char* h : {"h0", "h0", "h1", "h1", "h2", "h2", "h2"}) {
    job.Join(h, kT0);
  }
  REQUIRE(ReportUnreachable(job, 1, 0, {2}, kT0).ok());
  (void)ReportUnreachable(job, 4, 0, {2}, kT0 + absl::Milliseconds(20));
  CHECK(Fenced(job, kT0, "", "") == 0);
}

}  // namespace

TEST_CASE(
    "membership: one member of a host named before its other members could "
    "be reported is not taken for a bad NIC") {
  Job job(6);
  NameSlotTwoFromTwoHosts(job);
  // Slot 3's neighbours report it 400 ms later (a loaded machine): h1 is
  // the host cut off, and both of its workers go in one verdict.
  auto r = ReportUnreachable(job, 5, 1, {3}, kT0 + absl::Milliseconds(400));
  REQUIRE(r.ok());
  CHECK(*r);
  CHECK(Fenced(job, kT0, "h1", "host cut off: host h1") == 2);
}

TEST_CASE(
    "membership: a bad NIC is acted on once the other members of its host "
    "had time to be reported and were not") {
  Job job(6);
  NameSlotTwoFromTwoHosts(job);
  // The rebuilt group fails the same way past the settle time.
  const absl::Time later = kT0 + Job::Defaults().link_settle;
  auto r = ReportUnreachable(job, 0, 1, {2}, later);
  REQUIRE(r.ok());
  CHECK(*r);
  CHECK(Fenced(job, later, "h1", "bad NIC: slot 2 on h1") == 1);
  for (const Incident& i : job.Incidents(later)) {
    if (i.evicted()) CHECK(i.slot() == 2);
  }
}

TEST_CASE("membership: out-of-range unreachable slots are refused by name") {
  Job job(2);
  job.Join("a", kT0);
  job.Join("b", kT0);
  auto r = ReportUnreachable(job, 0, 0, {5}, kT0);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("unreachable slot 5") != std::string::npos);
}

TEST_CASE(
    "membership: rebuilds that commit nothing and name nobody are bounded "
    "and the job stops with a report instead of looping") {
  RecoveryPolicy p;
  p.max_unexplained_rebuilds = 3;
  Job job(2, Job::Defaults(), p);
  job.Join("a", kT0);
  job.Join("b", kT0);
  auto fail = [&](int64_t gen) {
    return ReportUnreachable(job, 0, gen, {}, kT0);
  };
  // Two rebuilds, then a commit: the count starts again.
  REQUIRE(fail(0).ok());
  REQUIRE(fail(1).ok());
  for (size_t i = 0; i < 2; ++i) {
    AckCheckpointRequest ack;
    ack.set_member_id(job.ids[i]);
    ack.set_generation(2);
    ack.set_step(4);
    REQUIRE(job.m.AckCheckpoint(ack, kT0).ok());
  }
  for (int64_t g = 2; g < 5; ++g) {
    auto r = fail(g);
    REQUIRE(r.ok());
    CHECK(*r);
  }
  CHECK(job.sinks[1]->End() == nullptr);
  // The fourth in a row stops the job, saying why and how to resume.
  auto r = fail(5);
  REQUIRE(r.ok());
  CHECK_FALSE(*r);
  const JobEnd* end = job.sinks[1]->End();
  REQUIRE(end != nullptr);
  CHECK(end->state() == JOB_STOPPED);
  CHECK(end->reason().find("rebuilt 3 times in a row") != std::string::npos);
  CHECK(end->reason().find("disk tier") != std::string::npos);
}

TEST_CASE("membership: at the loop bound one member's evidence is acted on") {
  RecoveryPolicy p;
  p.max_unexplained_rebuilds = 2;
  Job job(3, Job::Defaults(), p);
  for (const char* h : {"a", "b", "c", "d"}) job.Join(h, kT0);  // d: standby
  // Only slot 0 ever reports, and it lost b and c: below the bound one
  // member's word fences nobody; at the bound it is the best evidence
  // (host a, its only member, lost everyone), and it is acted on.
  for (int64_t g = 0; g < 2; ++g) {
    REQUIRE(ReportUnreachable(job, 0, g, {1, 2}, kT0).ok());
    CHECK(job.Incidents(kT0).back().kind() == INCIDENT_COMM_FAILED);
  }
  auto r = ReportUnreachable(job, 0, 2, {1, 2}, kT0);
  REQUIRE(r.ok());
  CHECK(*r);
  const Incident last = job.Incidents(kT0).back();
  CHECK(last.kind() == INCIDENT_UNREACHABLE);
  CHECK(last.slot() == 0);
  CHECK(last.evidence().find("host cut off: host a") != std::string::npos);
  CHECK(job.sinks[1]->End() == nullptr);
  // The standby (on d) took slot 0.
  CHECK(job.sinks[3]->LastUpdate()->slot() == 0);
}

// ---- Packet loss on one host's data link (LossLedger) -----------------------

namespace {

// Three hosts of two workers each: slots 0-1 on h0, 2-3 on h1, 4-5 on h2.
const std::vector<std::string> kLossHosts = {"h0", "h0", "h1",
                                             "h1", "h2", "h2"};

google::protobuf::RepeatedPtrField<PeerCount> Counts(
    const std::map<int, int64_t>& by_peer) {
  google::protobuf::RepeatedPtrField<PeerCount> out;
  for (const auto& [slot, count] : by_peer) {
    PeerCount* c = out.Add();
    c->set_slot(slot);
    c->set_count(count);
  }
  return out;
}

// Every slot reports twice, 1 s apart: first 1 segment to each peer, then
// 1 more than the segments it retransmitted since to each peer,
// `lossy(from, to)`.
LossLedger Fed(const std::function<int64_t(int, int)>& lossy) {
  LossLedger l;
  for (int round = 0; round < 2; ++round) {
    for (int s = 0; s < 6; ++s) {
      std::map<int, int64_t> c;
      for (int p = 0; p < 6; ++p) {
        if (p != s) c[p] = 1 + (round == 1 ? lossy(s, p) : 0);
      }
      l.Note(s, 3, Counts(c), kT0 + absl::Seconds(round));
    }
  }
  return l;
}

bool OnH1(int slot) { return slot == 2 || slot == 3; }

}  // namespace

TEST_CASE(
    "loss: the host whose connections to every other host retransmit, while "
    "the others' do not, is named with its workers") {
  const LossLedger l =
      Fed([](int s, int p) { return OnH1(s) != OnH1(p) ? 15 : 0; });
  auto v = l.Decide(kLossHosts, kT0 + absl::Seconds(1), absl::Seconds(2), 20);
  REQUIRE(v.has_value());
  CHECK(v->host == "h1");
  CHECK(v->slots == std::vector<int>{2, 3});
  CHECK_THAT(v->evidence,
             Catch::Contains("the data link of its host h1 loses packets"));
  CHECK_THAT(v->evidence, Catch::Contains("120 with h0, 120 with h2"));
  // Below the floor: nothing.
  CHECK_FALSE(
      l.Decide(kLossHosts, kT0 + absl::Seconds(1), absl::Seconds(2), 200)
          .has_value());
  // Outside the window: the growth before it does not count.
  CHECK_FALSE(
      l.Decide(kLossHosts, kT0 + absl::Seconds(10), absl::Seconds(2), 20)
          .has_value());
}

TEST_CASE(
    "loss: loss between one pair of hosts, or everywhere, or with two hosts "
    "names no host") {
  const LossLedger pair = Fed([](int s, int p) {
    return (s < 2 && p >= 4) || (s >= 4 && p < 2) ? 40 : 0;
  });
  CHECK_FALSE(
      pair.Decide(kLossHosts, kT0 + absl::Seconds(1), absl::Seconds(2), 20)
          .has_value());
  const LossLedger everywhere = Fed([](int s, int p) {
    return kLossHosts[static_cast<size_t>(s)] !=
                   kLossHosts[static_cast<size_t>(p)]
               ? 40
               : 0;
  });
  CHECK_FALSE(
      everywhere
          .Decide(kLossHosts, kT0 + absl::Seconds(1), absl::Seconds(2), 20)
          .has_value());
  const LossLedger two =
      Fed([](int s, int p) { return s < 3 != p < 3 ? 40 : 0; });
  CHECK_FALSE(two.Decide({"a", "a", "a", "b", "b", "b"}, kT0 + absl::Seconds(1),
                         absl::Seconds(2), 20)
                  .has_value());
  // Counts of an older generation than the newest seen are dropped.
  LossLedger l = Fed([](int s, int p) { return OnH1(s) != OnH1(p) ? 15 : 0; });
  l.Note(0, 4, Counts({}), kT0 + absl::Seconds(1));
  CHECK_FALSE(l.Decide(kLossHosts, kT0 + absl::Seconds(1), absl::Seconds(2), 20)
                  .has_value());
}

namespace {

// Six workers, two on each of h0, h1 and h2 (kLossHosts), beat every
// 100 ms for `beats` beats from `*now`. A beat ends a step of 100 ms
// unless `stalled`; at a step's end a slot's count to each peer across
// h1's link grows by `growth` (at the first step after a stall by
// `resume_jump`).
void LossBeats(Job& job, absl::Time* now, int beats, int64_t* step,
               std::map<int, std::map<int, int64_t>>* counts, int64_t growth,
               bool stalled = false, int64_t resume_jump = 0) {
  for (int b = 0; b < beats; ++b) {
    *now += absl::Milliseconds(100);
    if (!stalled) ++*step;
    for (int s = 0; s < 6; ++s) {
      if (!stalled) {
        for (int p = 0; p < 6; ++p) {
          if (OnH1(s) != OnH1(p))
            (*counts)[s][p] += b == 0 ? resume_jump + growth : growth;
        }
      }
      HeartbeatRequest h;
      h.set_member_id(job.ids[static_cast<size_t>(s)]);
      h.set_generation(job.generation);
      StepReport* r = h.mutable_report();
      r->set_step(*step);
      r->set_phase(PHASE_COMPUTING);
      r->set_last_step_us(100000);
      r->set_step_end(!stalled);
      r->set_retransmits_generation(job.generation);
      *r->mutable_retransmits() = Counts((*counts)[s]);
      REQUIRE(job.m.Heartbeat(h, job.sinks[static_cast<size_t>(s)].get(), *now)
                  .ok());
    }
    job.m.Scan(*now);
  }
}

}  // namespace

namespace {

// Six workers on kLossHosts (LossBeats) with 2 s of healthy steps behind
// them, and a segment each retransmitted long before (at connection
// setup) on every connection across h1's link.
struct LossJob {
  LossJob() : job(6) {
    for (const std::string& h : kLossHosts) job.Join(h, kT0);
    for (int s = 0; s < 6; ++s) {
      for (int p = 0; p < 6; ++p) {
        if (OnH1(s) != OnH1(p)) counts[s][p] = 1;
      }
    }
    Beats(20, 0);
  }
  void Beats(int beats, int64_t growth, bool stalled = false,
             int64_t resume_jump = 0) {
    LossBeats(job, &now, beats, &step, &counts, growth, stalled, resume_jump);
  }
  Job job;
  absl::Time now = kT0;
  int64_t step = 0;
  std::map<int, std::map<int, int64_t>> counts;
};

}  // namespace

TEST_CASE(
    "loss: a link cut for a moment, whose retransmissions come with the "
    "steps after it, names no host, and steady loss does") {
  for (const bool blip : {true, false}) {
    INFO("blip: " << blip);
    LossJob l;
    if (blip) {
      // h1's link down for 1.5 s: no step ends; the segments retransmitted
      // meanwhile are counted at the first step's end after it.
      l.Beats(15, 0, /*stalled=*/true);
      l.Beats(40, 0, false, /*resume_jump=*/10);
      CHECK(l.job.Incidents(l.now).empty());
    } else {
      l.Beats(40, 1);
      const std::vector<Incident> inc = l.job.Incidents(l.now);
      REQUIRE(inc.size() == 2);
      for (const Incident& i : inc) {
        CHECK(i.kind() == INCIDENT_STRAGGLER);
        CHECK(i.host() == "h1");
      }
    }
  }
}

TEST_CASE(
    "loss: a data link that is cut again and again, each time for less than "
    "the grace, names its host as flapping") {
  LossJob l;
  for (int cut = 0; cut < 3; ++cut) {
    CHECK(l.job.Incidents(l.now).empty());  // one or two: blips
    l.Beats(15, 0, /*stalled=*/true);
    l.Beats(20, 0, false, /*resume_jump=*/3);
  }
  const std::vector<Incident> inc = l.job.Incidents(l.now);
  REQUIRE(inc.size() == 2);
  for (const Incident& i : inc) {
    CHECK(i.kind() == INCIDENT_STRAGGLER);
    CHECK(i.host() == "h1");
    CHECK_FALSE(i.evicted());
    CHECK_THAT(i.evidence(),
               Catch::Contains("the data link of its host h1 flaps: training "
                               "stalled 3 times"));
  }
}

TEST_CASE(
    "membership: a process exit the controller sees in /proc is left to the "
    "host agent that relays the member's stream") {
  // A worker behind an agent says goodbye to the agent and exits; the
  // controller, on the same kernel, may see the exit before the relayed
  // goodbye arrives. The agent reports the exit itself, after the goodbye.
  Job j(2);
  j.Join("h0", kT0);
  j.Join("h1", kT0);
  j.sinks[1]->relayed = true;
  const absl::Time t = kT0 + absl::Milliseconds(10);
  j.m.ProcessExiting(j.ids[1], "process 1001 has exited", t);
  CHECK(j.Incidents(t).empty());
  j.m.Detach(j.ids[1], j.sinks[1].get(), /*clean=*/true, /*finished=*/true, "",
             t);
  CHECK(j.Incidents(t).empty());
  // A member on a stream of its own is judged by what /proc shows.
  j.m.ProcessExiting(j.ids[0], "process 1000 has exited", t);
  const std::vector<Incident> incidents = j.Incidents(t);
  REQUIRE(incidents.size() == 1);
  CHECK(incidents[0].kind() == INCIDENT_CRASHED);
  CHECK(incidents[0].slot() == 0);
}

TEST_CASE(
    "membership: once closed, a broken stream or a process exit declares "
    "nothing, and a clean leave still counts") {
  Job j(3);
  for (const char* h : {"h0", "h1", "h2"}) j.Join(h, kT0);
  const absl::Time t = kT0 + absl::Milliseconds(10);
  j.m.Close();
  j.m.ProcessExiting(j.ids[0], "process 1000 has exited", t);
  j.m.Detach(j.ids[1], j.sinks[1].get(), /*clean=*/false, /*finished=*/false,
             "stream cancelled", t);
  CHECK(j.Incidents(t).empty());
  j.m.Detach(j.ids[2], j.sinks[2].get(), /*clean=*/true, /*finished=*/true, "",
             t);
  StatusRequest r;
  CHECK(j.m.Status(r, t).left() == 1);
}
