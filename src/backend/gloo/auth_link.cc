#include "src/backend/gloo/auth_link.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include <gloo/common/error.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "src/common/logging.h"

namespace holdfast::backend {
namespace tcp = ::gloo::transport::tcp;

namespace gloo_link {
namespace {
absl::string_view Bytes(const Hello& h) {
  return absl::string_view(reinterpret_cast<const char*>(&h), sizeof(h));
}
}  // namespace

link_auth::Mac AcceptorMac(const std::string& secret, const Hello& hello,
                           const uint8_t* nonce) {
  return link_auth::Sign(secret, "gloo-acceptor", Bytes(hello), nonce);
}

link_auth::Mac ConnectorMac(const std::string& secret, const Hello& hello,
                            const uint8_t* nonce) {
  return link_auth::Sign(secret, "gloo-connector", Bytes(hello), nonce);
}

}  // namespace gloo_link

namespace {

using gloo_link::Challenge;
using gloo_link::Hello;
using gloo_link::Proof;

// Connections to one pair's listener in their handshake at once; one more
// closes the oldest.
constexpr size_t kMaxCandidates = 16;
constexpr int kBacklog = 64;
// How long a candidate may take to finish its handshake once another
// connection comes.
constexpr absl::Duration kCandidateTimeout = absl::Seconds(2);

std::string Errno(int err) { return std::strerror(err); }

// A connection to a pair's listener, until it proves the secret.
struct Candidate {
  absl::Time accepted;
  std::string from;  // its address, for the log
  bool challenged = false;
  size_t got = 0;  // bytes of the hello, then of the proof
  Hello hello{};
  Challenge challenge{};
  Proof proof{};
};

// Receives what is there of the `size - *got` bytes still missing at
// `data + *got` without waiting: 0 once complete, EAGAIN if more must come,
// else why not (-1 for the end of the stream).
int RecvSome(int fd, void* data, size_t size, size_t* got) {
  while (*got < size) {
    const ssize_t n =
        recv(fd, static_cast<char*>(data) + *got, size - *got, MSG_DONTWAIT);
    if (n > 0) {
      *got += static_cast<size_t>(n);
    } else if (n == 0) {
      return -1;
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

bool SendAll(int fd, const void* data, size_t size) {
  // Small messages on a socket that has sent nothing else: they fit in its
  // buffer, so a short send means the connection failed.
  return send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(size);
}

// The port of `a` (IPv4 or IPv6), in host order.
uint32_t Port(const tcp::Address& a) {
  const sockaddr_storage& ss = a.getSockaddr();
  if (ss.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
}

std::string PeerName(int fd) {
  try {
    return tcp::Address::fromPeerName(fd).str();
  } catch (const std::exception&) {
    return "an unknown address";
  }
}

class AuthPair final : public tcp::Pair {
 public:
  AuthPair(tcp::Context* context, tcp::Device* device, int self, int peer,
           std::chrono::milliseconds timeout, const LinkIdentity* id)
      : tcp::Pair(context, device, peer, timeout),
        self_rank_(self),
        id_(id),
        candidate_events_(this) {
    // Gloo's listener blocks; accepting on it from the event loop must not
    // (a connection reset before it is accepted would block the loop). Its
    // backlog is 1: connections that come together would wait for TCP's
    // retransmission (a second) behind one another.
    std::lock_guard<std::mutex> lock(m_);
    if (fd_ >= 0) {
      fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
      ::listen(fd_, kBacklog);
    }
  }

  ~AuthPair() override {
    std::lock_guard<std::mutex> lock(m_);
    DropCandidates();
  }

  bool ConnectReachedPeer() {
    std::lock_guard<std::mutex> lock(m_);
    return hello_sent_;
  }

  // Gloo's event loop: the handshake on either side, then Gloo's own reads
  // and writes. Nothing thrown here may reach the loop (it would end the
  // process): it fails the pair instead.
  void handleEvents(int events) override {
    std::unique_lock<std::mutex> lock(m_, std::try_to_lock);
    if (!lock || state_ == CLOSED || ex_ != nullptr) return;
    try {
      if (state_ == CONNECTED) {
        handleReadWrite(events);
      } else if (state_ == LISTENING) {
        Accept();
      } else if (state_ == CONNECTING) {
        Connecting();
      }
    } catch (const std::exception& e) {
      Fail(absl::StrCat("holdfast: the link to rank ", rank_, " at ",
                        peer_.str(), " failed: ", e.what()));
    }
  }

 protected:
  // Checks a frame's preamble before Gloo acts on it (Gloo enforces some of
  // it by throwing, some not at all).
  bool read() override {
    if (state_ == CLOSED) return false;
    if (rx_.nread < sizeof(rx_.preamble)) {
      const int rc =
          RecvSome(fd_, &rx_.preamble, sizeof(rx_.preamble), &rx_.nread);
      if (rc == EAGAIN || rc == EWOULDBLOCK) return false;
      if (rc == -1) {
        // Gloo's own words: the backend reads "closed" as the peer's end.
        Fail(GLOO_ERROR_MSG("Connection closed by peer ", peer_.str()));
        return false;
      }
      if (rc != 0) {
        Fail(GLOO_ERROR_MSG("Read error ", peer_.str(), ": ", Errno(rc)));
        return false;
      }
      const std::string bad = BadPreamble();
      if (!bad.empty()) {
        Fail(absl::StrCat("holdfast: rank ", rank_, " at ", peer_.str(),
                          " sent a frame that is not valid (", bad,
                          "); the link is closed"));
        return false;
      }
    }
    return tcp::Pair::read();
  }

  void changeState(state next) noexcept override {
    if (next == CLOSED) DropCandidates();
    tcp::Pair::changeState(next);
  }

 private:
  // Runs HandleCandidates when a candidate's socket is readable.
  class CandidateEvents final : public tcp::Handler {
   public:
    explicit CandidateEvents(AuthPair* pair) : pair_(pair) {}
    void handleEvents(int /*events*/) override { pair_->HandleCandidates(); }

   private:
    AuthPair* const pair_;
  };

  enum class Step { kMore, kRefused, kAdmitted };

  void Fail(const std::string& msg) {
    if (ex_ == nullptr) signalException(msg);
  }

  // "" if the preamble in rx_ is one Gloo can act on, else what is wrong.
  std::string BadPreamble() {
    const auto& p = rx_.preamble;
    const size_t header = sizeof(p);
    switch (p.opcode) {
      case tcp::Op::SEND_BUFFER:
      case tcp::Op::SEND_UNBOUND_BUFFER:
        if (p.nbytes != header + p.length || p.length > p.nbytes) {
          return absl::StrCat("a length of ", p.length, " in a frame of ",
                              p.nbytes, " bytes");
        }
        break;
      case tcp::Op::NOTIFY_SEND_READY:
      case tcp::Op::NOTIFY_RECV_READY:
        if (p.nbytes != header) {
          return absl::StrCat("a notice of ", p.nbytes, " bytes");
        }
        return "";
      default:
        return absl::StrCat("opcode ", p.opcode);
    }
    if (p.opcode == tcp::Op::SEND_UNBOUND_BUFFER) {
      auto it = localPendingRecv_.find(p.slot);
      if (it == localPendingRecv_.end() || it->second.empty()) {
        return absl::StrCat("data for slot ", p.slot,
                            ", which it was not asked for");
      }
      if (p.length > std::get<2>(it->second.front())) {
        return absl::StrCat(p.length, " bytes for a receive of ",
                            std::get<2>(it->second.front()));
      }
    }
    return "";
  }

  // The listener is readable: one more candidate.
  void Accept() {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // gone already, or no descriptor left: later
    if (candidate_poll_ < 0) {
      candidate_poll_ = epoll_create1(EPOLL_CLOEXEC);
      if (candidate_poll_ < 0) {
        ::close(fd);
        return;
      }
      device_->registerDescriptor(candidate_poll_, EPOLLIN, &candidate_events_);
    }
    Expire();
    if (candidates_.size() >= kMaxCandidates) {
      auto oldest = candidates_.begin();
      for (auto it = candidates_.begin(); it != candidates_.end(); ++it) {
        if (it->second.accepted < oldest->second.accepted) oldest = it;
      }
      Refuse(oldest, "too many connections in their handshake");
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(candidate_poll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      return;
    }
    Candidate& c = candidates_[fd];
    c.accepted = absl::Now();
    c.from = PeerName(fd);
  }

  // Gloo's event loop, when a candidate's socket is readable.
  void HandleCandidates() {
    std::unique_lock<std::mutex> lock(m_, std::try_to_lock);
    if (!lock || candidate_poll_ < 0) return;
    if (state_ != LISTENING) {
      DropCandidates();
      return;
    }
    epoll_event ready[kMaxCandidates];
    const int n = epoll_wait(candidate_poll_, ready, kMaxCandidates, 0);
    for (int i = 0; i < n; ++i) {
      auto it = candidates_.find(ready[i].data.fd);
      if (it == candidates_.end()) continue;
      std::string why;
      const Step step = Advance(it->first, it->second, &why);
      if (step == Step::kRefused) {
        Refuse(it, why);
      } else if (step == Step::kAdmitted) {
        const int fd = it->first;
        epoll_ctl(candidate_poll_, EPOLL_CTL_DEL, fd, nullptr);
        candidates_.erase(it);
        Admit(fd);
        return;
      }
    }
    Expire();
  }

  // Reads what candidate `fd` sent and answers it.
  Step Advance(int fd, Candidate& c, std::string* why) {
    const bool proof = c.challenged;
    const int rc = proof ? RecvSome(fd, &c.proof, sizeof(c.proof), &c.got)
                         : RecvSome(fd, &c.hello, sizeof(c.hello), &c.got);
    if (rc == EAGAIN || rc == EWOULDBLOCK) return Step::kMore;
    if (rc != 0) {
      *why = rc == -1
                 ? absl::StrCat("it closed the connection after ", c.got,
                                " bytes of its ", proof ? "proof" : "hello")
                 : Errno(rc);
      return Step::kRefused;
    }
    if (proof) {
      if (!link_auth::Equal(
              c.proof.mac,
              gloo_link::ConnectorMac(id_->secret, c.hello, c.challenge.nonce)
                  .data())) {
        *why =
            "its proof of the job's secret is wrong (another job's secret, "
            "or a replayed handshake)";
        return Step::kRefused;
      }
      return Step::kAdmitted;
    }
    const Hello& h = c.hello;
    if (std::memcmp(h.magic, gloo_link::kMagic, sizeof(h.magic)) != 0) {
      *why = "it is not a holdfast link (no link hello)";
      return Step::kRefused;
    }
    if (h.generation != id_->generation) {
      *why = absl::StrCat("it is of generation ", h.generation);
      return Step::kRefused;
    }
    if (h.to_rank != self_rank_ || h.from_rank != rank_) {
      *why =
          absl::StrCat("it links rank ", h.from_rank, " to rank ", h.to_rank);
      return Step::kRefused;
    }
    if (h.to_port != Port(self_)) {
      *why = absl::StrCat("it is for port ", h.to_port, ", not ", Port(self_));
      return Step::kRefused;
    }
    if (!link_auth::Nonce(c.challenge.nonce)) {
      *why = "no random bytes for a nonce (OpenSSL)";
      return Step::kRefused;
    }
    const link_auth::Mac mac =
        gloo_link::AcceptorMac(id_->secret, h, c.challenge.nonce);
    std::memcpy(c.challenge.mac, mac.data(), mac.size());
    if (!SendAll(fd, &c.challenge, sizeof(c.challenge))) {
      *why = "the challenge could not be sent";
      return Step::kRefused;
    }
    c.challenged = true;
    c.got = 0;
    return Step::kMore;
  }

  void Refuse(std::map<int, Candidate>::iterator it, const std::string& why) {
    HOLDFAST_LOG_WARN(
        "gloo: generation {}, rank {}: refused a connection from {} to its "
        "link with rank {}: {}",
        id_->generation, self_rank_, it->second.from, rank_, why);
    epoll_ctl(candidate_poll_, EPOLL_CTL_DEL, it->first, nullptr);
    ::close(it->first);
    candidates_.erase(it);
  }

  // Refuses candidates that have had kCandidateTimeout.
  void Expire() {
    const absl::Time now = absl::Now();
    for (auto it = candidates_.begin(); it != candidates_.end();) {
      auto next = std::next(it);
      if (now - it->second.accepted > kCandidateTimeout) {
        Refuse(it, "it did not finish its handshake in time");
      }
      it = next;
    }
  }

  // Candidate `fd` proved the secret: it becomes the pair's connection, as
  // Gloo's own accept would have made it.
  void Admit(int fd) {
    DropCandidates();
    device_->unregisterDescriptor(fd_, this);
    ::close(fd_);
    fd_ = fd;
    handleConnected();
  }

  // Closes every candidate and their poll. With m_ held; noexcept.
  void DropCandidates() noexcept {
    for (const auto& entry : candidates_) ::close(entry.first);
    candidates_.clear();
    if (candidate_poll_ < 0) return;
    try {
      device_->unregisterDescriptor(candidate_poll_, &candidate_events_);
    } catch (const std::exception&) {
      // Never registered: nothing to undo.
    }
    ::close(candidate_poll_);
    candidate_poll_ = -1;
  }

  // The connecting side: the connect completed (or failed), then the
  // challenge comes.
  void Connecting() {
    if (!hello_sent_) {
      int err = 0;
      socklen_t len = sizeof(err);
      if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        // Gloo's own words, which the backend reads.
        Fail(GLOO_ERROR_MSG("connect ", peer_.str(), ": ", Errno(err)));
        return;
      }
      Hello& h = hello_;
      std::memcpy(h.magic, gloo_link::kMagic, sizeof(h.magic));
      h.generation = id_->generation;
      h.from_rank = self_rank_;
      h.to_rank = rank_;
      h.to_port = Port(peer_);
      if (!link_auth::Nonce(h.nonce)) {
        Fail("holdfast: no random bytes for a link nonce (OpenSSL)");
        return;
      }
      if (!SendAll(fd_, &h, sizeof(h))) {
        Fail(GLOO_ERROR_MSG(
            "connect ", peer_.str(),
            ": the link hello could not be sent: ", Errno(errno)));
        return;
      }
      hello_sent_ = true;
      device_->registerDescriptor(fd_, EPOLLIN, this);
      return;
    }
    const int rc = RecvSome(fd_, &challenge_, sizeof(challenge_), &got_);
    if (rc == EAGAIN || rc == EWOULDBLOCK) return;
    if (rc != 0) {
      Fail(GLOO_ERROR_MSG(
          "connect ", peer_.str(), ": ",
          rc == -1 ? "the connection was closed during the link handshake "
                     "(the peer refused this rank's generation, ranks or "
                     "secret; see its log)"
                   : Errno(rc)));
      return;
    }
    if (!link_auth::Equal(
            challenge_.mac,
            gloo_link::AcceptorMac(id_->secret, hello_, challenge_.nonce)
                .data())) {
      Fail(absl::StrCat("holdfast: rank ", rank_, " at ", peer_.str(),
                        " did not prove the job's secret (another job's "
                        "process on its port, or a wrong secret)"));
      return;
    }
    Proof p{};
    const link_auth::Mac mac =
        gloo_link::ConnectorMac(id_->secret, hello_, challenge_.nonce);
    std::memcpy(p.mac, mac.data(), mac.size());
    if (!SendAll(fd_, &p, sizeof(p))) {
      Fail(
          GLOO_ERROR_MSG("connect ", peer_.str(),
                         ": the link proof could not be sent: ", Errno(errno)));
      return;
    }
    handleConnected();
  }

  const int self_rank_;
  const LinkIdentity* const id_;  // the device's; it outlives its pairs
  CandidateEvents candidate_events_;
  // The accepting side; guarded by m_.
  std::map<int, Candidate> candidates_;  // by descriptor
  int candidate_poll_ = -1;              // an epoll of candidates_
  // The connecting side; guarded by m_.
  bool hello_sent_ = false;
  Hello hello_{};
  Challenge challenge_{};
  size_t got_ = 0;
};

class AuthContext final : public tcp::Context {
 public:
  AuthContext(std::shared_ptr<tcp::Device> device, int rank, int size,
              const LinkIdentity* id)
      : tcp::Context(std::move(device), rank, size), id_(id) {}

  std::unique_ptr<::gloo::transport::Pair>& createPair(int peer) override {
    pairs_[static_cast<size_t>(peer)] = std::make_unique<AuthPair>(
        this, device_.get(), rank, peer, getTimeout(), id_);
    return pairs_[static_cast<size_t>(peer)];
  }

 private:
  const LinkIdentity* const id_;
};

class AuthDevice final : public tcp::Device {
 public:
  AuthDevice(const tcp::attr& attr, LinkIdentity id)
      : tcp::Device(tcp::CreateDeviceAttr(attr)), id_(std::move(id)) {}

  std::shared_ptr<::gloo::transport::Context> createContext(int rank,
                                                            int size) override {
    return std::make_shared<AuthContext>(
        std::static_pointer_cast<tcp::Device>(shared_from_this()), rank, size,
        &id_);
  }

 private:
  const LinkIdentity id_;
};

}  // namespace

bool ConnectReachedPeer(::gloo::transport::Pair* pair) {
  auto* p = dynamic_cast<AuthPair*>(pair);
  return p != nullptr && p->ConnectReachedPeer();
}

std::shared_ptr<::gloo::transport::Device> CreateAuthDevice(
    const tcp::attr& attr, LinkIdentity identity) {
  return std::make_shared<AuthDevice>(attr, std::move(identity));
}

}  // namespace holdfast::backend
