// Gloo TCP backend. Collectives use Gloo's algorithms where Gloo has a
// tagged, timeout-aware one (allreduce, broadcast, allgather, alltoall,
// barrier); reduce-scatter and send/recv run on Gloo's unbound buffers.
//
// Abort: Gloo has no context-wide abort, but tcp::Pair offers
// signalExceptionExternal(), which fails every operation pending on the pair,
// wakes its waiters and closes the socket (so the peer sees EOF at once).
// Abort() calls it on every pair.
//
// Gloo reports errors by throwing; nothing thrown here leaves this file.
#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/tcp/unbound_buffer.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "holdfast/status.h"
#include "src/backend/backend.h"
#include "src/backend/gloo/auth_link.h"
#include "src/backend/gloo/gloo_access.h"
#include "src/backend/gloo/reduce.h"
#include "src/common/config.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "src/common/thread_util.h"
#include "src/store/keys.h"
#include "src/store/store_util.h"

namespace holdfast::backend {
namespace {

// How long a rendezvous whose connect to one peer failed for the network
// (no route) waits for its other connects before failing them (Connect's
// watcher): a host whose data link is down fails a connect at once only
// to addresses it recently failed to resolve, and the others after the
// neighbour resolution gives up (about 3 s on Linux). Their errors tell
// the controller which peers this member could not reach. A connect that
// failed otherwise (refused, reset) ends the others at once.
constexpr absl::Duration kNetworkFailureGrace = absl::Milliseconds(3500);

// A connect still unanswered this long when its rendezvous gave up is
// counted as a peer this member could not reach (see ConnectPairs).
constexpr absl::Duration kPendingIsUnreachable = absl::Seconds(1);

// Whether a transport error says the network failed between the two
// ranks (no route, or sent data unacknowledged: TCP_USER_TIMEOUT).
bool NetworkFailure(absl::string_view what) {
  return absl::StrContains(what, "No route to host") ||
         absl::StrContains(what, "Network is unreachable") ||
         absl::StrContains(what, "Connection timed out");
}

// How long a failed connect of `pair`, begun at `started`, waited for
// its peer's answer: zero when the TCP connect completed (the peer's kernel
// answered; its process did not answer the link handshake).
absl::Duration Unanswered(::gloo::transport::Pair* pair, absl::Time started) {
  return ConnectReachedPeer(pair) ? absl::ZeroDuration()
                                  : absl::Now() - started;
}

// Whether it says the peer refused, reset or closed the connection: the
// peer's doing (it aborted, or died), which says nothing of the network.
bool PeerEnded(absl::string_view what) {
  return absl::StrContains(what, "refused") ||
         absl::StrContains(what, "reset") || absl::StrContains(what, "closed");
}

// Slot prefixes for the algorithms written here; Gloo's own use small values.
constexpr uint8_t kReduceScatterSlotPrefix = 0xa1;
constexpr uint8_t kP2PSlotPrefix = 0xa2;
// The slot of the message a rank sends each peer when it closes the group in
// an orderly way (Close).
const uint64_t kGoodbyeSlot = ::gloo::Slot::build(0xa3, 0);
// AllReduce: the contributions to the owners, and the owners' results back.
constexpr uint8_t kAllReduceInSlotPrefix = 0xa4;
constexpr uint8_t kAllReduceOutSlotPrefix = 0xa5;
// An AllReduce whose every peer's whole input fits in this many bytes is
// one exchange of whole inputs with each peer and a local reduction (bound
// by the latency of one step); larger ones reduce each block at its owner
// and send it back (two steps, each rank moving 2 (n - 1) / n of the
// bytes, as a ring does).
constexpr size_t kExchangeAllReduceBytes = size_t{64} << 10;

// How much of a fold's output GatherAndFold folds every input into before
// it goes on: small enough to stay in cache.
constexpr size_t kFoldStretchBytes = size_t{64} << 10;

// The reason given to the pairs the watcher fails because another one
// failed to connect.
constexpr absl::string_view kOtherPairFailed = "another pair failed to connect";

// The watcher of a full-mesh connect: it fails every pair once the
// rendezvous is cancelled or its deadline passes (then why() says which),
// and once one pair's connect failed (Broken), so the connects still
// waiting on other peers end too; when it failed for the network,
// kNetworkFailureGrace later, so that the other connects that fail of
// themselves (no route) say so: the controller triangulates who lost whom
// from them. Thread-safe.
class ConnectWatcher {
 public:
  ConnectWatcher(int rank, int size, absl::Time deadline,
                 absl::Duration timeout,
                 std::function<std::optional<std::string>()> cancelled)
      : rank_(rank),
        size_(size),
        deadline_(deadline),
        timeout_(timeout),
        cancelled_(std::move(cancelled)) {}

