#include "src/control/etcd/election.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "src/common/logging.h"
#include "src/control/etcd/etcd.grpc.pb.h"
#include "src/control/wire/target.h"

namespace holdfast::control {
namespace {

namespace pb = etcdserverpb;

absl::Status FromGrpc(const grpc::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("etcd ", what, ": ", s.error_message()));
}

class ElectionImpl final : public Election {
 public:
  explicit ElectionImpl(const ElectionOptions& o) : options_(o) { Connect(); }

  ~ElectionImpl() override { Resign(); }

  absl::StatusOr<int64_t> Campaign(const std::function<bool()>& stop) override {
    absl::Time next_word = absl::Now() + absl::Seconds(5);
    absl::Time answered = absl::Now();
    for (;;) {
      if (stop()) return absl::CancelledError("campaign stopped");
      absl::StatusOr<std::string> leader = Leader();
      absl::Status why = leader.status();
      // A channel whose every address refused keeps failing for a while
      // after etcd is up: start afresh.
      if (leader.ok()) {
        answered = absl::Now();
      } else if (absl::Now() - answered > absl::Seconds(1)) {
        Connect();
        answered = absl::Now();
      }
      if (leader.ok() && leader->empty()) {
        absl::StatusOr<int64_t> epoch = TryLead();
        if (epoch.ok()) return epoch;
        why = epoch.status();
      }
      if (!why.ok() && !absl::IsAlreadyExists(why) && absl::Now() > next_word) {
        HOLDFAST_LOG_WARN("election: etcd does not answer yet: {}",
                          why.ToString());
        next_word = absl::Now() + absl::Seconds(5);
      }
      absl::SleepFor(options_.poll_every);
    }
  }

  bool Leading() const override {
    absl::MutexLock l(&mu_);
    return lease_id_ != 0 && absl::Now() < valid_until_;
  }

  void Resign() override {
    int64_t id = 0;
    {
      absl::MutexLock l(&mu_);
      id = lease_id_;
      lease_id_ = 0;
      valid_until_ = absl::InfinitePast();
    }
    stop_renewing_ = true;
    if (renewer_.joinable()) renewer_.join();
    stop_renewing_ = false;
    if (id != 0) RevokeLease(id);
  }

  absl::StatusOr<std::string> Leader() override {
    pb::RangeRequest req;
    req.set_key(options_.key);
    pb::RangeResponse resp;
    auto ctx = Context(absl::Seconds(1));
    if (absl::Status s = FromGrpc(kv_->Range(ctx.get(), req, &resp), "Range");
        !s.ok()) {
      return s;
    }
    return resp.kvs().empty() ? std::string() : resp.kvs(0).value();
  }

 private:
  // A new channel and stubs; only while the renewer does not run.
  void Connect() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    auto channel =
        grpc::CreateCustomChannel(ChannelTarget(options_.endpoints),
                                  grpc::InsecureChannelCredentials(), args);
    kv_ = pb::KV::NewStub(channel);
    lease_ = pb::Lease::NewStub(channel);
  }

