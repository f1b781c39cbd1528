// holdfast-agent: one per host, between that host's members and the job's
// controller (docs/controller.md, "Host agents"). The host's launcher starts
// it before the members and points their HOLDFAST_CONTROLLER at it.
//
//   holdfast-agent --controller HOST:PORT   (or HOLDFAST_CONTROLLER)
//                  [--listen unix:PATH | HOST:PORT]   (default 127.0.0.1:0)
//                  [--token-file FILE]     (or HOLDFAST_JOB_TOKEN)
//                  [--address-file FILE]   (the address members use)
//                  [--host NAME] [--flush-ms MS] [--quiet-after-ms MS]
//                  [--exit-watch-ms MS]
// SIGTERM or SIGINT is a restart: the controller keeps this host's members,
// which resume through the next agent at the same address. Its death by
// any other means (SIGKILL, a crash) is the loss of the host.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "src/common/file_util.h"
#include "src/common/logging.h"
#include "src/control/agent/agent.h"
#include "src/control/wire/auth.h"
#include "tools/tls_flags.h"

int main(int argc, char** argv) {
  CLI::App app{
      "holdfast host agent: carries one host's members' heartbeats "
      "to the job's controller on one stream"};
  holdfast::control::AgentOptions options;
  if (const char* c = std::getenv("HOLDFAST_CONTROLLER")) {
    options.controller = c;
  }
  app.add_option("--controller", options.controller,
                 "the controller's HOST:PORT (default: HOLDFAST_CONTROLLER)");
  app.add_option("--listen", options.listen,
                 "where members connect: unix:PATH, or HOST:PORT (port 0: any "
                 "free port)");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file whose first line is the job token (default: "
                 "HOLDFAST_JOB_TOKEN)");
  std::string address_file;
  app.add_option("--address-file", address_file,
                 "write the address members use to this file once serving");
  app.add_option("--host", options.host,
                 "this host's name for the controller (default: hostname)");
  int flush_ms = 0;
  app.add_option("--flush-ms", flush_ms,
                 "how long beats wait to be batched (0: the controller's "
                 "heartbeat interval)")
      ->check(CLI::Range(0, 60000));
  int64_t quiet_ms = 0;
  app.add_option("--quiet-after-ms", quiet_ms,
                 "report a member whose local stream is quiet this long, "
                 "a stopped or frozen process (0: the heartbeat interval "
                 "and half of it, at least 250 ms more; -1: never)")
      ->check(CLI::Range(int64_t{-1}, int64_t{3600000}));
  int64_t exit_watch_ms =
      absl::ToInt64Milliseconds(options.exit_watch_interval);
  app.add_option("--exit-watch-ms", exit_watch_ms,
                 "read /proc this often for the members: one whose process "
                 "begins to exit is reported then, not when its stream ends "
                 "after its memory's teardown (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{10000}));
  holdfast::TlsFiles tls_files;
  holdfast::tools::AddTlsFlags(app, &tls_files);
  CLI11_PARSE(app, argc, argv);
  options.flush_interval = absl::Milliseconds(flush_ms);
  options.exit_watch_interval = absl::Milliseconds(exit_watch_ms);
  options.quiet_after =
      quiet_ms < 0 ? absl::InfiniteDuration() : absl::Milliseconds(quiet_ms);

  auto token = holdfast::control::LoadToken(token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "holdfast-agent: %s\n",
                 std::string(token.status().message()).c_str());
    return 2;
  }
  options.token = *token;
  if (!holdfast::tools::LoadTlsFlags("holdfast-agent", tls_files,
                                     &options.tls)) {
    return 2;
  }
  if (options.controller.empty()) {
    std::fprintf(stderr,
                 "holdfast-agent: no controller address (--controller or "
                 "HOLDFAST_CONTROLLER)\n");
    return 2;
  }
  // Block the stop signals before gRPC starts its threads, then wait here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto agent = holdfast::control::HostAgent::Start(options);
  if (!agent.ok()) {
    std::fprintf(stderr, "holdfast-agent: %s\n",
                 agent.status().ToString().c_str());
    return 1;
  }
  if (!address_file.empty() && !holdfast::WriteFileAtomically(
                                   address_file, (*agent)->address() + "\n")) {
    std::fprintf(stderr, "holdfast-agent: cannot write --address-file %s\n",
                 address_file.c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  HOLDFAST_LOG_INFO("host agent restarting ({}): handing its {} members over",
                    strsignal(sig), (*agent)->members());
  (*agent)->Handover();
  return 0;
}