  // The watcher thread's body: returns once it failed the pairs of `tc`,
  // or at Stop().
  void Run(::gloo::transport::Context& tc) {
    absl::MutexLock lock(&mu_);
    for (;;) {
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return done_ || (broken_ && !broken_at_.has_value());
      };
      mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(50));
      if (done_) return;
      if (!DueLocked()) continue;
      FailPairs(tc, why_.has_value() ? why_->ToString()
                                     : std::string(kOtherPairFailed));
      return;
    }
  }
  // A pair's connect failed (for the network, or not).
  void Broken(bool network_failure) {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    network_ = network_ || network_failure;
  }
  // The connect ended: the watcher returns.
  void Stop() {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  // Why it failed the pairs (cancelled, or the deadline), if it did.
  std::optional<absl::Status> why() {
    absl::MutexLock lock(&mu_);
    return why_;
  }

 private:
  // Whether the pairs are to be failed now (setting why_ when the reason
  // is the watcher's own).
  bool DueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::optional<std::string> c = cancelled_ ? cancelled_() : std::nullopt;
    if (broken_) {
      // The pair's own error is the reason; the rest just end.
      if (!broken_at_.has_value()) broken_at_ = absl::Now();
      return !(network_ && !c.has_value() && absl::Now() < deadline_ &&
               absl::Now() - *broken_at_ < kNetworkFailureGrace);
    }
    if (c.has_value()) {
      why_ = absl::AbortedError(*c);
    } else if (absl::Now() > deadline_) {
      why_ = absl::DeadlineExceededError(absl::StrCat(
          "not connected within ", absl::FormatDuration(timeout_)));
    } else {
      return false;
    }
    return true;
  }

  void FailPairs(::gloo::transport::Context& tc, const std::string& msg) {
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      auto* pair = dynamic_cast<tcp::Pair*>(tc.getPair(j).get());
      try {
        if (pair != nullptr) PairAccess::Fail(pair, msg);
      } catch (const std::exception&) {
        // Already failed.
      }
    }
  }

  const int rank_;
  const int size_;
  const absl::Time deadline_;
  const absl::Duration timeout_;
  const std::function<std::optional<std::string>()> cancelled_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool network_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Time> broken_at_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> why_ ABSL_GUARDED_BY(mu_);
};

// A Gloo context connected by holdfast's own full-mesh rendezvous. The
// exchange is Gloo's connectFullMesh: every rank creates one pair per
// peer, publishes their addresses under its rank number, and connects
// each pair to the peer's address for it. Gloo's version cannot be
// stopped: a pair whose peer left waits five times the context timeout
// for it. Here a watcher fails every pair when the rendezvous is
// cancelled or its deadline passes, so the connect ends then.
class MeshContext final : public ::gloo::rendezvous::Context {
 public:
  MeshContext(int rank, int size) : ::gloo::rendezvous::Context(rank, size) {}

  // OK once every pair is connected. Aborted when `cancelled` gives a
  // reason; DeadlineExceeded after `timeout`, with the peer that did not
  // come attached (SetAbsent); Unavailable for a transport error.
  absl::Status Connect(
      Store& store, std::shared_ptr<::gloo::transport::Device> dev,
      absl::Duration timeout, int max_threads,
      const std::function<std::optional<std::string>()>& cancelled) {
    const absl::Time deadline = absl::Now() + timeout;
    std::shared_ptr<::gloo::transport::Context> tc =
        dev->createContext(rank, size);
    tc->setTimeout(ToChrono(timeout));
    std::string mine;
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      const std::vector<char> a = tc->createPair(j)->address().bytes();
      mine.append(a.data(), a.size());
    }
    HOLDFAST_RETURN_IF_ERROR(store.Set(std::to_string(rank), mine));

