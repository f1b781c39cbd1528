#include "src/checkpoint/bulk.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>  // NOLINT(build/c++11)
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "holdfast/status.h"
#include "src/common/link_auth.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"

namespace holdfast::bulk {
namespace {

constexpr char kHelloMagic[8] = {'H', 'F', 'B', 'U', 'L', 'K', '0', '2'};
constexpr char kPieceMagic[8] = {'H', 'F', 'B', 'P', 'I', 'E', 'C', 'E'};
// How long an accepted connection may take to say who it is.
constexpr absl::Duration kHelloTimeout = absl::Seconds(2);
// Accepted connections in their handshake at once (AcceptFrom).
constexpr size_t kMaxAdmissions = 16;
// Connects of an owner whose handshake the buddy closed (ConnectTo).
constexpr int kDialAttempts = 4;
using link_auth::kMac;
using link_auth::kNonce;

// Owner to buddy.
struct Hello {
  char magic[8];
  int64_t generation;
  int64_t from_slot;
  int64_t to_slot;
  uint8_t nonce[kNonce];
};
static_assert(sizeof(Hello) == 48, "the hello layout is fixed");
// Buddy to owner.
struct Challenge {
  uint8_t nonce[kNonce];
  uint8_t mac[kMac];  // Mac(token, "buddy", hello, nonce)
};
static_assert(sizeof(Challenge) == 48, "the challenge layout is fixed");
// Owner to buddy: Mac(token, "owner", hello, challenge's nonce).
struct Proof {
  uint8_t mac[kMac];
};

// HMAC-SHA256 under `key` of `role`, the hello's bytes and `nonce`.
link_auth::Mac Mac(const std::string& key, absl::string_view role,
                   const Hello& hello, const uint8_t* nonce) {
  return link_auth::Sign(
      key, role,
      absl::string_view(reinterpret_cast<const char*>(&hello), sizeof(hello)),
      nonce);
}

struct PieceHeader {
  char magic[8];
  int64_t step;
  uint64_t bytes;
};
static_assert(sizeof(PieceHeader) == 24, "the header layout is fixed");

std::string Errno(int err) { return std::strerror(err); }

// Sets both I/O timeouts of `fd` (a call that moves no byte for that long
// fails with EAGAIN); at least 1 ms, since zero means "never".
void SetTimeouts(int fd, absl::Duration d) {
  d = std::max(d, absl::Milliseconds(1));
  const timeval tv = absl::ToTimeval(d);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The IPv4 address of network interface `name`.
absl::StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk: cannot list network interfaces: ", Errno(errno)));
  }
  std::string found;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET ||
        name != i->ifa_name) {
      continue;
    }
    char buf[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) != nullptr) {
      found = buf;
      break;
    }
  }
  freeifaddrs(all);
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat("bulk: network interface '", name,
                                            "' has no IPv4 address"));
  }
  return found;
}

// Receives exactly `size` bytes with the socket's own timeout: 0, the
// errno of the failure, or kEndOfStream when the peer closed its end;
// *done counts the bytes received.
constexpr int kEndOfStream = -1;
int RecvAll(int fd, void* data, size_t size, size_t* done) {
  auto* p = static_cast<uint8_t*>(data);
  *done = 0;
  while (*done < size) {
    const ssize_t n = recv(fd, p + *done, size - *done, 0);
    if (n > 0) {
      *done += static_cast<size_t>(n);
    } else if (n == 0) {
      return kEndOfStream;
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

}  // namespace

// ---- Listener ---------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Listener>> Listener::Open(
    const std::string& bind_address, const std::string& interface) {
  std::string host = bind_address.empty() ? "127.0.0.1" : bind_address;
  if (!interface.empty()) {
    absl::StatusOr<std::string> a = InterfaceAddress(interface);
    if (!a.ok()) return a.status();
    host = *a;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), "0", &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bulk: cannot resolve address '", host, "': ", gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = Errno(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    char name[NI_MAXHOST], port[NI_MAXSERV];
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0 ||
        getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, name,
                    sizeof(name), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      last = Errno(errno);
      close(fd);
      continue;
    }
    freeaddrinfo(res);
    return std::unique_ptr<Listener>(
        new Listener(fd, absl::StrCat(name, ":", port)));
  }
  freeaddrinfo(res);
  return absl::UnavailableError(
      absl::StrCat("bulk: cannot listen on '", host, "': ", last));
}

Listener::~Listener() { close(fd_); }

// ---- Links ------------------------------------------------------------------

