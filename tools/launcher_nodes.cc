// holdfast-run's steps for many nodes (tools/nodes.h has the plan) and
// the controller it serves.
#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "holdfast/status.h"
#include "tools/launcher.h"
#include "tools/tls_ca.h"

namespace holdfast::run {
namespace {

// The launchers' own keys in the controller's store.
constexpr char kRdzvIdKey[] = "holdfast-run/rdzv-id";
constexpr char kNodeCountKey[] = "holdfast-run/nodes";
constexpr char kNodesDoneKey[] = "holdfast-run/nodes-done";

bool IsNumericAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

absl::Status Launcher::SetUpTls(const Flags& f) {
  TlsFiles files = f.tls;
  if (f.no_tls) {
    files = TlsFiles();
  } else if (files.empty() && plan_) {
    std::fprintf(stderr,
                 "holdfast-run: warning: the control plane is plain TCP: "
                 "give every node the job's --tls-ca, --tls-cert and "
                 "--tls-key (docs/security.md)\n");
  } else if (files.empty()) {
    // One machine: a private CA, in a directory only this user reads.
    char dir[] = "/tmp/holdfast-tls-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot make a directory for the job's certificates "
                       "under /tmp: ",
                       std::strerror(errno)));
    }
    tls_dir_ = dir;
    HOLDFAST_ASSIGN_OR_RETURN(files, MakeJobCertificates(tls_dir_, {}));
  }
  HOLDFAST_ASSIGN_OR_RETURN(client_.tls, control::LoadTls(files));
  tls_files_ = files;
  return absl::OkStatus();
}

absl::Status Launcher::StartController(const Flags& f,
                                       const std::string& token) {
  control::ControllerOptions co;
  co.token = token;
  co.tls = client_.tls;
  co.world_size = n_;
  co.recovery.shrink = f.mode == "shrink";
  co.recovery.min_world = f.min_world;
  co.recovery.max_world = max_world_;
  co.recovery.replace_stragglers = f.stragglers == "replace";
  co.detection.heartbeat_interval = absl::Milliseconds(f.heartbeat_ms);
  co.detection.silent_after = absl::Milliseconds(f.silent_ms);
  co.detection.exit_watch_interval = absl::Milliseconds(f.exit_watch_ms);
  co.detection.gradient_outlier_factor = f.gradient_outlier_factor;
  co.detection.rendezvous_grace = absl::Milliseconds(f.rendezvous_grace_ms);
  if (plan_ && !plan_->controllers.empty()) {
    // Elected controllers (holdfast-controller --etcd): every node joins
    // whichever leads.
    client_.address = plan_->controllers;
    return absl::OkStatus();
  }
  if (plan_) {
    const std::string& host = plan_->host;
    client_.address = absl::StrCat(host.find(':') != std::string::npos
                                       ? absl::StrCat("[", host, "]")
                                       : host,
                                   ":", plan_->port);
    // The node that can bind the endpoint serves it; the others (and
    // every node, when a holdfast-controller serves it) join it.
    if (!CanBind(host, plan_->port)) return absl::OkStatus();
    // A name may resolve to loopback on its own machine (Debian's
    // 127.0.1.1): serve every interface then.
    co.bind_address = IsNumericAddress(host) ? host : "0.0.0.0";
    co.port = plan_->port;
    absl::StatusOr<std::unique_ptr<control::ControllerServer>> server =
        control::ControllerServer::Start(co);
    // Another launcher on this machine won the race: join it.
    if (!server.ok()) return absl::OkStatus();
    server_ = std::move(*server);
    return absl::OkStatus();
  }
  HOLDFAST_ASSIGN_OR_RETURN(server_, control::ControllerServer::Start(co));
  client_.address = server_->address();
  return absl::OkStatus();
}

absl::Status Launcher::JoinNodes(const Flags& f) {
  const absl::Time deadline = absl::Now() + absl::Seconds(f.join_timeout_s);
  absl::StatusOr<StatusResponse> st = FetchJob();
  while (!st.ok()) {
    if (absl::IsUnauthenticated(st.status())) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the controller at ", client_.address,
          " refused this node's job token: every node needs the same "
          "--rdzv-id and HOLDFAST_JOB_TOKEN (is another job using this "
          "endpoint?)"));
    }
    if (absl::Now() > deadline || g_signal != 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no controller answered at ", client_.address,
          " within --join-timeout-s ", f.join_timeout_s,
          " s (is the node that serves --rdzv-endpoint up, and is the "
          "endpoint its address?): ",
          st.status().message()));
    }
    absl::SleepFor(absl::Milliseconds(200));
    st = FetchJob();
  }
  HOLDFAST_ASSIGN_OR_RETURN(std::shared_ptr<control::ControllerStore> store,
                            control::ControllerStore::Connect(client_));
  HOLDFAST_ASSIGN_OR_RETURN(
      auto id, store->CompareAndSet(kRdzvIdKey, "", /*expect_absent=*/true,
                                    plan_->rdzv_id));
  if (id.second != plan_->rdzv_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the controller at ", client_.address, " serves rendezvous '",
        id.second, "', not --rdzv-id '", plan_->rdzv_id, "'"));
  }
  std::set<std::string> live_nodes;
  for (const control::MemberInfo& m : st->members()) {
    if (m.state() == control::STATE_ALIVE) live_nodes.insert(m.host());
  }
  if (live_nodes.count(plan_->node_name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "a node named '", plan_->node_name,
        "' is in the job already: give each node its own name (HOLDFAST_HOST "
        "or its hostname)"));
  }
  if (static_cast<int>(live_nodes.size()) >= plan_->max_nodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job has its most nodes already (--nnodes ",
                     plan_->min_nodes, ":", plan_->max_nodes, ", ",
                     live_nodes.size(), " live): this node is not needed"));
  }
  if (plan_->node_rank < 0) {
    HOLDFAST_ASSIGN_OR_RETURN(const int64_t count,
                              store->Add(kNodeCountKey, 1));
    plan_->node_rank = static_cast<int>(count - 1);
  }
  layout_ = LayoutOf(*plan_, plan_->node_rank);
  // The members' links bind to this node's address toward the controller
  // unless told otherwise, not to loopback.
  if (RealEnv("HOLDFAST_BIND_ADDR").empty()) {
    bind_addr_ = LocalAddressToward(plan_->host, plan_->port);
  }
  return absl::OkStatus();
}

void Launcher::FinishNodes(const StatusResponse& last) {
  auto store = control::ControllerStore::Connect(client_);
  if (!store.ok()) return;
  if (!server_) {
    (void)(*store)->Add(kNodesDoneKey, 1);  // best effort
    return;
  }
  // The other nodes read the job's end from this controller: keep serving
  // until each node still in the job has, or a bounded while.
  std::set<std::string> others;
  for (const control::MemberInfo& m : last.members()) {
    if (m.host() != plan_->node_name && m.state() != control::STATE_DEAD) {
      others.insert(m.host());
    }
  }
  const absl::Time until = absl::Now() + absl::Seconds(15);
  while (absl::Now() < until && g_signal == 0) {
    auto done = (*store)->Add(kNodesDoneKey, 0);
    if (done.ok() && *done >= static_cast<int64_t>(others.size())) return;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace holdfast::run