    ConnectWatcher watch(rank, size, deadline, timeout, cancelled);
    std::thread watcher([&] { watch.Run(*tc); });
    absl::Status s = ConnectPairs(
        store, *tc, deadline, max_threads,
        [&](bool network_failure) { watch.Broken(network_failure); });
    watch.Stop();
    watcher.join();
    const std::optional<absl::Status> why = watch.why();
    if (!s.ok() && why.has_value() &&
        !absl::StrContains(s.message(), why->message())) {
      // A connect the watcher ended: its reason first, then the transport's.
      absl::Status w(why->code(),
                     absl::StrCat(why->message(), " (", s.message(), ")"));
      CopyPayloads(s, &w);
      s = w;
    }
    if (!s.ok()) return s;
    device_ = std::move(dev);
    transportContext_ = std::move(tc);
    return absl::OkStatus();
  }

 private:
  // Reads every peer's addresses (in rank order: a peer that has not
  // published is waited for, and named if it never does), then connects
  // every pair, each on a thread of its own: a pair's connect waits for
  // the peer to connect its side, so connecting them one after another in
  // rank order makes each rank wait for the peers before it in turn. With
  // more than `max_threads` peers (HOLDFAST_CONNECT_THREADS) they connect
  // one after another, in rank order (every rank in the same order cannot
  // deadlock; a bounded pool could).
  // `broken` is called when a pair fails, with whether the network failed
  // (NetworkFailure); the first failure in rank order is returned.
  // `store` is cancellable when the rendezvous is (Communicator::Create).
  absl::Status ConnectPairs(Store& store, ::gloo::transport::Context& tc,
                            absl::Time deadline, int max_threads,
                            const std::function<void(bool)>& broken) {
    std::vector<std::vector<char>> addr(static_cast<size_t>(size));
    for (int j = 0; j < size; ++j) {
      if (j == rank) continue;
      HOLDFAST_ASSIGN_OR_RETURN(addr[static_cast<size_t>(j)],
                                PeerAddress(store, deadline, j));
    }
    std::vector<absl::Status> result(static_cast<size_t>(size));
    // How long each failed connect lasted: one still waiting for the peer's
    // answer after kPendingIsUnreachable, when the rendezvous gave up on it,
    // went unanswered (a listening peer's kernel answers at once, even
    // while the process is stopped): the network. Not one whose TCP
    // connect completed and that waited for the link handshake's answer:
    // the peer's kernel answered, its process did not.
    std::vector<absl::Duration> lasted(static_cast<size_t>(size));
    const absl::Time started = absl::Now();
    auto connect = [&](int j) {
      try {
        tc.getPair(j)->connect(addr[static_cast<size_t>(j)]);
        return true;
      } catch (const std::exception& e) {
        lasted[static_cast<size_t>(j)] =
            Unanswered(tc.getPair(j).get(), started);
        absl::Status s = absl::UnavailableError(
            absl::StrCat("connecting to rank ", j, ": ", e.what()));
        SetAbsent(&s, j);
        const bool network = NetworkFailure(s.message());
        result[static_cast<size_t>(j)] = std::move(s);
        broken(network);
        return false;
      }
    };
    if (size - 1 > max_threads) {
      for (int j = 0; j < size; ++j) {
        if (j != rank && !connect(j)) break;
      }
    } else {
      std::vector<std::thread> threads;
      threads.reserve(static_cast<size_t>(size));
      int j = 0;
      for (; j < size; ++j) {
        if (j == rank) continue;
        absl::StatusOr<std::thread> t =
            StartThread("a mesh connect thread", [&connect, j] { connect(j); });
        if (!t.ok()) break;
        threads.push_back(std::move(*t));
      }
      // No thread for peer j (a pids limit): it and the ones after it
      // connect here, in rank order, which cannot deadlock (the ones on
      // threads go on by themselves).
      for (; j < size; ++j) {
        if (j != rank && !connect(j)) break;
      }
      for (std::thread& t : threads) t.join();
    }
    // A pair the watcher failed because another one failed says so; the
    // one that failed first explains it better. Every peer whose connect
    // failed of itself is attached (SetUnreachable): who lost whom.
    absl::Status first, own;
    std::vector<int> unreachable;
    for (int j = 0; j < size; ++j) {
      const absl::Status& s = result[static_cast<size_t>(j)];
      if (s.ok()) continue;
      if (first.ok()) first = s;
      const bool unanswered =
          lasted[static_cast<size_t>(j)] >= kPendingIsUnreachable &&
          !PeerEnded(s.message());
      if (NetworkFailure(s.message()) || unanswered) unreachable.push_back(j);
      if (absl::StrContains(s.message(), kOtherPairFailed)) continue;
      if (own.ok()) own = s;
    }
    absl::Status out = own.ok() ? first : own;
    if (!unreachable.empty()) SetUnreachable(&out, unreachable);
    return out;
  }

  // This rank's address at rank j's end of their pair.
  absl::StatusOr<std::vector<char>> PeerAddress(Store& store,
                                                absl::Time deadline, int j) {
    absl::StatusOr<std::string> all =
        store.Get(std::to_string(j), deadline - absl::Now());
    if (!all.ok()) {
      absl::Status s(all.status().code(),
                     absl::StrCat("waiting for rank ", j,
                                  "'s address: ", all.status().message()));
      SetAbsent(&s, j);
      return s;
    }
    // Rank j's addresses: one per peer of j, in rank order, equal sizes.
    const size_t n = all->size() / (size - 1);
    if (n == 0 || all->size() % (size - 1) != 0) {
      return absl::InternalError(absl::StrCat(
          "rank ", j, " published ", all->size(), " bytes of addresses, not ",
          size - 1, " of equal size"));
    }
    const size_t at = static_cast<size_t>(rank < j ? rank : rank - 1) * n;
    return std::vector<char>(all->begin() + at, all->begin() + at + n);
  }
};

