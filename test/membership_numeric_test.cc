// The controller's side of numeric anomalies, with a fake clock: which
// committed step the job rolls back to, what data it skips, when a rank is
// suspected of silent data corruption, and the errors for malformed
// reports.
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "src/control/controller/membership.h"
#include "test/support/membership_job.h"

using namespace holdfast::control;
using namespace holdfast::control::test;

namespace {

// Every worker of the job acks `step`, which commits it.
void Commit(Job& job, const std::vector<size_t>& workers, int64_t step) {
  for (size_t i : workers) {
    AckCheckpointRequest a;
    a.set_member_id(job.ids[i]);
    a.set_generation(job.generation);
    a.set_step(step);
    REQUIRE(job.m.AckCheckpoint(a, kT0).ok());
  }
}

absl::StatusOr<bool> Report(Job& job, size_t i, int64_t step, bool local,
                            std::pair<int64_t, int64_t> data,
                            absl::Time now = kT0,
                            const std::string& kind = "nan", int keep = 2) {
  ReportFailureRequest r;
  r.set_member_id(job.ids[i]);
  r.set_generation(job.generation);
  r.set_peer_slot(-1);
  Anomaly* a = r.mutable_anomaly();
  a->set_step(step);
  a->set_kind(kind);
  a->set_what(local ? "local gradients" : "grad_norm");
  a->set_local(local);
  a->mutable_data()->set_begin(data.first);
  a->mutable_data()->set_end(data.second);
  a->set_keep_snapshots(keep);
  return job.m.ReportFailure(r, now);
}

std::vector<std::pair<int64_t, int64_t>> Skips(const MembershipUpdate& u) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const DataRange& r : u.skip_data()) out.emplace_back(r.begin(), r.end());
  return out;
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// The job's second numeric incident was followed by the fencing of the
// member of `slot` (corruption), and the standby (member 4) took the slot
// restoring step `committed`, skipping nothing.
void CheckSecondTimeFenced(Job& job, int slot, int64_t committed) {
  const std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 3);
  CHECK(inc[1].kind() == INCIDENT_NUMERIC);
  CHECK(inc[2].kind() == INCIDENT_CORRUPTION);
  CHECK(inc[2].slot() == slot);
  CHECK(inc[2].evicted());
  const MembershipUpdate* u = job.sinks[4]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->slot() == slot);
  CHECK(u->committed_step() == committed);
  CHECK(u->skip_data_size() == 0);
}

}  // namespace

TEST_CASE(
    "numeric: once every worker reported the job rolls back to the newest "
    "commit before the step and skips its data") {
  Job job(3);
  for (int i = 0; i < 3; ++i) job.Join("h" + std::to_string(i), kT0);
  for (int64_t s = 0; s <= 3; ++s) Commit(job, {0, 1, 2}, s);
  // The NaN came from slot 1's own gradients; every slot saw it after the
  // all-reduce.
  REQUIRE(Report(job, 0, 4, false, {3, 4}).value());
  REQUIRE(Report(job, 1, 4, true, {3, 4}).value());
  CHECK(job.sinks[0]->LastUpdate() == nullptr);  // slot 2 still to come
  REQUIRE(Report(job, 2, 4, false, {3, 4}).value());
  const MembershipUpdate* u = job.sinks[2]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->generation() == 1);
  CHECK(u->committed_step() == 3);
  CHECK(u->rollback());
  CHECK(Skips(*u) == Ranges{{3, 4}});
  const std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_NUMERIC);
  CHECK(inc[0].slot() == 1);
  CHECK_FALSE(inc[0].evicted());
  CHECK(inc[0].step() == 4);
  StatusRequest sr;
  const StatusResponse st = job.m.Status(sr, kT0);
  CHECK(st.rollbacks() == 1);
  CHECK(st.committed_step() == 3);
  REQUIRE(st.skip_data_size() == 1);
  // A member that registers now learns what is skipped.
  RegisterResponse late = job.Join("h3", kT0);
  REQUIRE(late.skip_data_size() == 1);
  CHECK(late.skip_data(0).begin() == 3);
}

