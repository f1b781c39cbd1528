// Runs holdfast-run with the example trainer as a test fixture and parses
// what the processes and the launcher leave behind: the `final step=`
// lines, the trainers' final losses, summary.json. Shared by the
// end-to-end tests (recovery_test, checkpoint_test).
#ifndef HOLDFAST_TEST_SUPPORT_JOB_RUN_H_
#define HOLDFAST_TEST_SUPPORT_JOB_RUN_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "test/support/process_group.h"

namespace holdfast::test {

using nlohmann::json;

struct JobRun {
  int rc = -1;
  std::string dir;  // holdfast-run's --log-dir
  std::string out, err;
  json summary;
  // slot label -> (world, hash) from each "final step=" line.
  std::vector<std::string> hashes;
  std::vector<int> worlds;
  std::vector<int64_t> steps;
  std::vector<double> losses;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs holdfast-run with `args` and the trainer with `trainer_args`. With
// `cwd` it runs there, with holdfast-run's default disk tier; without, the
// disk tier is a fresh directory of its own (unless `args` choose), so no
// job resumes another's checkpoint.
// `log_dir`: the log directory to use (made fresh when empty), for a test
// that watches it while the job runs.
inline JobRun Launch(const std::vector<std::string>& args,
                     const std::vector<std::string>& trainer_args,
                     const std::string& cwd = "",
                     const std::string& log_dir = "") {
  const std::string dir =
      log_dir.empty() ? holdfast::proc::MakeTempDir() : log_dir;
  std::string disk;
  if (cwd.empty() &&
      std::none_of(args.begin(), args.end(), [](const std::string& a) {
        return a == "--checkpoint-dir" || a == "--no-disk-tier";
      })) {
    disk = absl::StrCat(" --checkpoint-dir ", dir, "/ckpt");
  }
  const std::string cmd = absl::StrCat(
      cwd.empty() ? "" : absl::StrCat("cd ", cwd, " && "),
      "timeout -s KILL 240 ", HOLDFAST_RUN_BIN, " --log-dir ", dir, disk, " ",
      absl::StrJoin(args, " "), " -- ", HOLDFAST_DP_TRAINER_BIN, " ",
      absl::StrJoin(trainer_args, " "), " > ", dir, "/out.txt 2> ", dir,
      "/err.txt");
  JobRun r;
  r.dir = dir;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(dir + "/out.txt");
  r.err = ReadFile(dir + "/err.txt");
  const std::string summary = ReadFile(dir + "/summary.json");
  r.summary = json::parse(summary, nullptr, false);
  static const std::regex kFinal(
      R"(final step=(\d+) world=(\d+) params_sha256=([0-9a-f]{64}))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), kFinal), end;
       it != end; ++it) {
    r.steps.push_back(std::stoll((*it)[1]));
    r.worlds.push_back(std::stoi((*it)[2]));
    r.hashes.push_back((*it)[3]);
  }
  static const std::regex kLoss(R"(final_loss=([0-9.]+))");
  for (std::sregex_iterator it(r.err.begin(), r.err.end(), kLoss), end;
       it != end; ++it) {
    r.losses.push_back(std::stod((*it)[1]));
  }
  INFO("command: " << cmd);
  INFO("stderr tail: " << r.err.substr(r.err.size() > 4000 ? r.err.size() - 4000
                                                           : 0));
  REQUIRE(!r.summary.is_discarded());
  return r;
}

// The incident kinds in order; the summary goes into the failure message.
#define CHECK_KINDS(r, ...)                                                    \
  do {                                                                         \
    INFO("summary: " << (r).summary.dump(1));                                  \
    CHECK(::holdfast::test::Kinds(r) == std::vector<std::string> __VA_ARGS__); \
  } while (0)
#define CHECK_EXITS(r, how, n)                          \
  do {                                                  \
    INFO("summary: " << (r).summary.dump(1));           \
    CHECK(::holdfast::test::CountExits(r, how) == (n)); \
  } while (0)

// Every survivor printed its final line: `world` of them, at step
// `steps`, in a world of `world`, with one hash; the job finished.
inline void CheckFinished(const JobRun& r, int world, int64_t steps) {
  INFO("stdout: " << r.out);
  REQUIRE(r.hashes.size() == static_cast<size_t>(world));
  for (size_t i = 0; i < r.hashes.size(); ++i) {
    CHECK(r.hashes[i] == r.hashes[0]);
    CHECK(r.worlds[i] == world);
    CHECK(r.steps[i] == steps);
  }
  CHECK(r.summary.value("outcome", "") == "finished");
}

// The final hash of `n` ranks of the trainer with `trainer_args` (which
// run `steps` steps) and no fault: every rank finished with one hash.
inline std::string FaultFreeHash(int n,
                                 const std::vector<std::string>& trainer_args,
                                 int64_t steps) {
  JobRun r = Launch({"-n", std::to_string(n)}, trainer_args);
  REQUIRE(r.rc == 0);
  CheckFinished(r, n, steps);
  return r.hashes.at(0);
}

inline std::vector<std::string> Kinds(const JobRun& r) {
  std::vector<std::string> kinds;
  for (const json& i : r.summary["incidents"])
    kinds.push_back(i.value("kind", ""));
  return kinds;
}

inline int CountExits(const JobRun& r, const std::string& how) {
  int n = 0;
  for (const json& p : r.summary["processes"]) n += p.value("exit", "") == how;
  return n;
}

}  // namespace holdfast::test

#endif  // HOLDFAST_TEST_SUPPORT_JOB_RUN_H_