// Calls f(T{}) with an unsigned type of the element's size: Gloo only needs
// the element size, the arithmetic is in the reduce function.
template <typename F>
void WithStorage(DataType dtype, F&& f) {
  switch (DataTypeSize(dtype)) {
    case 1:
      f(uint8_t{});
      break;
    case 2:
      f(uint16_t{});
      break;
    case 4:
      f(uint32_t{});
      break;
    default:
      f(uint64_t{});
      break;
  }
}

class GlooBackend final : public Backend {
 public:
  GlooBackend(const BackendOptions& options,
              std::shared_ptr<::gloo::rendezvous::Context> context,
              std::shared_ptr<::gloo::transport::Device> device)
      : options_(options),
        context_(std::move(context)),
        device_(std::move(device)) {
    peer_addresses_.resize(options_.size);
    const absl::Duration user_timeout =
        absl::Milliseconds(config::IntParam("HOLDFAST_TCP_USER_TIMEOUT_MS"));
    for (int j = 0; j < options_.size; ++j) {
      if (j == options_.rank) continue;
      auto* pair = dynamic_cast<tcp::Pair*>(context_->getPair(j).get());
      if (pair == nullptr) continue;
      peer_addresses_[j] = PairAccess::PeerAddress(pair);
      if (user_timeout > absl::ZeroDuration()) {
        if (int e = PairAccess::SetUserTimeout(pair, user_timeout); e != 0) {
          HOLDFAST_LOG_WARN("gloo: TCP_USER_TIMEOUT on the pair to rank {}: {}",
                            j, std::strerror(e));
        }
      }
    }
    // Every peer's goodbye (Close) has its receive posted from the start, so
    // it lands whenever the peer sends it.
    goodbye_words_.resize(options_.size);
    goodbye_in_.resize(options_.size);
    for (int j = 0; j < options_.size; ++j) {
      if (j == options_.rank) continue;
      try {
        auto buf =
            context_->createUnboundBuffer(&goodbye_words_[j], sizeof(uint64_t));
        buf->recv(j, kGoodbyeSlot);
        goodbye_in_[j] = std::move(buf);
      } catch (const std::exception&) {
        // The pair has failed already: the first op will say so.
      }
    }
  }

  ~GlooBackend() override {
    Abort("communicator destroyed");
    // Buffers before the context they were made from; pairs before the
    // device whose loop they are registered with.
    goodbye_in_.clear();
    context_.reset();
    device_.reset();
  }

  absl::string_view name() const override { return "gloo"; }
  MemoryKind memory() const override { return MemoryKind::kHost; }

  absl::Status Run(const OpSpec& op) override {
    if (aborted_.load(std::memory_order_acquire)) return AbortedStatus();
    try {
      switch (op.type) {
        case OpType::kAllReduce:
          return AllReduce(op);
        case OpType::kBroadcast:
          return Broadcast(op);
        case OpType::kAllGather:
          return AllGather(op);
        case OpType::kReduceScatter:
          return ReduceScatter(op);
        case OpType::kAllToAll:
          return AllToAll(op);
        case OpType::kBarrier:
          return Barrier(op);
        case OpType::kSend:
        case OpType::kRecv: {
          absl::StatusOr<std::unique_ptr<PendingP2P>> p = Post(op);
          if (!p.ok()) return p.status();
          return Wait(**p);
        }
      }
      return absl::InvalidArgumentError("gloo: unknown operation type");
    } catch (const ::gloo::Exception& e) {  // IoException and the rest
      return Translate(e.what());
    } catch (const std::exception& e) {
      if (aborted_.load(std::memory_order_acquire)) return AbortedStatus();
      return absl::InternalError(absl::StrCat("gloo: ", e.what()));
    }
  }

  void Abort(absl::string_view reason) override {
    {
      absl::MutexLock lock(&mu_);
      if (aborted_.load(std::memory_order_relaxed)) return;
      abort_reason_ = std::string(reason);
      aborted_.store(true, std::memory_order_release);
    }
    if (!context_) return;
    const std::string msg = absl::StrCat("holdfast abort: ", reason);
    for (int j = 0; j < options_.size; ++j) {
      if (j == options_.rank) continue;
      auto* pair = dynamic_cast<tcp::Pair*>(context_->getPair(j).get());
      if (pair == nullptr) continue;
      try {
        PairAccess::Fail(pair, msg);
        PairAccess::WakeStranded(pair);
      } catch (const std::exception&) {
        // The pair is already broken; nothing more to signal.
      }
    }
  }