TEST_CASE(
    "numeric: a spike that one worker saw is decided after the settle "
    "time") {
  Job job(3);
  for (int i = 0; i < 3; ++i) job.Join("h" + std::to_string(i), kT0);
  for (int64_t s = 0; s <= 5; ++s) Commit(job, {0, 1, 2}, s);
  REQUIRE(Report(job, 2, 6, false, {5, 6}, kT0, "spike").value());
  job.m.Scan(kT0 + absl::Milliseconds(500));
  CHECK(job.sinks[0]->LastUpdate() == nullptr);
  job.m.Scan(kT0 + absl::Milliseconds(1100));
  const MembershipUpdate* u = job.sinks[0]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->committed_step() == 5);
  CHECK(Skips(*u) == Ranges{{5, 6}});
}

TEST_CASE(
    "numeric: an anomaly in the first step after a rollback rolls back "
    "further and the job stops when no clean commit is kept") {
  Job job(3);
  for (int i = 0; i < 3; ++i) job.Join("h" + std::to_string(i), kT0);
  for (int64_t s = 0; s <= 3; ++s) Commit(job, {0, 1, 2}, s);
  for (size_t i = 0; i < 3; ++i) REQUIRE(Report(job, i, 4, false, {3, 4}).ok());
  REQUIRE(job.sinks[0]->LastUpdate()->committed_step() == 3);
  job.generation = 1;
  // Step 4 again, on the next data: step 3 itself may be poisoned.
  for (size_t i = 0; i < 3; ++i) REQUIRE(Report(job, i, 4, false, {4, 5}).ok());
  const MembershipUpdate* u = job.sinks[0]->LastUpdate();
  CHECK(u->generation() == 2);
  CHECK(u->committed_step() == 2);
  CHECK(Skips(*u) == Ranges{{3, 4}, {4, 5}});
  // Once more at once: the members keep 2 commits, and after restoring
  // step 2 (of 3 and 2) only step 2; it is unclean now.
  job.generation = 2;
  for (size_t i = 0; i < 3; ++i) REQUIRE(Report(job, i, 3, false, {2, 3}).ok());
  const JobEnd* end = job.sinks[0]->End();
  REQUIRE(end != nullptr);
  CHECK(end->state() == JOB_STOPPED);
  CHECK_THAT(end->reason(), Catch::Contains("no clean committed step"));
}

TEST_CASE(
    "numeric: a rank that is the source at two different data is fenced "
    "and replaced and the second data is not skipped") {
  Job job(3);
  for (int i = 0; i < 3; ++i) job.Join("h" + std::to_string(i), kT0);
  job.Join("spare", kT0);  // standby, index 3
  for (int64_t s = 0; s <= 3; ++s) Commit(job, {0, 1, 2}, s);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(Report(job, i, 4, i == 1, {3, 4}).ok());
  }
  job.generation = 1;
  for (int64_t s = 4; s <= 8; ++s) Commit(job, {0, 1, 2}, s);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(Report(job, i, 9, i == 1, {9, 10}).ok());
  }
  CHECK(job.sinks[1]->is_closed);  // fenced
  const MembershipUpdate* u = job.sinks[3]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->role() == ROLE_WORKER);
  CHECK(u->slot() == 1);
  CHECK(u->committed_step() == 8);
  CHECK(u->rollback());
  CHECK(Skips(*u) == Ranges{{3, 4}});
  const std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 3);
  CHECK(inc[2].kind() == INCIDENT_CORRUPTION);
  CHECK(inc[2].slot() == 1);
  CHECK(inc[2].evicted());
}

TEST_CASE("numeric: malformed anomaly reports are refused by name") {
  Job job(3);
  for (int i = 0; i < 3; ++i) job.Join("h" + std::to_string(i), kT0);
  job.Join("spare", kT0);
  auto bad = Report(job, 0, 4, false, {3, 4}, kT0, "bogus");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("bogus"));
  bad = Report(job, 0, 4, false, {5, 4});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("range"));
  bad = Report(job, 0, 0, false, {0, 1});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  bad = Report(job, 0, 4, false, {3, 4}, kT0, "nan", 0);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  bad = Report(job, 3, 4, false, {3, 4});  // a standby
  CHECK(bad.status().code() == absl::StatusCode::kFailedPrecondition);
  job.generation = 7;
  bad = Report(job, 0, 4, false, {3, 4});
  CHECK(bad.status().code() == absl::StatusCode::kFailedPrecondition);
  // None of them rolled anything back.
  CHECK(job.sinks[0]->LastUpdate() == nullptr);
}