Links::Links(int64_t generation, int slot, std::string token,
             absl::Duration io_timeout)
    : generation_(generation),
      slot_(slot),
      token_(std::move(token)),
      io_timeout_(io_timeout) {}

Links::~Links() {
  absl::MutexLock lock(&mu_);
  for (const auto& [peer, fd] : out_) close(fd);
  for (const auto& [peer, fd] : in_) close(fd);
}

absl::Status Links::Handshake(int fd, int peer) {
  Hello h{};
  std::memcpy(h.magic, kHelloMagic, sizeof(h.magic));
  h.generation = generation_;
  h.from_slot = slot_;
  h.to_slot = peer;
  if (!link_auth::Nonce(h.nonce)) {
    return absl::InternalError("bulk: no random bytes for a nonce (OpenSSL)");
  }
  HOLDFAST_RETURN_IF_ERROR(Write(fd, peer, &h, sizeof(h)));
  Challenge c{};
  HOLDFAST_RETURN_IF_ERROR(Read(fd, peer, &c, sizeof(c)));
  if (!link_auth::Equal(c.mac, Mac(token_, "buddy", h, c.nonce).data())) {
    return absl::PermissionDeniedError(
        absl::StrCat("bulk: slot ", peer,
                     "'s backup link did not prove the job's token "
                     "(another job's process on its port, or a wrong token)"));
  }
  Proof p{};
  const link_auth::Mac mac = Mac(token_, "owner", h, c.nonce);
  std::memcpy(p.mac, mac.data(), kMac);
  return Write(fd, peer, &p, sizeof(p));
}

absl::Status Links::ConnectTo(int peer, const std::string& address,
                              absl::Time deadline) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bulk: slot ", peer, " published a bad address '", address, "'"));
  }
  const std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("bulk: cannot resolve slot ",
                                               peer, "'s address '", address,
                                               "': ", gai_strerror(rc)));
  }
  // A buddy whose handshakes in progress are full drops the oldest for a
  // newcomer (StartAdmission), which may be this owner while connections
  // that say nothing flood its port. A closed handshake is tried again a
  // few times, after a pause: a buddy that refuses this owner by name (its
  // generation or slot) closes it the same way, and is told apart only by
  // doing so every time. A refused connect (the buddy is gone) and a
  // failed proof are not tried again.
  absl::Status s;
  for (int attempt = 1;; ++attempt) {
    bool dropped = false;
    s = Dial(peer, address, *res, deadline, &dropped);
    const absl::Duration pause = absl::Milliseconds(10) * attempt;
    if (s.ok() || !dropped || attempt == kDialAttempts ||
        absl::Now() + pause >= deadline) {
      break;
    }
    HOLDFAST_LOG_INFO(
        "bulk: slot {} closed our backup link's handshake ({}); connecting "
        "again",
        peer, std::string(s.message()));
    absl::SleepFor(pause);
  }
  freeaddrinfo(res);
  return s;
}

absl::Status Links::Dial(int peer, const std::string& address,
                         const addrinfo& to, absl::Time deadline,
                         bool* dropped) {
  const int fd = socket(to.ai_family, to.ai_socktype | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk: socket(): ", Errno(errno)));
  }
  // SO_SNDTIMEO bounds connect() too.
  SetTimeouts(fd, deadline - absl::Now());
  absl::Status s;
  if (connect(fd, to.ai_addr, to.ai_addrlen) != 0) {
    s = absl::UnavailableError(absl::StrCat("bulk: cannot connect to slot ",
                                            peer, " at ", address, ": ",
                                            Errno(errno)));
  } else {
    NoDelay(fd);
    // The buddy answers once it accepts, which may be the deadline away;
    // Abort() wakes the wait.
    SetTimeouts(fd, std::max(deadline - absl::Now(), io_timeout_));
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) s = absl::AbortedError(*aborted_);
      handshaking_.insert(fd);
    }
    if (s.ok()) {
      s = Handshake(fd, peer);
      // Connected, then closed or reset by the buddy before the proof:
      // Unavailable (a timeout is DeadlineExceeded, a bad proof
      // PermissionDenied, Abort() Aborted).
      *dropped = absl::IsUnavailable(s);
    }
    SetTimeouts(fd, io_timeout_);
  }
  absl::MutexLock lock(&mu_);
  handshaking_.erase(fd);
  if (s.ok() && aborted_) s = absl::AbortedError(*aborted_);
  if (aborted_) *dropped = false;
  if (s.ok() && out_.count(peer) != 0) {
    s = absl::FailedPreconditionError(
        absl::StrCat("bulk: a second link to slot ", peer));
  }
  if (!s.ok()) {
    close(fd);
    return s;
  }
  out_[peer] = fd;
  return absl::OkStatus();
}