  void Close(absl::Duration timeout) override {
    // One buffer per peer (a failed send poisons its buffer for waits),
    // kept until the pairs are closed below.
    std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sent;
    if (context_ && !aborted_.load(std::memory_order_acquire)) {
      const absl::Time deadline = absl::Now() + timeout;
      for (int j = 0; j < options_.size; ++j) {
        if (j == options_.rank) continue;
        try {
          auto out = context_->createUnboundBuffer(
              &goodbye_words_[options_.rank], sizeof(uint64_t));
          out->send(j, kGoodbyeSlot);
          sent.push_back(std::move(out));
        } catch (const std::exception&) {
          // That peer is gone already.
        }
      }
      for (auto& out : sent) {
        try {
          out->waitSend(ToChrono(deadline - absl::Now()));
        } catch (const std::exception&) {
          // Not sent in time, or the pair failed: that peer sees a loss.
        }
      }
    }
    Abort("communicator closed");
  }

  absl::Status CheckPeers() override {
    if (!context_ || aborted_.load(std::memory_order_acquire)) {
      return absl::OkStatus();
    }
    for (int j = 0; j < options_.size; ++j) {
      if (j == options_.rank) continue;
      auto* pair = dynamic_cast<tcp::Pair*>(context_->getPair(j).get());
      if (pair == nullptr) continue;
      std::exception_ptr ex = PairAccess::WakeStranded(pair);
      // A peer that said goodbye left; ops that needed it failed above.
      if (ex == nullptr || SaidGoodbye(j)) continue;
      try {
        std::rethrow_exception(ex);
      } catch (const std::exception& e) {
        return Translate(e.what());
      }
    }
    return absl::OkStatus();
  }

  std::vector<int64_t> PeerRetransmits() override {
    std::vector<int64_t> out(static_cast<size_t>(options_.size), -1);
    out[static_cast<size_t>(options_.rank)] = 0;
    if (!context_ || aborted_.load(std::memory_order_acquire)) return out;
    for (int j = 0; j < options_.size; ++j) {
      if (j == options_.rank) continue;
      auto* pair = dynamic_cast<tcp::Pair*>(context_->getPair(j).get());
      if (pair != nullptr)
        out[static_cast<size_t>(j)] = PairAccess::Retransmits(pair);
    }
    return out;
  }

 private:
  absl::Status AbortedStatus() {
    absl::MutexLock lock(&mu_);
    return absl::AbortedError(
        absl::StrCat("communicator aborted: ", abort_reason_));
  }

  // Maps a Gloo exception message to a status, naming the peer whose
  // address appears in it.
  absl::Status Translate(absl::string_view what) {
    if (aborted_.load(std::memory_order_acquire)) return AbortedStatus();
    if (absl::StrContains(what, "Timed out") ||
        absl::StrContains(what, "timeout")) {
      return absl::DeadlineExceededError(
          absl::StrCat("gloo transport timeout: ", what));
    }
    const int peer = PeerInMessage(what);
    if (peer < 0) {
      return absl::UnavailableError(
          absl::StrCat("gloo connection lost: ", what));
    }
    absl::Status s = absl::UnavailableError(
        SaidGoodbye(peer)
            ? absl::StrCat("rank ", peer, " (", peer_addresses_[peer],
                           ") closed its communicator, but this op needs it "
                           "(did the ranks issue different ops?): ",
                           what)
            : absl::StrCat("lost connection to rank ", peer, " (",
                           peer_addresses_[peer], "): ", what));
    SetPeer(&s, peer);
    // The network, not the peer (NetworkFailure): the evidence of who
    // lost whom.
    if (NetworkFailure(what)) SetUnreachable(&s, {peer});
    return s;
  }

  // Whether rank j closed the group in an orderly way (Close). Read after
  // its pair failed, this is final: the goodbye is read before the close.
  bool SaidGoodbye(int j) const {
    return goodbye_in_[j] != nullptr &&
           UnboundBufferAccess::Received(
               static_cast<tcp::UnboundBuffer*>(goodbye_in_[j].get()));
  }

  int PeerInMessage(absl::string_view what) const {
    for (int j = 0; j < options_.size; ++j) {
      const std::string& addr = peer_addresses_[j];
      if (addr.empty()) continue;
      size_t pos = what.find(addr);
      while (pos != absl::string_view::npos) {
        const size_t end = pos + addr.size();
        // "[127.0.0.1]:4000" must not match inside "[127.0.0.1]:40001".
        if (end == what.size() ||
            !isdigit(static_cast<unsigned char>(what[end]))) {
          return j;
        }
        pos = what.find(addr, pos + 1);
      }
    }
    return -1;
  }

