// Reading holdfast-run's DIR/members.json (tools/launcher.h, WriteMembers)
// from outside the job, as a tool that acts on processes by pid does: for
// tests and benchmarks. Header-only.
#ifndef HOLDFAST_TEST_SUPPORT_MEMBERS_JSON_H_
#define HOLDFAST_TEST_SUPPORT_MEMBERS_JSON_H_

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace holdfast::test {

// The pid of slot `slot`'s live worker once DIR/members.json shows it at
// step `step` or later; -1 after `timeout`, or once `give_up` says so.
inline pid_t AwaitWorker(const std::string& dir, int slot, int64_t step,
                         absl::Duration timeout = absl::Seconds(60),
                         const std::function<bool()>& give_up = nullptr) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline && !(give_up && give_up())) {
    std::ifstream in(dir + "/members.json");
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json m =
        nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (m.is_object() && m.contains("members") && m["members"].is_array()) {
      for (const nlohmann::json& e : m["members"]) {
        if (e.value("role", "") == "ROLE_WORKER" &&
            e.value("slot", -1) == slot &&
            e.value("state", "") == "STATE_ALIVE" &&
            e.value("step", int64_t{-1}) >= step) {
          return e.value("pid", -1);
        }
      }
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

}  // namespace holdfast::test

#endif  // HOLDFAST_TEST_SUPPORT_MEMBERS_JSON_H_
