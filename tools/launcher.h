// holdfast-run's launcher (tools/run_main.cc has the command): the
// embedded controller, the processes it starts, their output, and the
// summary of the job. One Launcher per process; not thread-safe.
#ifndef HOLDFAST_TOOLS_LAUNCHER_H_
#define HOLDFAST_TOOLS_LAUNCHER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/control/agent/agent.h"
#include "src/control/controller/membership.h"
#include "src/control/controller/server.h"
#include "src/control/member/client.h"
#include "tools/nodes.h"
#include "tools/timeline.h"

namespace holdfast::run {

using control::StatusResponse;
using nlohmann::json;

// The last SIGINT or SIGTERM (0: none), set by OnSignal.
extern std::atomic<int> g_signal;
void OnSignal(int sig);

// The label of a process the controller does not know yet.
inline constexpr char kStarting[] = "starting";

struct Proc {
  int index = 0;
  int slot = -1;     // the slot it asks for; -1: a standby
  std::string host;  // its host label ("": this machine's name)
  pid_t pid = -1;
  int out_fd = -1;  // its stdout
  int err_fd = -1;  // its stderr
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;  // wait status
  std::string label = kStarting;
  std::ofstream log;
};

// A command is runnable: a path with '/', or a name found on PATH.
bool Resolves(const std::string& cmd);
std::string DescribeExit(int status);

// The command line (see tools/run_main.cc).
struct Flags {
  int n = -1;  // -1: not given
  int standby = 0, min_world = 1, hosts = 0, replicas = 0;
  int max_world = -1;  // -1: the default (Launcher::CheckFlags)
  std::string checkpoint_dir, verify_backups, log_dir;
  int64_t checkpoint_every = 0;
  std::string mode = "replace";
  std::string stragglers = "report";
  std::vector<std::string> inject;
  int64_t heartbeat_ms = 500, silent_ms = 3000, join_timeout_s = 60;
  int64_t exit_watch_ms = 5;
  int64_t rendezvous_grace_ms = 1000;
  double gradient_outlier_factor = 1000.0;
  bool no_disk_tier = false, fresh = false;
  bool agent = false;  // members reach the controller through host agents
  // The control plane's TLS files (--tls-*, else HOLDFAST_TLS_*); none on
  // one machine: a private CA made here, unless no_tls.
  TlsFiles tls;
  bool no_tls = false;
  // Many nodes (tools/nodes.h): set by --nnodes, --rdzv-endpoint or
  // HOLDFAST_RDZV_ENDPOINT.
  NodeFlags nodes;
  // A node gives up once the controller has not answered for this long.
  int64_t controller_timeout_s = 60;
};

// holdfast-run's exit codes. When several apply, the first in this
// order wins: kExitStopped, kExitReplicasDiffer, kExitWorkerExit,
// kExitStandbyFailed; summary.json's "problems" lists every one.
inline constexpr int kExitOk = 0;          // finished; everything below held
inline constexpr int kExitFailed = 1;      // the job could not run
inline constexpr int kExitUsage = 2;       // bad command line
inline constexpr int kExitStopped = 3;     // the controller stopped the job
inline constexpr int kExitWorkerExit = 4;  // a finished worker exited != 0
inline constexpr int kExitReplicasDiffer = 5;  // replicated state differs
inline constexpr int kExitStandbyFailed = 6;   // a standby in a slot failed

class Launcher {
 public:
  int Main(int argc, char** argv);

 private:
  // run_main.cc: the steps of Main.
  // Parses the command line into `f`; an exit code when Main is done
  // (help, or a parse error).
  std::optional<int> ParseFlags(int argc, char** argv, Flags* f);
  // Refuses bad flags by name (exit code 2), and chooses the disk tier
  // and the log directory; `faults` gets the joined --inject list.
  std::optional<int> CheckFlags(const Flags& f, std::string* faults);
  // The environment of process `p`.
  std::vector<std::string> ProcEnv(const Flags& f, const Proc& p,
                                   const std::string& token,
                                   const std::string& faults) const;
  // Process `i`'s host label (--hosts), or "" for this machine's name.
  static std::string HostOf(const Flags& f, int i);
  // The processes this launcher starts, standbys first: {slot, host}.
  std::vector<std::pair<int, std::string>> LocalProcesses(const Flags& f) const;
  // Whether member `m` is one of this node's processes (on one machine:
  // every member).
  bool OnThisNode(const control::MemberInfo& m) const;