  // Every element of the result is ((x_0 op x_1) op x_2) ... op x_{n-1},
  // the inputs folded in rank order, whatever the count and wherever the
  // element sits in the buffer: a caller whose layout or message sizes
  // change (DDP's buckets after a recovery) gets the same bits for the same
  // operands. (Gloo's ring and bcube start each block's fold at another
  // rank.)
  absl::Status AllReduce(const OpSpec& op) {
    const int n = options_.size;
    const size_t elem = DataTypeSize(op.dtype);
    const size_t bytes = op.count * elem;
    if (n == 1 || op.count == 0) return absl::OkStatus();
    gloo::ReduceFn fn = gloo::GetReduceFn(op.dtype, op.reduce);
    const auto timeout = ToChrono(op.timeout);
    const uint64_t in_slot =
        ::gloo::Slot::build(kAllReduceInSlotPrefix, op.tag);
    uint8_t* data = static_cast<uint8_t*>(op.recv);
    if (bytes * static_cast<size_t>(n - 1) <= kExchangeAllReduceBytes) {
      // Every rank gets every input and folds them all.
      HOLDFAST_RETURN_IF_ERROR(GatherAndFold(
          fn, data,
          [&](int) {
            return Part{0, bytes};
          },
          data, elem, in_slot, timeout));
      if (op.reduce == ReduceOp::kAverage) {
        gloo::DivideInPlace(data, op.count, op.dtype, n);
      }
      return absl::OkStatus();
    }
    // Block j (an even split of the elements) is folded at rank j, then
    // sent from there to every peer, into the same place.
    auto block = [&](int j) {
      const size_t lo = op.count * static_cast<size_t>(j) / n;
      const size_t hi = op.count * static_cast<size_t>(j + 1) / n;
      return Part{lo * elem, (hi - lo) * elem};
    };
    const Part mine = block(options_.rank);
    HOLDFAST_RETURN_IF_ERROR(
        GatherAndFold(fn, data, block, data + mine.at, elem, in_slot, timeout));
    if (op.reduce == ReduceOp::kAverage) {
      gloo::DivideInPlace(data + mine.at, mine.size / elem, op.dtype, n);
    }
    return Exchange(
        data, data, [&](int) { return mine; }, block,
        ::gloo::Slot::build(kAllReduceOutSlotPrefix, op.tag), timeout);
  }

  // A region of a buffer, in bytes.
  struct Part {
    size_t at = 0;
    size_t size = 0;
  };

  // Every rank sends the part to(j) of `send` to rank j and receives rank
  // j's part to(this rank) of its input; `out` (to(this rank).size bytes)
  // becomes their fold in rank order: in[0] op in[1] op ... op in[n-1].
  // `out` may be this rank's own part of `send`.
  //
  // The peers' parts land in scratch_, kept from call to call (no
  // allocation, page faults or clearing per call); this rank's own part is
  // read where it is. The fold runs a cache-sized stretch at a time, every
  // input in rank order, so each stretch of `out` stays in cache while the
  // inputs stream through it once.
  absl::Status GatherAndFold(gloo::ReduceFn fn, const uint8_t* send,
                             const std::function<Part(int)>& to, uint8_t* out,
                             size_t elem, uint64_t slot,
                             std::chrono::milliseconds timeout) {
    const int n = options_.size;
    const int rank = options_.rank;
    const Part mine = to(rank);
    const size_t count = mine.size / elem;
    // Peer j's part sits at index j, or j - 1 after this rank.
    auto from = [&](int j) {
      const size_t at = static_cast<size_t>(j < rank ? j : j - 1);
      return Part{mine.size * at, mine.size};
    };
    const size_t need = mine.size * static_cast<size_t>(n - 1);
    if (scratch_size_ < need) {
      scratch_.reset(new uint8_t[need]);
      scratch_size_ = need;
    }
    HOLDFAST_RETURN_IF_ERROR(
        Exchange(send, scratch_.get(), to, from, slot, timeout));
    if (count == 0) return absl::OkStatus();
    // Rank j's input: this rank's own part where it is, the peers' in
    // scratch_.
    auto in = [&](int j) {
      return j == rank ? send + mine.at : scratch_.get() + from(j).at;
    };
    // From the third input on, `out` holds the fold so far: an own part
    // that is `out` itself is read from a copy of the stretch first.
    const bool own_in_out = rank >= 2 && in(rank) == out;
    const size_t stretch = std::max<size_t>(1, kFoldStretchBytes / elem);
    alignas(64) uint8_t own[kFoldStretchBytes + 16];
    for (size_t lo = 0; lo < count; lo += stretch) {
      const size_t k = std::min(stretch, count - lo);
      const size_t at = lo * elem;
      if (own_in_out) std::memcpy(own, out + at, k * elem);
      auto input = [&](int j) {
        return own_in_out && j == rank ? own : in(j) + at;
      };
      fn(out + at, input(0), input(1), k);
      for (int j = 2; j < n; ++j) fn(out + at, out + at, input(j), k);
    }
    return absl::OkStatus();
  }

