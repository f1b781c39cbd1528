// `holdfast diagnose` on what real faults leave in holdfast-run's log
// directory: four ranks of the data-parallel trainer, one fault each.
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test/job_run.h"

namespace {

using holdfast::test::JobRun;
using holdfast::test::Launch;
using holdfast::test::ReadFile;
using nlohmann::json;

// The verdict `holdfast diagnose --json` gives on `r`'s log directory.
json Verdict(const JobRun& r) {
  const std::string out = r.dir + "/diagnose.json";
  const std::string cmd = std::string(HOLDFAST_CLI_BIN) + " diagnose " + r.dir +
                          " --json > " + out + " 2> " + r.dir + "/diagnose.err";
  const int status = std::system(cmd.c_str());
  INFO("holdfast diagnose: " << ReadFile(r.dir + "/diagnose.err"));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return json::parse(ReadFile(out));
}

const std::vector<std::string> kTrainer = {"--steps", "40", "--step-ms", "20"};

}  // namespace

TEST_CASE("diagnose: a rank killed in its step is named dead") {
  JobRun r =
      Launch({"-n", "4", "--standby", "1", "--inject", "kill:slot=2:step=15"},
             kTrainer);
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  const json v = Verdict(r);
  INFO("verdict: " << v.dump());
  CHECK(v["kind"] == "dead");
  CHECK(v["culprits"] == json::array({2}));
  CHECK(v["victims"] == json::array({0, 1, 3}));
  // holdfast-run gives each incident the same verdict in summary.json.
  REQUIRE(r.summary["incidents"].is_array());
  REQUIRE(!r.summary["incidents"].empty());
  const json& first = r.summary["incidents"][0];
  CHECK(first["slot"] == 2);
  REQUIRE(first.contains("diagnosis"));
  CHECK(first["diagnosis"]["kind"] == "dead");
  CHECK(first["diagnosis"]["culprits"] == json::array({2}));
  CHECK(r.err.find("diagnosis: dead; culprit 2") != std::string::npos);
}

TEST_CASE("diagnose: a rank frozen by SIGSTOP is named frozen") {
  JobRun r = Launch({"-n", "4", "--standby", "1", "--silent-after-ms", "1000",
                     "--inject", "hang:slot=1:step=12"},
                    kTrainer);
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  const json v = Verdict(r);
  INFO("verdict: " << v.dump());
  CHECK(v["kind"] == "frozen");
  CHECK(v["culprits"] == json::array({1}));
  CHECK(v["victims"] == json::array({0, 2, 3}));
}
