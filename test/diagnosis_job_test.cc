// Naming the culprit on real faults, four ranks of the data-parallel
// trainer with one standby: the controller's verdict on each incident
// (summary.json), the members it fenced (only the culprit), the final
// model (the fault-free one), and `holdfast diagnose` on the dumps the
// job left (the same verdict).
#include <signal.h>
#include <sys/types.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "test/support/job_run.h"
#include "test/support/members_json.h"
#include "test/support/scoped_env.h"

namespace {

using holdfast::test::AwaitWorker;
using holdfast::test::CheckFinished;
using holdfast::test::JobRun;
using holdfast::test::Launch;
using holdfast::test::ReadFile;
using holdfast::test::ScopedEnv;
using nlohmann::json;

const std::vector<std::string> kTrainer = {"--steps", "40", "--step-ms", "20"};

// The verdict `holdfast diagnose --json` gives on `r`'s log directory.
json Offline(const JobRun& r) {
  const std::string out = r.dir + "/diagnose.json";
  const std::string cmd = std::string(HOLDFAST_CLI_BIN) + " diagnose " + r.dir +
                          " --json > " + out + " 2> " + r.dir + "/diagnose.err";
  const int status = std::system(cmd.c_str());
  INFO("holdfast diagnose: " << ReadFile(r.dir + "/diagnose.err"));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return json::parse(ReadFile(out));
}

// The trainer's final hash with no fault (the same for every step time).
const std::string& FaultFreeHash() {
  static const std::string hash =
      holdfast::test::FaultFreeHash(4, kTrainer, 40);
  return hash;
}

// The job finished with the fault-free model; its first incident's
// verdict, online and offline, is `kind` with `culprit` alone, every
// other slot a victim; the only member fenced was the culprit's.
void CheckCulprit(const JobRun& r, const std::string& kind, int culprit) {
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  CHECK(r.hashes.at(0) == FaultFreeHash());
  const json& incidents = r.summary["incidents"];
  REQUIRE(incidents.is_array());
  REQUIRE(!incidents.empty());
  std::vector<int> victims;
  for (int s = 0; s < 4; ++s) {
    if (s != culprit) victims.push_back(s);
  }
  // The fault's incident: the first one that is not a straggler report
  // (a slowed slot is reported, and not judged).
  size_t at = 0;
  while (at < incidents.size() && incidents[at]["kind"] == "straggler") ++at;
  REQUIRE(at < incidents.size());
  const json& first = incidents[at];
  REQUIRE(first.contains("diagnosis"));
  CHECK(first["diagnosis"]["kind"] == kind);
  CHECK(first["diagnosis"]["culprits"] == json::array({culprit}));
  CHECK(first["diagnosis"]["victims"] == json(victims));
  CHECK(first["diagnosis"]["action"] == "replace");
  int evictions = 0;
  for (const json& i : incidents) {
    CHECK((i.contains("diagnosis") || i["kind"] == "straggler"));
    if (i.value("evicted", false)) {
      ++evictions;
      CHECK(i["slot"] == culprit);
    }
  }
  CHECK(evictions == 1);
  const json offline = Offline(r);
  INFO("offline verdict: " << offline.dump());
  CHECK(offline["kind"] == kind);
  CHECK(offline["culprits"] == json::array({culprit}));
}

// Runs the job; meanwhile SIGSTOPs slot `slot`'s process from outside
// once it reached step `step`.
JobRun StopFromOutside(const std::vector<std::string>& args,
                       const std::vector<std::string>& trainer, int slot,
                       int64_t step) {
  const std::string dir = holdfast::proc::MakeTempDir();
  pid_t stopped = -1;
  std::thread stopper([&] {
    stopped = AwaitWorker(dir, slot, step);
    if (stopped > 0) ::kill(stopped, SIGSTOP);
  });
  JobRun r = Launch(args, trainer, "", dir);
  stopper.join();
  REQUIRE(stopped > 0);
  ::kill(stopped, SIGKILL);  // if holdfast-run left it
  return r;
}

}  // namespace

TEST_CASE("diagnose: a rank killed in its step is named dead") {
  JobRun r =
      Launch({"-n", "4", "--standby", "1", "--inject", "kill:slot=2:step=15"},
             kTrainer);
  CheckCulprit(r, "dead", 2);
  CHECK(r.err.find("diagnosis: dead; culprit 2") != std::string::npos);
  // The timeline page beside summary.json: well-formed (an XML parser
  // reads it), one lane per slot, and every incident named with its
  // diagnosis.
  const std::string page = ReadFile(r.dir + "/timeline.html");
  REQUIRE(!page.empty());
  const std::string parse =
      "python3 -c \"import sys, xml.dom.minidom; "
      "xml.dom.minidom.parse(sys.argv[1])\" " +
      r.dir + "/timeline.html 2> " + r.dir + "/parse.err";
  const int parsed = std::system(parse.c_str());
  INFO("parser: " << ReadFile(r.dir + "/parse.err"));
  CHECK(WIFEXITED(parsed));
  CHECK(WEXITSTATUS(parsed) == 0);
  CHECK(page.find("<svg") != std::string::npos);
  // Self-contained: no script, and no link but the XML namespaces.
  CHECK(page.find("<script") == std::string::npos);
  CHECK(page.find("src=") == std::string::npos);
  CHECK(page.find("href") == std::string::npos);
  size_t links = 0, namespaces = 0;
  for (size_t at = page.find("http"); at != std::string::npos;
       at = page.find("http", at + 1)) {
    ++links;
    namespaces += page.compare(at, 18, "http://www.w3.org/") == 0;
  }
  CHECK(links == namespaces);
  for (int s = 0; s < 4; ++s) {
    CHECK(page.find(">slot " + std::to_string(s) + "<") != std::string::npos);
  }
  for (const json& i : r.summary["incidents"]) {
    const std::string id = "#" + std::to_string(i["id"].get<int>());
    CHECK(page.find(id + " " + i["kind"].get<std::string>() + ": " +
                    i["diagnosis"]["kind"].get<std::string>()) !=
          std::string::npos);
    CHECK(page.find("<td>" + id + "</td>") != std::string::npos);
  }
  CHECK(page.find("state restored") != std::string::npos);  // a recovery
}

