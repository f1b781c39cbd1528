// holdfast-controller: one per job, or two or three elected on etcd.
// Membership, heartbeats, failure detection, checkpoint acks, status and
// the rendezvous key-value store over gRPC, plus Prometheus metrics.
//
//   holdfast-controller --world-size N [--port 29400] [--bind 127.0.0.1]
//                       [--token-file FILE]   (or HOLDFAST_JOB_TOKEN)
//                       [--port-file FILE]    (the bound port, for --port 0)
//                       [--metrics-port P]    (Prometheus text, off if unset)
//                       [detection thresholds: see --help]
//                       [--etcd IP:PORT,... --election-key KEY]
//                           (one of several: only the elected leader
//                           listens; docs/controller.md)
// Runs until SIGINT or SIGTERM. Logs to stderr with timestamps; the token is
// never logged.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/file_util.h"
#include "src/common/logging.h"
#include "src/control/controller/server.h"
#include "src/control/etcd/election.h"
#include "src/control/wire/auth.h"
#include "tools/tls_flags.h"

namespace {

// Whether SIGINT or SIGTERM is pending (both are blocked).
bool StopPending() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGINT) == 1 ||
         sigismember(&pending, SIGTERM) == 1;
}

// One of several controllers: campaigns, serves while it leads, and
// campaigns again once it has lost the lead (a renewal that did not come
// back in time), with fresh soft state that the members rebuild. Only
// the leader listens, so members with the controllers' addresses find it.
int LeadWhileElected(holdfast::control::ControllerOptions options,
                     const holdfast::control::ElectionOptions& eo,
                     const sigset_t& stop) {
  auto election = holdfast::control::Election::Create(eo);
  if (!election.ok()) {
    std::fprintf(stderr, "holdfast-controller: %s\n",
                 std::string(election.status().message()).c_str());
    return 2;
  }
  HOLDFAST_LOG_INFO("controller: candidate for {} on etcd {} as {}", eo.key,
                    eo.endpoints, eo.value);
  for (;;) {
    absl::StatusOr<int64_t> epoch = (*election)->Campaign(StopPending);
    if (!epoch.ok()) break;  // stopped
    options.epoch = *epoch;
    auto server = holdfast::control::ControllerServer::Start(options);
    if (!server.ok()) {
      HOLDFAST_LOG_ERROR("controller: elected but cannot serve: {}",
                         server.status().ToString());
      (*election)->Resign();
      absl::SleepFor(absl::Seconds(1));
      continue;
    }
    HOLDFAST_LOG_INFO("controller: leader at epoch {}, serving {}", *epoch,
                      (*server)->address());
    while ((*election)->Leading() && !StopPending()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (StopPending()) {
      (*server)->Shutdown();
      (*election)->Resign();
      break;
    }
    HOLDFAST_LOG_WARN(
        "controller: lost the lead at epoch {} (the lease was not renewed "
        "in time): stopping at once, then campaigning again",
        *epoch);
    (*server)->Abandon();
    (*election)->Resign();
  }
  int sig = 0;
  sigwait(&stop, &sig);
  HOLDFAST_LOG_INFO("controller stopping ({})", strsignal(sig));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "holdfast controller: membership, failure detection and "
      "rendezvous for one job"};
  int port = 29400;
  int world_size = 0;
  std::string bind = "127.0.0.1";
  std::string token_file;
  std::string port_file;
  app.add_option("--port", port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--world-size", world_size, "number of worker slots")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--bind", bind, "address to listen on");
  app.add_option("--token-file", token_file,
                 "file whose first line is the job token (default: "
                 "HOLDFAST_JOB_TOKEN)");
  app.add_option(
      "--port-file", port_file,
      "write the bound port to this file once serving (for --port 0)");
  int metrics_port = -1;
  app.add_option("--metrics-port", metrics_port,
                 "serve Prometheus metrics on this port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  std::string mode = "replace";
  app.add_option("--mode", mode,
                 "on a lost worker: replace (a standby takes the slot; "
                 "shrink when none is left) or shrink")
      ->check(CLI::IsMember({"replace", "shrink"}));
  int min_world = 1;
  app.add_option("--min-world", min_world,
                 "stop the job below this many workers")
      ->check(CLI::Range(1, 1 << 20));
  int max_world = 0;
  app.add_option("--max-world", max_world,
                 "grow the world up to this many workers with standbys that "
                 "wait (0: never)")
      ->check(CLI::Range(0, 1 << 20));
  std::string stragglers = "report";
  app.add_option("--stragglers", stragglers,
                 "report a straggler, or replace it with a standby once it "
                 "has been slow for 16 steps (docs/gray-failures.md)")
      ->check(CLI::IsMember({"report", "replace"}));
  holdfast::control::DetectionOptions detection;
  int64_t heartbeat_ms =
      absl::ToInt64Milliseconds(detection.heartbeat_interval);
  int64_t silent_ms = absl::ToInt64Milliseconds(detection.silent_after);
  int64_t stall_floor_ms = absl::ToInt64Milliseconds(detection.stall_floor);
  int64_t scan_ms = 100;
  int64_t rendezvous_grace_ms =
      absl::ToInt64Milliseconds(detection.rendezvous_grace);
  int64_t rendezvous_timeout_ms =
      absl::ToInt64Milliseconds(detection.rendezvous_timeout);
  app.add_option("--heartbeat-interval-ms", heartbeat_ms,
                 "periodic report interval told to members")
      ->check(CLI::Range(int64_t{10}, int64_t{600000}));
  app.add_option("--silent-after-ms", silent_ms,
                 "declare a member silent after this long without a heartbeat")
      ->check(CLI::Range(int64_t{50}, int64_t{3600000}));
  int64_t lease_ms = -1;
  app.add_option("--lease-ms", lease_ms,
                 "a member with no word from the controller for this long "
                 "stops acting (no step completes); shorter than "
                 "--silent-after-ms; default two thirds of it, 0: none")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  app.add_option("--stall-factor", detection.stall_factor,
                 "stalled: step not advancing for this many median step times")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--stall-max-factor", detection.stall_max_factor,
                 "... and at least this many times the longest recent step")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--stall-floor-ms", stall_floor_ms,
                 "... and at least this long")
      ->check(CLI::Range(int64_t{10}, int64_t{86400000}));
  app.add_option("--scan-interval-ms", scan_ms,
                 "how often the silent, stall and absent detectors run")
      ->check(CLI::Range(int64_t{1}, int64_t{60000}));
  app.add_option("--rendezvous-grace-ms", rendezvous_grace_ms,
                 "leave out a member that does not come to a recovery's "
                 "rendezvous and does not answer, this long after the others "
                 "came")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--rendezvous-timeout-ms", rendezvous_timeout_ms,
                 "... and one that still heartbeats, after this long")
      ->check(CLI::Range(int64_t{10}, int64_t{86400000}));
  app.add_option("--gradient-outlier-factor", detection.gradient_outlier_factor,
                 "name a slot whose local gradient norm of a step is above "
                 "this many times the median of the others' (a bit flipped "
                 "in its gradients); 0: off")
      ->check(holdfast::control::CheckGradientOutlierFactor);
  int64_t quiet_ms = -1;
  app.add_option("--quiet-after-ms", quiet_ms,
                 "a member whose host agent has heard nothing from it for "
                 "this long is silent (a stopped or frozen process; -1: the "
                 "heartbeat interval and half of it, at least 250 ms more, "
                 "at most --silent-after-ms; 0: off)")
      ->check(CLI::Range(int64_t{-1}, int64_t{3600000}));
  int64_t exit_watch_ms =
      absl::ToInt64Milliseconds(detection.exit_watch_interval);
  app.add_option("--exit-watch-ms", exit_watch_ms,
                 "read /proc this often for the members on this machine: one "
                 "whose process begins to exit is declared crashed then, not "
                 "when its stream ends after its memory's teardown (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{10000}));
  int64_t push_merge_ms = absl::ToInt64Milliseconds(detection.push_merge);
  app.add_option("--push-merge-ms", push_merge_ms,
                 "generations opened within this of the last push go to the "
                 "members as one push (0: each at once)")
      ->check(CLI::Range(int64_t{0}, int64_t{10000}));
  std::string etcd;
  app.add_option("--etcd", etcd,
                 "run as one of several controllers: etcd's endpoints "
                 "(HOST:PORT or IP:PORT,IP:PORT,...); only the leader, elected "
                 "through an etcd lease, listens (docs/multi-node.md)");
  std::string election_key = "/holdfast/controller/leader";
  app.add_option("--election-key", election_key,
                 "with --etcd: the key the controllers race for (one per job)");
  std::string advertise;
  app.add_option("--advertise", advertise,
                 "with --etcd: the address the leader writes under the key "
                 "(default --bind:--port)");
  int lease_s = holdfast::control::ElectionOptions{}.ttl_s;
  app.add_option("--etcd-lease-s", lease_s,
                 "with --etcd: the leader's lease; a lost leader is replaced "
                 "this long after its last renewal. Keep it above twice "
                 "etcd's election timeout, or losing etcd's leader deposes "
                 "ours too")
      ->check(CLI::Range(1, 600));
  holdfast::TlsFiles tls_files;
  holdfast::tools::AddTlsFlags(app, &tls_files);
  CLI11_PARSE(app, argc, argv);
  detection.push_merge = absl::Milliseconds(push_merge_ms);
  detection.exit_watch_interval = absl::Milliseconds(exit_watch_ms);
  detection.rendezvous_grace = absl::Milliseconds(rendezvous_grace_ms);
  detection.rendezvous_timeout = absl::Milliseconds(rendezvous_timeout_ms);
  detection.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  detection.silent_after = absl::Milliseconds(silent_ms);
  if (lease_ms >= 0) detection.lease = absl::Milliseconds(lease_ms);
  if (quiet_ms >= 0) detection.quiet_after = absl::Milliseconds(quiet_ms);
  detection.stall_floor = absl::Milliseconds(stall_floor_ms);

  if (max_world != 0 && max_world < world_size) {
    std::fprintf(stderr,
                 "holdfast-controller: --max-world %d is below --world-size "
                 "%d (0: the world never grows)\n",
                 max_world, world_size);
    return 2;
  }
  auto token = holdfast::control::LoadToken(token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "holdfast-controller: %s\n",
                 std::string(token.status().message()).c_str());
    return 2;
  }
  // Block the stop signals before gRPC starts its threads, then wait here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  holdfast::control::ControllerOptions options;
  options.bind_address = bind;
  options.port = port;
  options.token = *token;
  if (!holdfast::tools::LoadTlsFlags("holdfast-controller", tls_files,
                                     &options.tls)) {
    return 2;
  }
  options.world_size = world_size;
  options.detection = detection;
  options.recovery.shrink = mode == "shrink";
  options.recovery.min_world = min_world;
  options.recovery.max_world = max_world;
  options.recovery.replace_stragglers = stragglers == "replace";
  options.scan_interval = absl::Milliseconds(scan_ms);
  options.metrics_port = metrics_port;
  if (!etcd.empty()) {
    holdfast::control::ElectionOptions eo;
    eo.endpoints = etcd;
    eo.key = election_key;
    eo.value = advertise.empty() ? absl::StrCat(bind, ":", port) : advertise;
    eo.ttl_s = lease_s;
    return LeadWhileElected(options, eo, stop);
  }
  auto server = holdfast::control::ControllerServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "holdfast-controller: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  if (!port_file.empty() &&
      !holdfast::WriteFileAtomically(port_file,
                                     absl::StrCat((*server)->port(), "\n"))) {
    std::fprintf(stderr, "holdfast-controller: cannot write --port-file %s\n",
                 port_file.c_str());
    return 1;
  }
  HOLDFAST_LOG_INFO("controller ready at {} for a world of {}",
                    (*server)->address(), world_size);
  if ((*server)->metrics_port() >= 0) {
    HOLDFAST_LOG_INFO("metrics at http://{}:{}/metrics", bind,
                      (*server)->metrics_port());
  }
  int sig = 0;
  sigwait(&stop, &sig);
  HOLDFAST_LOG_INFO("controller stopping ({})", strsignal(sig));
  (*server)->Shutdown();
  return 0;
}
