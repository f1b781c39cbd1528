// holdfast-run across machines: the same command on every node, with
// torchrun's flags (--nnodes, --nproc-per-node, --node-rank,
// --rdzv-endpoint, --rdzv-id) or Slurm's environment. docs/multi-node.md
// has the user's view; this file has the pure parts (flags, Slurm, the
// node's place in the job) and the few socket probes they need.
#ifndef HOLDFAST_TOOLS_NODES_H_
#define HOLDFAST_TOOLS_NODES_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace holdfast::run {

// What the command line (or Slurm) said about the nodes. Unset fields are
// -1 or empty.
struct NodeFlags {
  std::string nnodes;         // "N" or "MIN:MAX"
  int nproc_per_node = -1;    // worker slots per node
  int standby_per_node = -1;  // standbys per node (default 0)
  int node_rank = -1;         // -1: assigned at rendezvous
  std::string rdzv_endpoint;  // HOST:PORT of the controller
  std::string rdzv_id;        // the job's name, the same on every node
};

// The settings of one node, resolved and checked.
struct NodePlan {
  int min_nodes = 1, max_nodes = 1;
  int nproc_per_node = 1;
  int standby_per_node = 0;
  int node_rank = -1;  // -1: assigned at rendezvous
  std::string host;    // the endpoint's host
  int port = 0;        // and port
  // Several controllers' addresses (IP:PORT,IP:PORT: the elected leader
  // listens; docs/multi-node.md), else empty; host and port are the
  // first's.
  std::string controllers;
  std::string rdzv_id;
  std::string node_name;  // the host label of this node's processes
  // Slurm's variables that filled a gap, for the start-up line.
  std::string from_slurm;

  int world_size() const { return min_nodes * nproc_per_node; }
};

// Reads an environment variable; "" when unset. Injectable for tests.
using EnvFn = std::function<std::string(const char*)>;
std::string RealEnv(const char* name);

// Whether the command line asks for a multi-node job: --nnodes,
// --rdzv-endpoint or HOLDFAST_RDZV_ENDPOINT.
bool WantsNodes(const NodeFlags& f, const EnvFn& env);

// Resolves `f` with the environment: HOLDFAST_RDZV_ENDPOINT for the
// endpoint; under Slurm, SLURM_NNODES, SLURM_NODEID, SLURM_JOB_ID and
// SLURMD_NODENAME for --nnodes, --node-rank, --rdzv-id and the node name;
// otherwise HOLDFAST_HOST or the machine's name. InvalidArgument naming
// the flag for anything missing or malformed.
absl::StatusOr<NodePlan> PlanNodes(const NodeFlags& f, const EnvFn& env);

// A node's slots: node rank r below min_nodes works slots
// r*nproc_per_node..; at or above it the node is spare capacity and all
// its processes are standbys. `first_slot` -1 for a spare node.
struct NodeLayout {
  int first_slot = -1;
  int workers = 0;
  int standbys = 0;
};
NodeLayout LayoutOf(const NodePlan& plan, int node_rank);

// Whether HOST:PORT can be bound on this machine (the endpoint names this
// node, and nobody serves it yet). Binds a probe socket and closes it.
bool CanBind(const std::string& host, int port);

// This machine's address on the route to HOST:PORT (a UDP connect, which
// sends nothing); "" if it has none.
std::string LocalAddressToward(const std::string& host, int port);

// The job token for nodes that were given none (HOLDFAST_JOB_TOKEN): one
// derived from the rendezvous id. It keeps a job from joining another by
// mistake; it is no secret (docs/multi-node.md).
std::string TokenFromRdzvId(absl::string_view rdzv_id);

}  // namespace holdfast::run

#endif  // HOLDFAST_TOOLS_NODES_H_