namespace {

// Slot i's report at the end of `step` (of 1 ms).
HeartbeatRequest StepEndBeat(const Job& job, size_t i, int64_t step) {
  HeartbeatRequest h;
  h.set_member_id(job.ids[i]);
  h.set_generation(job.generation);
  h.mutable_report()->set_step(step);
  h.mutable_report()->set_step_end(true);
  h.mutable_report()->set_last_step_us(1000);
  return h;
}

// Slot i's replica check of `step`: a hash of its replicated state.
void Check(Job& job, size_t i, int64_t step, uint64_t hash) {
  HeartbeatRequest h = StepEndBeat(job, i, step);
  ReplicaCheck* c = h.mutable_report()->add_replica_checks();
  c->set_generation(job.generation);
  c->set_step(step);
  c->set_hash(hash);
  c->set_keep_snapshots(2);
  REQUIRE(job.m.Heartbeat(h, job.sinks[i].get(), kT0).ok());
}

}  // namespace

TEST_CASE(
    "numeric: a slot whose replicated state differs from the majority's is "
    "named and the job rolls back to where all agreed, skipping no data, "
    "and the slot is fenced the second time") {
  Job job(4);
  for (int i = 0; i < 5; ++i) job.Join("h" + std::to_string(i), kT0);
  for (int64_t s = 0; s <= 5; ++s) Commit(job, {0, 1, 2, 3}, s);
  for (size_t i = 0; i < 4; ++i) Check(job, i, 4, 0xaaaa);
  for (size_t i = 0; i < 3; ++i) Check(job, i, 5, i == 1 ? 0xbad : 0xbbbb);
  CHECK(job.sinks[0]->LastUpdate() == nullptr);  // slot 3 still to come
  Check(job, 3, 5, 0xbbbb);
  const MembershipUpdate* u = job.sinks[0]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->generation() == 1);
  CHECK(u->committed_step() == 4);  // step 4 was checked; 5 was not clean
  CHECK(u->rollback());
  CHECK(u->skip_data_size() == 0);
  std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_NUMERIC);
  CHECK(inc[0].slot() == 1);
  CHECK_FALSE(inc[0].evicted());
  CHECK_THAT(inc[0].evidence(), Catch::Contains("slot(s) 1 differ from the "
                                                "majority"));
  // Checks of the old generation count for nothing.
  Check(job, 0, 6, 0x1);
  // Step 5 again, all agreed; then slot 1 differs once more: fenced, and
  // the standby takes its slot.
  job.generation = 1;
  Commit(job, {0, 1, 2, 3}, 5);
  for (size_t i = 0; i < 4; ++i) Check(job, i, 5, 0xbbbb);
  for (size_t i = 0; i < 4; ++i) Check(job, i, 6, i == 1 ? 0xbad : 0xcccc);
  CheckSecondTimeFenced(job, 1, 5);
}

TEST_CASE(
    "numeric: replicated state split with no majority rolls the job back "
    "and names nobody") {
  Job job(4);
  for (int i = 0; i < 4; ++i) job.Join("h" + std::to_string(i), kT0);
  for (int64_t s = 0; s <= 3; ++s) Commit(job, {0, 1, 2, 3}, s);
  for (size_t i = 0; i < 4; ++i) Check(job, i, 2, 0xaaaa);
  for (size_t i = 0; i < 4; ++i) Check(job, i, 3, i < 2 ? 0x1 : 0x2);
  const MembershipUpdate* u = job.sinks[0]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->committed_step() == 2);
  const std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_NUMERIC);
  CHECK_FALSE(inc[0].evicted());
  CHECK_THAT(inc[0].evidence(), Catch::Contains("no majority"));
}

