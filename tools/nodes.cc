#include "tools/nodes.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "src/checkpoint/pieces.h"

namespace holdfast::run {
namespace {

constexpr int kMaxNodes = 4096;

absl::Status Bad(const std::string& msg) {
  return absl::InvalidArgumentError(msg);
}

// "N" or "MIN:MAX" into plan's bounds.
absl::Status ParseNnodes(const std::string& text, NodePlan* plan) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  int lo = 0, hi = 0;
  const bool ok = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &lo) &&
                  absl::SimpleAtoi(parts.back(), &hi);
  if (!ok || lo < 1 || hi < lo || hi > kMaxNodes) {
    return Bad(absl::StrCat(
        "--nnodes '", text,
        "': give N or MIN:MAX with 1 <= MIN <= MAX <= ", kMaxNodes));
  }
  plan->min_nodes = lo;
  plan->max_nodes = hi;
  return absl::OkStatus();
}

// HOST:PORT, [V6]:PORT, or a list of them (the first is parsed).
absl::Status ParseEndpoint(const std::string& endpoint, NodePlan* plan) {
  const std::string text = endpoint.substr(0, endpoint.find(','));
  if (text.size() != endpoint.size()) plan->controllers = endpoint;
  const size_t colon = text.rfind(':');
  std::string host = colon == std::string::npos ? "" : text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (host.empty() || !absl::SimpleAtoi(text.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return Bad(absl::StrCat("--rdzv-endpoint '", endpoint,
                            "': give HOST:PORT with a port in [1, 65535], or "
                            "a list IP:PORT,IP:PORT of elected controllers"));
  }
  plan->host = host;
  plan->port = port;
  return absl::OkStatus();
}

// Fills what the flags left open from Slurm's variables (one holdfast-run
// per node, as `srun --ntasks-per-node=1` starts it).
absl::Status ApplySlurm(const EnvFn& env, NodeFlags* f, NodePlan* plan) {
  const std::string job = env("SLURM_JOB_ID");
  if (job.empty()) return absl::OkStatus();
  const std::string tasks = env("SLURM_NTASKS"), nodes = env("SLURM_NNODES");
  int ntasks = 0, nnodes = 0;
  if (absl::SimpleAtoi(tasks, &ntasks) && absl::SimpleAtoi(nodes, &nnodes) &&
      ntasks > nnodes && f->node_rank < 0) {
    return Bad(absl::StrCat(
        "Slurm started ", ntasks, " tasks on ", nnodes,
        " nodes: run one holdfast-run per node (srun --ntasks-per-node=1); "
        "it starts the node's processes itself"));
  }
  std::vector<std::string> used;
  if (f->nnodes.empty() && !nodes.empty()) {
    f->nnodes = nodes;
    used.push_back("SLURM_NNODES");
  }
  if (f->node_rank < 0 && !env("SLURM_NODEID").empty()) {
    if (!absl::SimpleAtoi(env("SLURM_NODEID"), &f->node_rank)) {
      return Bad(absl::StrCat("SLURM_NODEID '", env("SLURM_NODEID"),
                              "' is not a number"));
    }
    used.push_back("SLURM_NODEID");
  }
  if (f->rdzv_id.empty()) {
    f->rdzv_id = job;
    used.push_back("SLURM_JOB_ID");
  }
  if (env("HOLDFAST_HOST").empty() && !env("SLURMD_NODENAME").empty()) {
    plan->node_name = env("SLURMD_NODENAME");
    used.push_back("SLURMD_NODENAME");
  }
  for (const std::string& u : used) {
    absl::StrAppend(&plan->from_slurm, plan->from_slurm.empty() ? "" : ", ", u);
  }
  return absl::OkStatus();
}

}  // namespace

std::string RealEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

bool WantsNodes(const NodeFlags& f, const EnvFn& env) {
  return !f.nnodes.empty() || !f.rdzv_endpoint.empty() ||
         !env("HOLDFAST_RDZV_ENDPOINT").empty();
}