// AcceptFrom's handshakes, each on a thread of its own: a connection that
// sends nothing holds only itself, not the owners that come after it.
struct Links::Admissions {
  struct Ended {
    int fd = -1;
    int from = -1;
    std::string why;  // "" once an owner proved the token
  };
  Admissions() {
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) wake[0] = wake[1] = -1;
  }
  ~Admissions() {
    for (int fd : wake) {
      if (fd >= 0) close(fd);
    }
  }
  int wake[2] = {-1, -1};              // a byte for each handshake that ended
  std::map<int, std::thread> threads;  // by socket; joined when taken
  absl::Mutex mu;
  // By socket: when it was accepted, and whether it is being shut down
  // to make room.
  struct Running {
    absl::Time accepted;
    bool dropped = false;
  };
  std::map<int, Running> running ABSL_GUARDED_BY(mu);
  std::vector<Ended> ended ABSL_GUARDED_BY(mu);
};

absl::Status Links::AcceptFrom(const Listener& listener,
                               const std::vector<int>& peers,
                               absl::Time deadline,
                               const Cancelled& cancelled) {
  std::set<int> want(peers.begin(), peers.end());
  Admissions a;
  absl::Status s = AcceptLoop(listener, &want, deadline, cancelled, a);
  EndAdmissions(a);
  return s;
}

absl::Status Links::AcceptLoop(const Listener& listener, std::set<int>* want,
                               absl::Time deadline, const Cancelled& cancelled,
                               Admissions& a) {
  while (!want->empty()) {
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return absl::AbortedError(*aborted_);
    }
    if (cancelled) {
      if (std::optional<std::string> why = cancelled()) {
        return absl::AbortedError(*why);
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      absl::Status s = absl::DeadlineExceededError(
          absl::StrCat("bulk: slot ", slot_, " of generation ", generation_,
                       ": no link from slot", want->size() > 1 ? "s " : " ",
                       absl::StrJoin(*want, ", "), " by the deadline"));
      SetAbsent(&s, *want->begin());  // the recovery blames it
      return s;
    }
    // A negative descriptor (no wake pipe) is ignored: 100 ms polls then.
    pollfd p[2] = {{listener.fd(), POLLIN, 0}, {a.wake[0], POLLIN, 0}};
    const int ms = static_cast<int>(
        std::min<int64_t>(100, absl::ToInt64Milliseconds(left) + 1));
    if (poll(p, 2, ms) > 0 && (p[0].revents & POLLIN) != 0) {
      const int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) StartAdmission(a, fd, *want, left);
    }
    HOLDFAST_RETURN_IF_ERROR(TakeAdmissions(a, want));
  }
  return absl::OkStatus();
}

void Links::StartAdmission(Admissions& a, int fd, const std::set<int>& want,
                           absl::Duration left) {
  {
    absl::MutexLock lock(&a.mu);
    size_t live = 0;
    auto oldest = a.running.end();
    for (auto it = a.running.begin(); it != a.running.end(); ++it) {
      if (it->second.dropped) continue;
      ++live;
      if (oldest == a.running.end() ||
          it->second.accepted < oldest->second.accepted) {
        oldest = it;
      }
    }
    if (a.running.size() >= 2 * kMaxAdmissions) {
      HOLDFAST_LOG_WARN(
          "bulk: slot {} of generation {} refused a backup link: {} "
          "handshakes are in progress, {} of them being shut down",
          slot_, generation_, a.running.size(), a.running.size() - live);
      close(fd);
      return;
    }
    if (live >= kMaxAdmissions) {
      // Its thread sees the shutdown and ends with its refusal.
      HOLDFAST_LOG_WARN(
          "bulk: slot {} of generation {}: {} backup links in their "
          "handshake; the oldest ({} ms) is dropped for a new one",
          slot_, generation_, live,
          absl::ToInt64Milliseconds(absl::Now() - oldest->second.accepted));
      shutdown(oldest->first, SHUT_RDWR);
      oldest->second.dropped = true;
    }
    a.running[fd] = Admissions::Running{absl::Now()};
  }
  {
    absl::MutexLock lock(&mu_);
    handshaking_.insert(fd);  // Abort() wakes it
    if (aborted_) shutdown(fd, SHUT_RDWR);
  }
  SetTimeouts(fd, std::min(kHelloTimeout, left));
  a.threads.emplace(fd, std::thread([this, &a, fd, want] {
                      Admissions::Ended e{fd, -1, ""};
                      e.why = Admit(fd, want, &e.from);
                      {
                        absl::MutexLock lock(&mu_);
                        handshaking_.erase(fd);
                      }
                      {
                        absl::MutexLock lock(&a.mu);
                        // Shut down to make room as it ended: unusable.
                        if (e.why.empty() && a.running[fd].dropped) {
                          e.why = "it was dropped to make room";
                        }
                        a.running.erase(fd);
                        a.ended.push_back(std::move(e));
                      }
                      const char byte = 1;
                      (void)!write(a.wake[1], &byte, 1);
                    }));
}

