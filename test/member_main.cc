// holdfast_test_member: a fake trainer for the controller's fault tests. It
// joins the job, "trains" (sleeps per step and reports each step), and
// prints what it observes as "event=..." lines on stdout. The tests SIGKILL,
// SIGSTOP, stall or outlive it and check what the controller concluded.
//
//   holdfast_test_member --controller HOST:PORT [--steps N] [--step-ms MS]
//       [--uneven] [--stall-at STEP] [--ack] [--host H] [--hb-ms MS]
//       [--token-file FILE] [--nproc-limit N]
//
// Token from --token-file or HOLDFAST_JOB_TOKEN. Exit: 0 done, 3 fenced, 1
// error. --nproc-limit (root only): first become uid/gid 65501, a user of
// this test alone, with RLIMIT_NPROC N, so that only N threads can run.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "src/control/member/member.h"
#include "src/control/wire/auth.h"

namespace {

absl::Mutex g_out;

void Emit(const std::string& line) {
  absl::MutexLock lock(&g_out);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fake trainer for controller tests"};
  std::string controller, host, token_file;
  int64_t steps = -1, step_ms = 20, stall_at = -1, hb_ms = 0, nproc = 0,
          hold_mb = 0;
  bool uneven = false, ack = false;
  app.add_option("--controller", controller)->required();
  app.add_option("--steps", steps, "-1: until killed");
  app.add_option("--step-ms", step_ms);
  app.add_option("--stall-at", stall_at,
                 "stop advancing at this step (heartbeats go on)");
  app.add_option("--hb-ms", hb_ms, "heartbeat interval (0: controller's)");
  app.add_option("--host", host);
  app.add_option("--token-file", token_file);
  app.add_flag("--uneven", uneven, "every 4th step takes 6x as long");
  app.add_flag("--ack", ack, "ack a checkpoint after every step");
  app.add_option("--nproc-limit", nproc,
                 "run as uid 65501 with at most this many threads (root)");
  app.add_option("--hold-mb", hold_mb,
                 "touch this many MiB first and keep them (a killed "
                 "process's files close after its memory's teardown)");
  CLI11_PARSE(app, argc, argv);
  std::vector<char> held(static_cast<size_t>(hold_mb) << 20, 1);

  auto token = holdfast::control::LoadToken(token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "%s\n", token.status().ToString().c_str());
    return 1;
  }
  if (nproc > 0) {
    const rlimit l = {static_cast<rlim_t>(nproc), static_cast<rlim_t>(nproc)};
    if (setgid(65501) != 0 || setuid(65501) != 0 ||
        setrlimit(RLIMIT_NPROC, &l) != 0) {
      Emit("event=error msg=cannot become uid 65501 with RLIMIT_NPROC");
      return 1;
    }
  }
  std::atomic<bool> fenced{false};
  holdfast::control::MemberOptions o;
  o.client.address = controller;
  o.client.token = *token;
  o.host = host;
  o.heartbeat_interval = absl::Milliseconds(hb_ms);
  holdfast::control::MemberCallbacks cb;
  cb.on_abort = [](const holdfast::control::AbortOrder& a) {
    Emit(absl::StrCat("event=abort generation=", a.generation(),
                      " failed_slot=", a.failed_slot(), " failed_member=",
                      a.failed_member_id(), " msg=", a.reason()));
  };
  cb.on_membership = [](const holdfast::control::MembershipUpdate& u) {
    Emit(absl::StrCat(
        "event=membership generation=", u.generation(), " slot=", u.slot(),
        " standby=", u.role() == holdfast::control::ROLE_STANDBY));
  };
  cb.on_committed = [](int64_t step) {
    Emit(absl::StrCat("event=committed step=", step));
  };
  cb.on_fenced = [&fenced](const absl::Status& s) {
    Emit(absl::StrCat("event=fenced code=", absl::StatusCodeToString(s.code()),
                      " msg=", s.message()));
    fenced = true;
  };
  cb.on_reconnected = [](int n) {
    Emit(absl::StrCat("event=reconnected n=", n));
  };
  auto member = holdfast::control::MemberClient::Join(o, cb);
  if (!member.ok()) {
    Emit(absl::StrCat("event=error msg=", member.status().ToString()));
    return 1;
  }
  const auto a = (*member)->assignment();
  Emit(absl::StrCat("event=registered member=", a.member_id, " slot=", a.slot,
                    " generation=", a.generation, " standby=", a.standby));
  for (int64_t step = 0; steps < 0 || step < steps; ++step) {
    if (fenced) return 3;
    if (step == stall_at) {
      Emit(absl::StrCat("event=stalling step=", step));
      while (!fenced) absl::SleepFor(absl::Milliseconds(10));
      return 3;
    }
    const absl::Duration t =
        absl::Milliseconds(uneven && step % 4 == 3 ? 6 * step_ms : step_ms);
    (*member)->SetPhase(holdfast::control::PHASE_COMPUTING, step);
    absl::SleepFor(t);
    (void)(*member)->ReportStep(step, t, {{"loss", 1.0 / (1.0 + step)}});
    if (ack) {
      auto c = (*member)->AckCheckpoint(step);
      if (!c.ok() && !fenced) {
        Emit(absl::StrCat("event=ack_error msg=", c.status().ToString()));
      }
    }
    Emit(absl::StrCat("event=step step=", step,
                      " healthy=", (*member)->health().ok()));
  }
  (*member)->Leave(/*finished=*/true);
  Emit("event=done");
  return fenced ? 3 : 0;
}
