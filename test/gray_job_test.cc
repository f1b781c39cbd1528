// Gray failures on real jobs: four ranks of the data-parallel trainer. A
// rank slowed by the slow: fault is reported a straggler and nobody is
// fenced; uneven steps (an RL job's, the same draw on every rank) raise
// no alarm. Both end with the fault-free model.
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test/job_run.h"

namespace {

using holdfast::test::CheckFinished;
using holdfast::test::JobRun;
using holdfast::test::Launch;
using nlohmann::json;

const std::string& FaultFreeHash() {
  static const std::string hash = [] {
    JobRun r = Launch({"-n", "4"}, {"--steps", "40"});
    REQUIRE(r.rc == 0);
    CheckFinished(r, 4, 40);
    return r.hashes.at(0);
  }();
  return hash;
}

}  // namespace

TEST_CASE(
    "gray: a rank three times slower than its peers is reported a "
    "straggler and nobody is fenced") {
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject", "slow:slot=2:ms=40:step=5"},
      {"--steps", "40", "--step-ms", "20"});
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  CHECK(r.hashes.at(0) == FaultFreeHash());
  const json& incidents = r.summary["incidents"];
  REQUIRE(incidents.size() == 1);
  CHECK(incidents[0]["kind"] == "straggler");
  CHECK(incidents[0]["slot"] == 2);
  CHECK(incidents[0]["evicted"] == false);
  CHECK(r.summary["generation"] == 0);
}

TEST_CASE(
    "gray: uneven steps that are long on every rank at once raise no alarm") {
  // 200 steps of 20 ms of compute times a lognormal draw (sigma 0.8), 5 %
  // of them 5-10x, the same draw on every rank, 5 % noise per rank.
  JobRun r = Launch({"-n", "4", "--standby", "1"},
                    {"--steps", "200", "--step-ms", "20", "--uneven", "0.8"});
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 200);
  CHECK(r.summary["incidents"].empty());
}