  // launcher_nodes.cc: many nodes.
  // Serves the controller: on one machine always, on loopback; on many
  // nodes when the rendezvous endpoint is this node's and nobody serves it
  // yet. Sets client_ to reach it.
  absl::Status StartController(const Flags& f, const std::string& token);
  // Many nodes: waits for the controller, checks the rendezvous id and
  // this node's name, and gives the node its rank and layout. A clear
  // error for a wrong token or id, a name already in the job, or a job
  // with its most nodes already.
  absl::Status JoinNodes(const Flags& f);
  // Many nodes, at the end: a node tells the controller it is done; the
  // node serving it waits (bounded) until every live node has.
  void FinishNodes(const StatusResponse& last);
  // With --agent: a host agent for each host label, in this process.
  // The control plane's TLS (docs/security.md): the files given, else on
  // one machine a private CA's, made in a private directory; loads them
  // into client_.tls.
  absl::Status SetUpTls(const Flags& f);
  absl::Status StartAgents(const Flags& f, const std::string& token);
  absl::Status StartAgent(const Flags& f, const std::string& host,
                          const std::string& token);
  // The start-up line: where the controller is, what runs here.
  void PrintStart(const Flags& f, const std::string& faults) const;
  // Starts the standbys and the workers, and lets the workers join once
  // the standbys have registered (HOLDFAST_START_GATE_FD).
  absl::Status SpawnAll(const Flags& f, const std::string& token,
                        const std::string& faults);
  // Watches the job until it ends, every process is gone, or a signal;
  // the outcome and why, and the controller's last view in `last`.
  std::pair<std::string, std::string> Watch(const Flags& f,
                                            StatusResponse* last);
  // Lets the processes finish, then ends those that do not.
  void StopAll(const std::string& outcome);

  absl::Status Spawn(Proc& p, const std::vector<std::string>& env_extra);
  // Pumps output until `k` standbys are registered. DeadlineExceeded at
  // `deadline`, Unavailable if a standby process exits first.
  absl::Status AwaitStandbys(int k, absl::Time deadline);
  void Pump(absl::Duration timeout);
  void Emit(Proc& p, std::string& buf, bool is_err, bool flush_all);
  void RefreshLabels(const StatusResponse& s);
  // Asks the controller for labels (at most every 20 ms): a process still
  // labeled "starting" may have registered, or even finished, since the
  // last poll.
  void RefreshLabelsNow();
  json Summary(const StatusResponse& s, const std::string& outcome,
               const std::string& reason);
  // The exit code for the job's end (see kExitOk); adds "exit_code" and
  // "problems" (what each non-zero code found) to `summary`.
  int Judge(const StatusResponse& s, json* summary) const;
  void PrintSummary(const json& j);
  // With --log-dir: the verdict of `holdfast diagnose` on each incident's
  // generation, as the incident's "offline_diagnosis" (tools/diagnose.h),
  // beside the controller's own ("diagnosis").
  void AddDiagnoses(json* summary) const;
  // The controller's view, with members and every incident kept.
  absl::StatusOr<StatusResponse> FetchJob() const;
  void KillAll(int sig);
  bool AllExited() const;
  void Reap();
  // DIR/members.json (with --log-dir): the launcher's processes (pid,
  // exit) and the controller's members (pid, role, slot, state, host), for
  // tools that act on processes from outside (holdfast-chaos). Replaced
  // atomically at every status poll.
  void WriteMembers(const StatusResponse& s);
  // Chooses the disk tier's directory (see --checkpoint-dir) and locks it;
  // an empty string when it is off. Usage errors name the problem.
  absl::StatusOr<std::string> ChooseCheckpointDir(const std::string& flag,
                                                  bool off, bool fresh);

  std::vector<std::string> cmd_;
  std::vector<std::unique_ptr<Proc>> procs_;
  holdfast::control::ClientOptions client_;
  // --agent: each host label's agent ("": this machine's name).
  std::map<std::string, std::unique_ptr<holdfast::control::HostAgent>> agents_;
  absl::Time start_;
  std::string log_dir_;
  std::string checkpoint_dir_;           // empty: no disk tier
  bool default_checkpoint_dir_ = false;  // chosen here, removed on success
  int n_ = 0;                            // the job's slots at the start
  int max_world_ = 0;                    // the world grows up to it
  std::unique_ptr<control::ControllerServer> server_;  // when served here
  std::optional<NodePlan> plan_;                       // many nodes
  NodeLayout layout_;  // this node's slots (many nodes)
  // HOLDFAST_BIND_ADDR for the members (many nodes, when not set): this
  // node's address toward the controller.
  std::string bind_addr_;
  // The job's TLS files (empty: plain TCP), and the private directory
  // holding the ones made here (removed at the end).
  TlsFiles tls_files_;
  std::string tls_dir_;
  absl::Time next_label_fetch_ = absl::InfinitePast();
  Timeline timeline_;  // DIR/timeline.html (with --log-dir)
};

}  // namespace holdfast::run

#endif  // HOLDFAST_TOOLS_LAUNCHER_H_