absl::Status Links::TakeAdmissions(Admissions& a, std::set<int>* want) {
  std::vector<Admissions::Ended> ended;
  {
    absl::MutexLock lock(&a.mu);
    ended.swap(a.ended);
  }
  char drain[64];
  while (read(a.wake[0], drain, sizeof(drain)) > 0) {
  }
  absl::Status s;
  for (Admissions::Ended& e : ended) {
    auto t = a.threads.find(e.fd);
    t->second.join();
    a.threads.erase(t);
    if (e.why.empty() && want->count(e.from) == 0) {
      e.why = absl::StrCat("slot ", e.from, " came twice");
    }
    if (!e.why.empty()) {
      HOLDFAST_LOG_WARN(
          "bulk: slot {} of generation {} refused a backup link: {}", slot_,
          generation_, e.why);
      close(e.fd);
      continue;
    }
    NoDelay(e.fd);
    SetTimeouts(e.fd, io_timeout_);
    absl::MutexLock lock(&mu_);
    if (aborted_) {
      close(e.fd);
      s = absl::AbortedError(*aborted_);
      continue;
    }
    in_[e.from] = e.fd;
    want->erase(e.from);
  }
  return s;
}

void Links::EndAdmissions(Admissions& a) {
  {
    absl::MutexLock lock(&a.mu);
    for (const auto& [fd, r] : a.running) shutdown(fd, SHUT_RDWR);
  }
  for (auto& [fd, t] : a.threads) t.join();
  a.threads.clear();
  absl::MutexLock lock(&a.mu);
  for (const Admissions::Ended& e : a.ended) close(e.fd);
  a.ended.clear();
}

std::string Links::Admit(int fd, const std::set<int>& want, int* from) {
  Hello h{};
  size_t got = 0;
  if (RecvAll(fd, &h, sizeof(h), &got) != 0 ||
      std::memcmp(h.magic, kHelloMagic, sizeof(h.magic)) != 0) {
    return "it did not open with a holdfast hello";
  }
  if (h.generation != generation_) {
    return absl::StrCat("it is of generation ", h.generation);
  }
  if (h.to_slot != slot_) {
    return absl::StrCat("it is for slot ", h.to_slot);
  }
  if (want.count(static_cast<int>(h.from_slot)) == 0) {
    return absl::StrCat("slot ", h.from_slot,
                        " is not expected (or came twice)");
  }
  Challenge c{};
  if (!link_auth::Nonce(c.nonce))
    return "no random bytes for a nonce (OpenSSL)";
  const link_auth::Mac mine = Mac(token_, "buddy", h, c.nonce);
  std::memcpy(c.mac, mine.data(), kMac);
  Proof p{};
  if (send(fd, &c, sizeof(c), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(sizeof(c)) ||
      RecvAll(fd, &p, sizeof(p), &got) != 0) {
    return absl::StrCat("slot ", h.from_slot, " did not answer the challenge");
  }
  if (!link_auth::Equal(p.mac, Mac(token_, "owner", h, c.nonce).data())) {
    return absl::StrCat(
        "its proof of the job's token is wrong (a wrong "
        "token, or a replayed handshake) for slot ",
        h.from_slot);
  }
  *from = static_cast<int>(h.from_slot);
  return "";
}

absl::StatusOr<int> Links::Fd(int peer, bool out) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return absl::AbortedError(*aborted_);
  const std::map<int, int>& m = out ? out_ : in_;
  auto it = m.find(peer);
  if (it == m.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bulk: no backup link ", out ? "to" : "from", " slot ", peer));
  }
  return it->second;
}