namespace {

// Slot i's norm of its local gradients in `step`, which read `data`.
void Norm(Job& job, size_t i, int64_t step, double norm,
          std::pair<int64_t, int64_t> data) {
  HeartbeatRequest h = StepEndBeat(job, i, step);
  LocalNorm* n = h.mutable_report()->add_local_norms();
  n->set_generation(job.generation);
  n->set_step(step);
  n->set_norm(norm);
  n->set_keep_snapshots(2);
  n->mutable_data()->set_begin(data.first);
  n->mutable_data()->set_end(data.second);
  REQUIRE(job.m.Heartbeat(h, job.sinks[i].get(), kT0).ok());
}

// Every slot's norm of `step` (data [step - 1, step)): `big` for slot
// `outlier`, between 2 and 3.5 for the others.
void Norms(Job& job, int64_t step, int outlier = -1, double big = 0) {
  for (size_t i = 0; i < 4; ++i) {
    Norm(job, i, step,
         static_cast<int>(i) == outlier ? big
                                        : 2.0 + 0.5 * static_cast<double>(i),
         {step - 1, step});
  }
}

// Steps 0..`upto`: every slot's norms within the data's spread, each step
// committed.
void CleanSteps(Job& job, int64_t upto) {
  for (int64_t s = 0; s <= upto; ++s) {
    Norms(job, s);
    Commit(job, {0, 1, 2, 3}, s);
  }
}

}  // namespace

TEST_CASE(
    "numeric: a slot whose local gradient norm is far above the others' is "
    "named before its step commits, the job rolls back skipping no data, "
    "and the slot is fenced when it is far off again at another step") {
  Job job(4);
  for (int i = 0; i < 5; ++i) job.Join("h" + std::to_string(i), kT0);
  CleanSteps(job, 4);
  // Within the factor (1000): a spread such as the data make, 360x.
  Norms(job, 5, 2, 900.0);
  Commit(job, {0, 1, 2, 3}, 5);
  CHECK(job.sinks[0]->LastUpdate() == nullptr);
  CHECK(job.Incidents(kT0).empty());
  for (size_t i = 0; i < 3; ++i) Norm(job, i, 6, i == 1 ? 5e6 : 2.0, {5, 6});
  CHECK(job.sinks[0]->LastUpdate() == nullptr);  // slot 3 still to come
  Norm(job, 3, 6, 3.0, {5, 6});
  const MembershipUpdate* u = job.sinks[0]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->generation() == 1);
  CHECK(u->committed_step() == 5);
  CHECK(u->rollback());
  CHECK(u->skip_data_size() == 0);
  std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].kind() == INCIDENT_NUMERIC);
  CHECK(inc[0].slot() == 1);
  CHECK_FALSE(inc[0].evicted());
  CHECK_THAT(inc[0].evidence(),
             Catch::Contains("slot 1's (5e+06) is 2.5e+06 times the median"));
  // Step 6's acks, of the old generation, commit nothing.
  for (size_t i = 0; i < 4; ++i) {
    AckCheckpointRequest a;
    a.set_member_id(job.ids[i]);
    a.set_generation(0);
    a.set_step(6);
    CHECK_FALSE(job.m.AckCheckpoint(a, kT0).ok());
  }
  // Norms of the old generation count for nothing.
  job.generation = 0;
  Norm(job, 1, 7, 9e9, {6, 7});
  job.generation = 1;
  CHECK(job.Incidents(kT0).size() == 1);
  // Step 6 redone, clean; then slot 1 is far off at step 7: fenced, and
  // the standby takes its slot.
  Norms(job, 6);
  Commit(job, {0, 1, 2, 3}, 6);
  Norms(job, 7, 1, 4e7);
  CheckSecondTimeFenced(job, 1, 6);
}