  // One message to and from every peer at once: to peer j the part
  // to(j) of `send`, from peer j into the part from(j) of `recv` (empty
  // parts are not sent). `send` and `recv` may be one buffer whose parts
  // sent and received do not overlap. Returns when every message is done;
  // Aborted when a wait is woken by Abort().
  absl::Status Exchange(const uint8_t* send, uint8_t* recv,
                        const std::function<Part(int)>& to,
                        const std::function<Part(int)>& from, uint64_t slot,
                        std::chrono::milliseconds timeout) {
    const int n = options_.size;
    size_t send_end = 1;  // Gloo's buffers span what they address
    size_t recv_end = 1;
    for (int j = 0; j < n; ++j) {
      if (j == options_.rank) continue;
      send_end = std::max(send_end, to(j).at + to(j).size);
      recv_end = std::max(recv_end, from(j).at + from(j).size);
    }
    auto out =
        context_->createUnboundBuffer(const_cast<uint8_t*>(send), send_end);
    auto in = context_->createUnboundBuffer(recv, recv_end);
    int sends = 0;
    int recvs = 0;
    // Each rank starts with the rank after it, so that they do not all
    // send to rank 0 first.
    for (int k = 1; k < n; ++k) {
      const int j = (options_.rank + k) % n;
      if (const Part p = to(j); p.size > 0) {
        out->send(j, slot, p.at, p.size);
        ++sends;
      }
      if (const Part p = from(j); p.size > 0) {
        in->recv(j, slot, p.at, p.size);
        ++recvs;
      }
    }
    for (int i = 0; i < recvs; ++i) {
      if (!in->waitRecv(timeout)) return AbortedStatus();
    }
    for (int i = 0; i < sends; ++i) {
      if (!out->waitSend(timeout)) return AbortedStatus();
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast(const OpSpec& op) {
    ::gloo::BroadcastOptions opts(context_);
    WithStorage(op.dtype, [&](auto t) {
      using T = decltype(t);
      opts.setOutput(static_cast<T*>(op.recv), op.count);
    });
    opts.setRoot(op.peer);
    opts.setTag(op.tag);
    opts.setTimeout(ToChrono(op.timeout));
    ::gloo::broadcast(opts);
    return absl::OkStatus();
  }

  absl::Status AllGather(const OpSpec& op) {
    ::gloo::AllgatherOptions opts(context_);
    WithStorage(op.dtype, [&](auto t) {
      using T = decltype(t);
      opts.setInput(const_cast<T*>(static_cast<const T*>(op.send)), op.count);
      opts.setOutput(static_cast<T*>(op.recv), op.count * options_.size);
    });
    opts.setTag(op.tag);
    opts.setTimeout(ToChrono(op.timeout));
    ::gloo::allgather(opts);
    return absl::OkStatus();
  }

  absl::Status AllToAll(const OpSpec& op) {
    ::gloo::AlltoallOptions opts(context_);
    WithStorage(op.dtype, [&](auto t) {
      using T = decltype(t);
      const size_t n = op.count * options_.size;
      opts.setInput(const_cast<T*>(static_cast<const T*>(op.send)), n);
      opts.setOutput(static_cast<T*>(op.recv), n);
    });
    opts.setTag(op.tag);
    opts.setTimeout(ToChrono(op.timeout));
    ::gloo::alltoall(opts);
    return absl::OkStatus();
  }

  absl::Status Barrier(const OpSpec& op) {
    ::gloo::BarrierOptions opts(context_);
    opts.setTag(op.tag);
    opts.setTimeout(ToChrono(op.timeout));
    ::gloo::barrier(opts);
    return absl::OkStatus();
  }

  // Each rank gets block r of every rank's input and folds them in rank
  // order, as AllReduce does: the result does not depend on which block an
  // element is in.
  absl::Status ReduceScatter(const OpSpec& op) {
    const int n = options_.size;
    const size_t block = op.count * DataTypeSize(op.dtype);
    if (n == 1 || block == 0) {
      if (block > 0) std::memcpy(op.recv, op.send, block);
      return absl::OkStatus();
    }
    HOLDFAST_RETURN_IF_ERROR(GatherAndFold(
        gloo::GetReduceFn(op.dtype, op.reduce),
        static_cast<const uint8_t*>(op.send),
        [&](int j) {
          return Part{block * static_cast<size_t>(j), block};
        },
        static_cast<uint8_t*>(op.recv), DataTypeSize(op.dtype),
        ::gloo::Slot::build(kReduceScatterSlotPrefix, op.tag),
        ToChrono(op.timeout)));
    if (op.reduce == ReduceOp::kAverage) {
      gloo::DivideInPlace(op.recv, op.count, op.dtype, n);
    }
    return absl::OkStatus();
  }

  struct GlooP2P final : PendingP2P {
    std::unique_ptr<::gloo::transport::UnboundBuffer> buf;
    bool is_send = false;
    std::chrono::milliseconds timeout{0};
  };

  absl::StatusOr<std::unique_ptr<PendingP2P>> Post(const OpSpec& op) override {
    if (aborted_.load(std::memory_order_acquire)) return AbortedStatus();
    try {
      auto p = std::make_unique<GlooP2P>();
      const size_t bytes = op.count * DataTypeSize(op.dtype);
      const uint64_t slot = ::gloo::Slot::build(kP2PSlotPrefix, op.tag);
      p->is_send = op.type == OpType::kSend;
      p->timeout = ToChrono(op.timeout);
      if (p->is_send) {
        p->buf =
            context_->createUnboundBuffer(const_cast<void*>(op.send), bytes);
        p->buf->send(op.peer, slot);
      } else {
        p->buf = context_->createUnboundBuffer(op.recv, bytes);
        p->buf->recv(op.peer, slot);
      }
      return std::unique_ptr<PendingP2P>(std::move(p));
    } catch (const std::exception& e) {
      return Translate(e.what());
    }
  }

  absl::Status Wait(PendingP2P& pending) override {
    auto& p = static_cast<GlooP2P&>(pending);
    try {
      const bool done =
          p.is_send ? p.buf->waitSend(p.timeout) : p.buf->waitRecv(p.timeout);
      return done ? absl::OkStatus() : AbortedStatus();
    } catch (const std::exception& e) {
      return Translate(e.what());
    }
  }

  const BackendOptions options_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::vector<std::string> peer_addresses_;  // by rank; "" for self
  // Goodbyes (Close), by rank: the word each peer's lands in, and the
  // receive posted for it. The contents are not read (this rank's own word
  // is what it sends).
  std::vector<uint64_t> goodbye_words_;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> goodbye_in_;

  // GatherAndFold's buffer for the peers' parts (the op thread's alone:
  // collectives run one at a time); it grows to the largest call's and
  // stays.
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratch_size_ = 0;

  absl::Mutex mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
};

// A rendezvous that timed out (`timeout`, DeadlineExceeded), naming the
// ranks that never published their addresses; the lowest of them is
// attached (SetAbsent) as the one to blame. When every rank published, the
// rank that did not connect stays attached.
absl::Status RendezvousTimeout(Store& rendezvous, const BackendOptions& options,
                               const absl::Status& timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < options.size; ++r) keys.push_back(std::to_string(r));
  std::vector<int> missing;  // not this rank's own: it published first
  for (size_t i : MissingKeys(rendezvous, keys)) {
    missing.push_back(static_cast<int>(i));
  }
  if (missing.empty()) return timeout;
  absl::Status s = absl::DeadlineExceededError(
      absl::StrCat(timeout.message(), "; rank", missing.size() > 1 ? "s " : " ",
                   absl::StrJoin(missing, ", "), " never published ",
                   missing.size() > 1 ? "their" : "its", " address"));
  SetAbsent(&s, missing.front());
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(
    std::shared_ptr<Store> store, const BackendOptions& options) {
  tcp::attr attr;
  if (!options.interface.empty()) {
    attr.iface = options.interface;
  } else {
    attr.hostname = options.bind_address;
  }
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    device =
        config::StringParam("HOLDFAST_LINK_HANDSHAKE") == "0"
            ? tcp::CreateDevice(attr)
            : CreateAuthDevice(attr, {options.generation, options.link_secret});
  } catch (const std::system_error& e) {
    // Its event loop's thread could not start (a pids limit).
    return absl::ResourceExhaustedError(
        absl::StrCat("gloo: cannot start the transport's thread: ", e.what()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "gloo: cannot listen on ",
        options.interface.empty() ? "address '" + options.bind_address
                                  : "interface '" + options.interface,
        "': ", e.what()));
  }

  auto context = std::make_shared<MeshContext>(options.rank, options.size);
  context->setTimeout(ToChrono(options.connect_timeout));
  // Each rank publishes its addresses under its rank number.
  std::shared_ptr<Store> rendezvous = NewPrefixStore(
      keys::GlooRendezvousPrefix(options.generation), std::move(store));
  absl::Status s = context->Connect(
      *rendezvous, device, options.connect_timeout,
      static_cast<int>(std::min<int64_t>(
          config::IntParam("HOLDFAST_CONNECT_THREADS"), 1 << 16)),
      options.cancelled);
  if (!s.ok()) {
    absl::Status out =
        Annotate(s, absl::StrCat("rendezvous of rank ", options.rank, " of ",
                                 options.size, " (generation ",
                                 options.generation, ") failed"));
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      return RendezvousTimeout(*rendezvous, options, out);
    }
    return out;
  }
  return std::unique_ptr<Backend>(
      new GlooBackend(options, std::move(context), std::move(device)));
}

}  // namespace holdfast::backend