absl::Status Links::IoError(int peer, const char* what, int err, size_t done,
                            size_t total) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError(*aborted_);
  }
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return absl::DeadlineExceededError(absl::StrCat(
        "bulk: the backup link with slot ", peer, " made no progress for ",
        absl::FormatDuration(io_timeout_), " (", what, " ", done, " of ", total,
        " bytes)"));
  }
  if (err == 0) {
    return absl::UnavailableError(
        absl::StrCat("bulk: slot ", peer, " closed its backup link (", what,
                     " ", done, " of ", total, " bytes)"));
  }
  return absl::UnavailableError(absl::StrCat(
      "bulk: the backup link with slot ", peer, " failed: ", Errno(err), " (",
      what, " ", done, " of ", total, " bytes)"));
}

absl::Status Links::Write(int fd, int peer, const void* data, size_t size,
                          size_t at, size_t total) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = send(fd, p + done, size - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return IoError(peer, "sent", n < 0 ? errno : EPIPE, at + done,
                     total == 0 ? size : total);
    }
  }
  return absl::OkStatus();
}

absl::Status Links::Read(int fd, int peer, void* data, size_t size, size_t at,
                         size_t total) {
  size_t done = 0;
  const int err = RecvAll(fd, data, size, &done);
  if (err == 0) return absl::OkStatus();
  return IoError(peer, "received", err == kEndOfStream ? 0 : err, at + done,
                 total == 0 ? size : total);
}

absl::Status Links::SendPiece(int peer, int64_t step, const uint8_t* data,
                              size_t size, pieces::CopyHasher* hasher) {
  absl::StatusOr<int> fd = Fd(peer, /*out=*/true);
  if (!fd.ok()) return fd.status();
  PieceHeader h{};
  std::memcpy(h.magic, kPieceMagic, sizeof(h.magic));
  h.step = step;
  h.bytes = size;
  absl::Status s = Write(*fd, peer, &h, sizeof(h));
  for (size_t off = 0; s.ok() && off < size; off += kChunkBytes) {
    const size_t n = std::min(kChunkBytes, size - off);
    if (hasher != nullptr) hasher->Update(data + off, n);
    s = Write(*fd, peer, data + off, n, off, size);
  }
  return s;
}

absl::Status Links::SendTrailer(int peer, const PieceTrailer& trailer) {
  absl::StatusOr<int> fd = Fd(peer, /*out=*/true);
  if (!fd.ok()) return fd.status();
  return Write(*fd, peer, &trailer, sizeof(trailer));
}

absl::Status Links::RecvPiece(
    int peer, int64_t step, uint8_t* data, size_t size,
    const std::function<void(size_t, size_t)>& landed) {
  absl::StatusOr<int> fd = Fd(peer, /*out=*/false);
  if (!fd.ok()) return fd.status();
  PieceHeader h{};
  HOLDFAST_RETURN_IF_ERROR(Read(*fd, peer, &h, sizeof(h)));
  if (std::memcmp(h.magic, kPieceMagic, sizeof(h.magic)) != 0 ||
      h.step != step || h.bytes != size) {
    return absl::InternalError(absl::StrCat(
        "bulk: slot ", peer, " sent ",
        std::memcmp(h.magic, kPieceMagic, sizeof(h.magic)) != 0
            ? std::string("something that is not a piece header")
            : absl::StrCat("its piece of step ", h.step, " (", h.bytes,
                           " bytes)"),
        " where its piece of step ", step, " (", size, " bytes) was expected"));
  }
  for (size_t off = 0; off < size; off += kChunkBytes) {
    const size_t n = std::min(kChunkBytes, size - off);
    HOLDFAST_RETURN_IF_ERROR(Read(*fd, peer, data + off, n, off, size));
    if (landed) landed(off, n);
  }
  return absl::OkStatus();
}

absl::StatusOr<PieceTrailer> Links::RecvTrailer(int peer) {
  absl::StatusOr<int> fd = Fd(peer, /*out=*/false);
  if (!fd.ok()) return fd.status();
  PieceTrailer t;
  HOLDFAST_RETURN_IF_ERROR(Read(*fd, peer, &t, sizeof(t)));
  return t;
}

void Links::Abort(absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return;
  aborted_ = std::string(reason);
  // Shut down, not closed: a thread may be blocked on the socket, and a
  // closed descriptor's number could be reused under it.
  for (const auto& [peer, fd] : out_) shutdown(fd, SHUT_RDWR);
  for (const auto& [peer, fd] : in_) shutdown(fd, SHUT_RDWR);
  for (int fd : handshaking_) shutdown(fd, SHUT_RDWR);
}

}  // namespace holdfast::bulk