TEST_CASE(
    "numeric: a slot far off again when its step is redone at the same data "
    "shows the data as the cause: the data is skipped and nobody is "
    "fenced") {
  Job job(4);
  for (int i = 0; i < 5; ++i) job.Join("h" + std::to_string(i), kT0);
  CleanSteps(job, 4);
  Norms(job, 5, 0, 1e6);
  const MembershipUpdate* u = job.sinks[1]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->committed_step() == 4);
  CHECK(u->skip_data_size() == 0);
  job.generation = 1;
  Norms(job, 5, 0, 1e6);
  u = job.sinks[1]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->generation() == 2);
  CHECK(u->committed_step() == 4);
  CHECK(Skips(*u) == Ranges{{4, 5}});
  const std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 2);
  CHECK(inc[1].kind() == INCIDENT_NUMERIC);
  CHECK(inc[1].slot() == 0);
  CHECK_FALSE(inc[1].evicted());
  CHECK_THAT(inc[1].evidence(),
             Catch::Contains("the same again when the step was redone"));
}

TEST_CASE("numeric: with the gradient check off no norm names a slot") {
  DetectionOptions d = Job::Defaults();
  d.gradient_outlier_factor = 0;
  Job job(4, d);
  for (int i = 0; i < 4; ++i) job.Join("h" + std::to_string(i), kT0);
  Commit(job, {0, 1, 2, 3}, 0);
  Norms(job, 1, 2, 1e30);
  CHECK(job.sinks[0]->LastUpdate() == nullptr);
  CHECK(job.Incidents(kT0).empty());
}

TEST_CASE(
    "numeric: an Inf that every slot sees after the all-reduce is traced by "
    "the local norms its reports carry to the slot whose gradients were far "
    "off, and no data is skipped") {
  Job job(4);
  for (int i = 0; i < 4; ++i) job.Join("h" + std::to_string(i), kT0);
  for (int64_t s = 0; s <= 4; ++s) Commit(job, {0, 1, 2, 3}, s);
  for (size_t i = 0; i < 4; ++i) {
    ReportFailureRequest r;
    r.set_member_id(job.ids[i]);
    r.set_generation(job.generation);
    r.set_peer_slot(-1);
    Anomaly* a = r.mutable_anomaly();
    a->set_step(5);
    a->set_kind("nan");
    a->set_what("grad_norm");
    a->mutable_data()->set_begin(4);
    a->mutable_data()->set_end(5);
    a->set_keep_snapshots(2);
    a->set_local_norm(i == 2 ? 3e30 : 1.0 + static_cast<double>(i));
    REQUIRE(job.m.ReportFailure(r, kT0).ok());
  }
  const MembershipUpdate* u = job.sinks[0]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->committed_step() == 4);
  CHECK(u->skip_data_size() == 0);
  const std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 1);
  CHECK(inc[0].slot() == 2);
  CHECK_THAT(inc[0].evidence(),
             Catch::Contains("local gradient norms of step 5: slot 2's"));
}

TEST_CASE(
    "numeric: values that are not finite in every worker's own gradients, "
    "again after the rollback at other data, fence nobody: the state they "
    "share, not one rank, is the suspect") {
  // A flipped bit the all-reduce spread into the model at step 15, with no
  // gradient check: step 16 is non-finite everywhere, whatever its data.
  Job job(4);
  for (int i = 0; i < 4; ++i) job.Join("h" + std::to_string(i), kT0);
  job.Join("spare", kT0);  // standby, index 4
  for (int64_t s = 0; s <= 15; ++s) Commit(job, {0, 1, 2, 3}, s);
  for (size_t i = 0; i < 4; ++i)
    REQUIRE(Report(job, i, 16, true, {15, 16}).ok());
  REQUIRE(job.sinks[0]->LastUpdate()->committed_step() == 15);
  job.generation = 1;
  for (size_t i = 0; i < 4; ++i)
    REQUIRE(Report(job, i, 16, true, {16, 17}).ok());
  const MembershipUpdate* u = job.sinks[0]->LastUpdate();
  REQUIRE(u != nullptr);
  CHECK(u->generation() == 2);
  CHECK(u->committed_step() == 14);  // step 15 is unclean
  for (size_t i = 0; i < 4; ++i) CHECK_FALSE(job.sinks[i]->is_closed);
  const std::vector<Incident> inc = job.Incidents(kT0);
  REQUIRE(inc.size() == 2);
  CHECK(inc[1].kind() == INCIDENT_NUMERIC);
  CHECK_FALSE(inc[1].evicted());
}