absl::StatusOr<NodePlan> PlanNodes(const NodeFlags& flags, const EnvFn& env) {
  NodeFlags f = flags;
  NodePlan plan;
  if (absl::Status s = ApplySlurm(env, &f, &plan); !s.ok()) return s;
  if (f.nnodes.empty()) f.nnodes = "1";
  if (absl::Status s = ParseNnodes(f.nnodes, &plan); !s.ok()) return s;
  if (f.nproc_per_node < 1 || f.nproc_per_node > 4096) {
    return Bad(absl::StrCat(
        "--nproc-per-node ",
        f.nproc_per_node < 0
            ? "is required with --nnodes or --rdzv-endpoint"
            : absl::StrCat(f.nproc_per_node, " is out of range [1, 4096]")));
  }
  plan.nproc_per_node = f.nproc_per_node;
  plan.standby_per_node = f.standby_per_node < 0 ? 0 : f.standby_per_node;
  if (plan.standby_per_node > 4096) {
    return Bad(absl::StrCat("--standby-per-node ", plan.standby_per_node,
                            " is out of range [0, 4096]"));
  }
  if (f.node_rank >= plan.max_nodes) {
    return Bad(absl::StrCat("--node-rank ", f.node_rank,
                            " is not below the most nodes, ", plan.max_nodes));
  }
  plan.node_rank = f.node_rank;
  std::string endpoint = f.rdzv_endpoint;
  if (endpoint.empty()) endpoint = env("HOLDFAST_RDZV_ENDPOINT");
  if (endpoint.empty()) {
    return Bad(
        "--rdzv-endpoint HOST:PORT is required with --nnodes: the address of "
        "the job's controller, the same on every node (docs/multi-node.md)");
  }
  if (absl::Status s = ParseEndpoint(endpoint, &plan); !s.ok()) return s;
  if (f.rdzv_id.empty()) {
    return Bad(
        "--rdzv-id is required with --nnodes: the job's name, the same on "
        "every node (under Slurm, SLURM_JOB_ID)");
  }
  plan.rdzv_id = f.rdzv_id;
  if (plan.node_name.empty()) plan.node_name = env("HOLDFAST_HOST");
  if (plan.node_name.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    plan.node_name = name;
  }
  return plan;
}

NodeLayout LayoutOf(const NodePlan& plan, int node_rank) {
  NodeLayout l;
  l.standbys = plan.standby_per_node;
  if (node_rank < plan.min_nodes) {
    l.first_slot = node_rank * plan.nproc_per_node;
    l.workers = plan.nproc_per_node;
  } else {
    l.standbys += plan.nproc_per_node;
  }
  return l;
}

namespace {

// The addresses of HOST (numeric or a name), for `type` sockets.
std::vector<sockaddr_storage> Resolve(const std::string& host, int port,
                                      int type, std::vector<socklen_t>* lens) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = type;
  addrinfo* res = nullptr;
  std::vector<sockaddr_storage> out;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) !=
      0) {
    return out;
  }
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, a->ai_addr, a->ai_addrlen);
    out.push_back(ss);
    lens->push_back(a->ai_addrlen);
  }
  freeaddrinfo(res);
  return out;
}

}  // namespace

bool CanBind(const std::string& host, int port) {
  std::vector<socklen_t> lens;
  std::vector<sockaddr_storage> addrs = Resolve(host, port, SOCK_STREAM, &lens);
  for (size_t i = 0; i < addrs.size(); ++i) {
    const int fd = socket(addrs[i].ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // As the controller binds (gRPC sets it): connections of an earlier
    // job on the port, in TIME_WAIT for a minute, do not count; a
    // listener does.
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound =
        bind(fd, reinterpret_cast<sockaddr*>(&addrs[i]), lens[i]) == 0;
    close(fd);
    if (bound) return true;
  }
  return false;
}

std::string LocalAddressToward(const std::string& host, int port) {
  std::vector<socklen_t> lens;
  std::vector<sockaddr_storage> addrs = Resolve(host, port, SOCK_DGRAM, &lens);
  for (size_t i = 0; i < addrs.size(); ++i) {
    const int fd = socket(addrs[i].ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const bool ok =
        connect(fd, reinterpret_cast<sockaddr*>(&addrs[i]), lens[i]) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    close(fd);
    if (!ok) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* src =
        local.ss_family == AF_INET
            ? static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    if (inet_ntop(local.ss_family, src, text, sizeof(text)) != nullptr) {
      return text;
    }
  }
  return "";
}

std::string TokenFromRdzvId(absl::string_view rdzv_id) {
  const std::string key = absl::StrCat("holdfast-rdzv\n", rdzv_id);
  return absl::StrFormat("rdzv-%016x",
                         holdfast::pieces::Checksum(key.data(), key.size()));
}

}  // namespace holdfast::run
