// The decisions of holdfast-chaos, apart from its processes: which faults
// to inject next into a running job (bounded by what the job's replication
// can cover), and what one run's outcome means. Pure functions of their
// inputs, so tests can check the bounds and verdicts without a job.
#ifndef HOLDFAST_TOOLS_CHAOS_H_
#define HOLDFAST_TOOLS_CHAOS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace holdfast::chaos {

// One live process of the job, as holdfast-run's members.json shows it.
struct Member {
  std::string id;
  int64_t pid = 0;
  bool worker = false;  // else a standby
  int slot = -1;
  std::string host;
};

// The live members of members.json (state alive, role worker or standby).
std::vector<Member> LiveMembers(const nlohmann::json& members_json);

enum class Kind {
  kKill,     // SIGKILL one worker
  kStop,     // SIGSTOP one worker; SIGCONT once it is fenced
  kStandby,  // SIGKILL one standby
  kHost,     // SIGKILL every worker of one host (--hosts)
};
const char* KindName(Kind k);

struct Fault {
  Kind kind = Kind::kKill;
  std::vector<int64_t> pids;
  std::vector<std::string> members;  // their member ids
  std::vector<int> slots;            // -1 for a standby
  std::string domain;                // the failure domain it takes out
  int64_t delay_ms = 0;              // after the cluster's first fault
};

struct PlanOptions {
  int replicas = 1;
  // Worker hosts are failure domains (holdfast-run --hosts); without, each
  // worker is its own.
  bool hosts = false;
  // Chance that the next event is a cluster of two or three faults within
  // `cluster_ms`.
  double cluster_chance = 0.4;
  int64_t cluster_ms = 1000;
};

// The next cluster of faults for a job whose live members are `live`
// (one fault, or two or three within cluster_ms). Bounded so the job can
// survive it: at most `replicas` failure domains of workers lost, never
// every domain that holds workers, and no more workers lost (killed,
// stopped) and standbys killed together than there are standbys to take
// the lost slots. Empty when no fault fits (no standby left).
std::vector<Fault> PlanCluster(std::mt19937_64& rng,
                               const std::vector<Member>& live,
                               const PlanOptions& options);

// What one faulty run came to.
struct Verdict {
  bool hang = false;       // not done within the bound
  bool job_lost = false;   // ended without finishing
  bool divergent = false;  // finished in the full world with another state
  bool shrunk = false;     // finished in a smaller world: not compared
  std::string why;         // for the report; empty when all is well
};

// `timed_out`: the run was killed at the hang bound. `summary`: its
// summary.json (discarded when unreadable). `reference`: the fault-free
// run's state_hash. `n`: the world it started with.
Verdict Judge(bool timed_out, const nlohmann::json& summary,
              const std::string& reference, int n);

}  // namespace holdfast::chaos

#endif  // HOLDFAST_TOOLS_CHAOS_H_