  static std::unique_ptr<grpc::ClientContext> Context(absl::Duration d) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
    return ctx;
  }

  // Best effort: a lease not revoked expires after its time to live.
  void RevokeLease(int64_t id) {
    pb::LeaseRevokeRequest req;
    req.set_id(id);
    pb::LeaseRevokeResponse resp;
    auto ctx = Context(absl::Seconds(1));
    (void)lease_->LeaseRevoke(ctx.get(), req, &resp);
  }

  // One try: a fresh lease, and the key created under it if it is absent.
  absl::StatusOr<int64_t> TryLead() {
    const absl::Time sent = absl::Now();
    pb::LeaseGrantRequest grant;
    grant.set_ttl(options_.ttl_s);
    pb::LeaseGrantResponse granted;
    auto gctx = Context(absl::Seconds(1));
    if (absl::Status s = FromGrpc(
            lease_->LeaseGrant(gctx.get(), grant, &granted), "LeaseGrant");
        !s.ok()) {
      return s;
    }
    pb::TxnRequest txn;
    pb::Compare* absent = txn.add_compare();
    absent->set_result(pb::Compare::EQUAL);
    absent->set_target(pb::Compare::CREATE);
    absent->set_key(options_.key);
    absent->set_create_revision(0);
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(options_.key);
    put->set_value(options_.value);
    put->set_lease(granted.id());
    pb::TxnResponse done;
    auto tctx = Context(absl::Seconds(1));
    absl::Status s = FromGrpc(kv_->Txn(tctx.get(), txn, &done), "Txn");
    if (!s.ok() || !done.succeeded()) {
      RevokeLease(granted.id());
      return s.ok() ? absl::AlreadyExistsError("another candidate leads") : s;
    }
    {
      absl::MutexLock l(&mu_);
      lease_id_ = granted.id();
      valid_until_ = sent + absl::Seconds(granted.ttl());
    }
    renewer_ = std::thread([this, id = granted.id()] { Renew(id); });
    return done.header().revision();
  }

  // Keeps lease `id` alive until Resign, or until a renewal reports it
  // gone (TTL 0). A renewal that fails leaves valid_until_ where it was,
  // so Leading() turns false when the lease may have expired; it is tried
  // again after retry_every (etcd electing a new leader of its own takes
  // one to two of its election timeouts, and the renewal must land within
  // the lease).
  void Renew(int64_t id) {
    absl::Duration wait = options_.renew_every;
    absl::Time failing_since = absl::InfiniteFuture();
    while (!stop_renewing_) {
      absl::SleepFor(wait);
      const absl::Time sent = absl::Now();
      auto ctx = Context(absl::Seconds(1));
      auto stream = lease_->LeaseKeepAlive(ctx.get());
      pb::LeaseKeepAliveRequest req;
      req.set_id(id);
      pb::LeaseKeepAliveResponse resp;
      const bool answered = stream->Write(req) && stream->Read(&resp);
      stream->WritesDone();
      const grpc::Status st = stream->Finish();
      if (!answered) {
        if (failing_since == absl::InfiniteFuture()) {
          failing_since = sent;
          HOLDFAST_LOG_WARN(
              "election: etcd did not renew the lease ({}); the lead holds "
              "for {} ms more, retrying every {} ms",
              st.ok() ? "no answer" : st.error_message(),
              absl::ToInt64Milliseconds(ValidFor()),
              absl::ToInt64Milliseconds(options_.retry_every));
        }
        wait = options_.retry_every;
        continue;
      }
      if (failing_since != absl::InfiniteFuture()) {
        HOLDFAST_LOG_INFO("election: the lease was renewed again after {} ms",
                          absl::ToInt64Milliseconds(sent - failing_since));
        failing_since = absl::InfiniteFuture();
      }
      wait = options_.renew_every;
      absl::MutexLock l(&mu_);
      if (lease_id_ != id) return;
      if (resp.ttl() <= 0) {
        valid_until_ = absl::InfinitePast();  // expired: etcd dropped the key
        return;
      }
      valid_until_ = sent + absl::Seconds(resp.ttl());
    }
  }

  absl::Duration ValidFor() const {
    absl::MutexLock l(&mu_);
    return valid_until_ - absl::Now();
  }

  const ElectionOptions options_;
  std::unique_ptr<pb::KV::Stub> kv_;
  std::unique_ptr<pb::Lease::Stub> lease_;
  mutable absl::Mutex mu_;
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time valid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<bool> stop_renewing_{false};
  std::thread renewer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Election>> Election::Create(
    const ElectionOptions& options) {
  if (options.endpoints.empty() || options.key.empty()) {
    return absl::InvalidArgumentError(
        "election: etcd endpoints and a key are required");
  }
  if (options.ttl_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("election: ttl ", options.ttl_s, " s is below 1 s"));
  }
  return std::unique_ptr<Election>(new ElectionImpl(options));
}

}  // namespace holdfast::control