TEST_CASE(
    "diagnose: a rank stopped from outside in its compute is named frozen") {
  // 300 ms of compute per step: the stop lands in it.
  JobRun r = StopFromOutside(
      {"-n", "4", "--standby", "1", "--silent-after-ms", "1500"},
      {"--steps", "40", "--step-ms", "300"}, 1, 8);
  CheckCulprit(r, "frozen", 1);
}

TEST_CASE(
    "diagnose: a rank stopped from outside inside a collective is named "
    "frozen and the slow rank its peers wait for is not accused") {
  // Slot 0 sleeps 400 ms before each step, so the others spend their steps
  // inside the all-reduce waiting for it: the stop of slot 2 lands there.
  JobRun r = StopFromOutside({"-n", "4", "--standby", "1", "--silent-after-ms",
                              "1500", "--inject", "slow:slot=0:ms=400"},
                             {"--steps", "40", "--step-ms", "10"}, 2, 8);
  CheckCulprit(r, "frozen", 2);
  // The slow slot is reported a straggler (not fenced) if the stop came
  // after 8 steps of it.
  for (const json& i : r.summary["incidents"]) {
    if (i["kind"] == "straggler") CHECK(i["slot"] == 0);
  }
}

TEST_CASE(
    "diagnose: a stalled step thread is named a compute hang and replaced") {
  // The thread blocks; the process heartbeats. Its peers time out in the
  // next all-reduce (3 s), and the traces show it never entered it.
  ScopedEnv timeout("HOLDFAST_TIMEOUT_MS", "3000");
  JobRun r =
      Launch({"-n", "4", "--standby", "1", "--inject", "stall:slot=3:step=14"},
             kTrainer);
  CheckCulprit(r, "compute-hang", 3);
  const json& d = r.summary["incidents"][0]["diagnosis"];
  CHECK(d["evidence"].get<std::string>().find("slot 3 is alive") !=
        std::string::npos);
}

TEST_CASE(
    "diagnose: a collective mismatch names the slot that called otherwise "
    "which alone is replaced") {
  ScopedEnv timeout("HOLDFAST_TIMEOUT_MS", "3000");
  JobRun r = Launch(
      {"-n", "4", "--standby", "1", "--inject", "mismatch:slot=2:seq=14"},
      kTrainer);
  CheckCulprit(r, "mismatch", 2);
  const json& d = r.summary["incidents"][0]["diagnosis"];
  CHECK(d["evidence"].get<std::string>().find("slot 2 called Barrier") !=
        std::string::npos);
  CHECK(d["collective"]["seq"] == 14);
}

TEST_CASE(
    "diagnose: an op that failed on one rank is named and nobody is "
    "fenced for it") {
  JobRun r =
      Launch({"-n", "4", "--standby", "1", "--inject", "fail-op:slot=1:seq=16"},
             kTrainer);
  INFO("summary: " << r.summary.dump(1));
  REQUIRE(r.rc == 0);
  CheckFinished(r, 4, 40);
  CHECK(r.hashes.at(0) == FaultFreeHash());
  const json& d = r.summary["incidents"][0]["diagnosis"];
  CHECK(d["kind"] == "op-failed");
  CHECK(d["culprits"] == json::array({1}));
  CHECK(d["action"] == "none");
  for (const json& i : r.summary["incidents"]) CHECK(!i.value("evicted", true));
  CHECK(Offline(r)["kind"] == "op-failed");
}

TEST_CASE(
    "diagnose: a mismatch with no majority call stops the job naming "
    "both sides") {
  // Two slots of four call a Barrier: two against two.
  ScopedEnv timeout("HOLDFAST_TIMEOUT_MS", "3000");
  JobRun r = Launch({"-n", "4", "--standby", "2", "--inject",
                     "mismatch:slot=1:seq=14,mismatch:slot=3:seq=14"},
                    kTrainer);
  INFO("summary: " << r.summary.dump(1));
  CHECK(r.rc != 0);
  const json& d = r.summary["incidents"][0]["diagnosis"];
  CHECK(d["kind"] == "mismatch");
  CHECK(d["culprits"] == json::array({0, 1, 2, 3}));
  CHECK(d["action"] == "none");
  // Nobody was fenced on the verdict; the members left on the error.
  CHECK(!r.summary["incidents"][0].value("evicted", true));
  for (const json& i : r.summary["incidents"]) {
    CHECK(i["kind"] != "diagnosed");
  }
  CHECK(r.err.find("collective mismatch at collective #14") !=
        std::string::npos);
}
