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
