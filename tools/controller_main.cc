// holdfast-controller: one per job. Serves the rendezvous key-value store
// over gRPC (membership, heartbeats and failure detection come next).
//
//   holdfast-controller --world-size N [--port 29400] [--bind 127.0.0.1]
//                       [--token-file FILE]   (or HOLDFAST_JOB_TOKEN)
//                       [--port-file FILE]    (the bound port, for --port 0)
// Runs until SIGINT or SIGTERM. Logs to stderr with timestamps; the token is
// never logged.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "src/common/logging.h"
#include "src/control/auth.h"
#include "src/control/server.h"

int main(int argc, char** argv) {
  CLI::App app{"holdfast controller: rendezvous store for one job"};
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
  CLI11_PARSE(app, argc, argv);

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
  auto server = holdfast::control::ControllerServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "holdfast-controller: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  if (!port_file.empty()) {
    // Write then rename, so a reader never sees a partial number.
    const std::string tmp = port_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fprintf(f, "%d\n", (*server)->port()) < 0 ||
        std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      std::fprintf(stderr, "holdfast-controller: cannot write --port-file %s\n",
                   port_file.c_str());
      return 1;
    }
  }
  HOLDFAST_LOG_INFO("controller ready at {} for a world of {}",
                    (*server)->address(), world_size);
  int sig = 0;
  sigwait(&stop, &sig);
  HOLDFAST_LOG_INFO("controller stopping ({})", strsignal(sig));
  (*server)->Shutdown();
  return 0;
}
