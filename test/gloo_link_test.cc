// Gloo pairs with holdfast's link handshake (src/backend/gloo/auth_link.h),
// on real loopback sockets. A test process plays the peer rank with raw
// sockets: hostile connections to a pair's listener (random bytes, silence,
// another generation, a wrong secret, a replayed handshake) are refused and
// leave the pair to its real peer; hostile frames on a connected pair fail
// that pair, by name, and never end the process. Communicators of 3 ranks
// with the secret reduce; one with another secret cannot join.
//
// HOLDFAST_TEST_PLAIN_GLOO=1 runs the pair tests on Gloo's own TCP device
// instead, to see them fail there (the peer then skips the handshake).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/time/clock.h"
#include "holdfast/communicator.h"
#include "holdfast/store.h"
#include "src/backend/gloo/auth_link.h"

namespace {

namespace tcp = ::gloo::transport::tcp;
using holdfast::backend::CreateAuthDevice;
using holdfast::backend::LinkIdentity;
namespace link = holdfast::backend::gloo_link;

const std::string kSecret = "the job's secret";
constexpr int64_t kGeneration = 7;

bool Plain() {
  const char* v = std::getenv("HOLDFAST_TEST_PLAIN_GLOO");
  return v != nullptr && std::string(v) == "1";
}

std::shared_ptr<::gloo::transport::Device> Device(
    const std::string& secret = kSecret) {
  tcp::attr attr;
  attr.hostname = "127.0.0.1";
  if (Plain()) return tcp::CreateDevice(attr);
  return CreateAuthDevice(attr, LinkIdentity{kGeneration, secret});
}

// Rank 0 of a group of 2, with its pair for rank 1 listening. Rank 0
// accepts: its connect() is given an address that sorts above its own.
struct Acceptor {
  std::shared_ptr<::gloo::transport::Device> device = Device();
  std::shared_ptr<::gloo::transport::Context> context;
  ::gloo::transport::Pair* pair = nullptr;
  int port = 0;
  std::future<std::string> connected;  // "" or the connect's error

  Acceptor() {
    context = device->createContext(0, 2);
    context->setTimeout(std::chrono::seconds(5));
    pair = context->createPair(1).get();
    tcp::Address self(pair->address().bytes());
    port = ntohs(
        reinterpret_cast<const sockaddr_in&>(self.getSockaddr()).sin_port);
    sockaddr_in above{};
    above.sin_family = AF_INET;
    above.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    above.sin_port = 0xffff;  // sorts above any other port
    const std::vector<char> peer =
        tcp::Address(reinterpret_cast<const sockaddr*>(&above), sizeof(above))
            .bytes();
    ::gloo::transport::Pair* p = pair;
    connected = std::async(std::launch::async, [p, peer]() -> std::string {
      try {
        p->connect(peer);
        return "";
      } catch (const std::exception& e) {
        return e.what();
      }
    });
  }

  bool Connected(std::chrono::milliseconds within) {
    return connected.wait_for(within) == std::future_status::ready &&
           connected.get().empty();
  }
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void Send(int fd, const void* data, size_t size) {
  REQUIRE(send(fd, data, size, MSG_NOSIGNAL) == static_cast<ssize_t>(size));
}

bool Recv(int fd, void* data, size_t size) {
  size_t got = 0;
  while (got < size) {
    const ssize_t n = recv(fd, static_cast<char*>(data) + got, size - got, 0);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

// Whether the other end closed `fd` within `within`.
bool ClosedWithin(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  const auto end = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < end) {
    if (poll(&p, 1, 50) == 1) {
      char buf[256];
      const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
  }
  return false;
}

link::Hello MakeHello(int port, int64_t generation = kGeneration, int from = 1,
                      int to = 0) {
  link::Hello h{};
  std::memcpy(h.magic, link::kMagic, sizeof(h.magic));
  h.generation = generation;
  h.from_rank = from;
  h.to_rank = to;
  h.to_port = static_cast<uint32_t>(port);
  REQUIRE(holdfast::link_auth::Nonce(h.nonce));
  return h;
}

// Rank 1's side of the handshake, as the pair's real peer. Returns the
// hello and proof it sent (what a recorder on the wire would see).
struct Recorded {
  link::Hello hello;
  link::Proof proof;
};
Recorded Handshake(int fd, int port, const std::string& secret = kSecret) {
  Recorded r{MakeHello(port), {}};
  if (Plain()) return r;
  Send(fd, &r.hello, sizeof(r.hello));
  link::Challenge c{};
  REQUIRE(Recv(fd, &c, sizeof(c)));
  // The acceptor proved the secret too.
  CHECK(holdfast::link_auth::Equal(
      c.mac, link::AcceptorMac(secret, r.hello, c.nonce).data()));
  const holdfast::link_auth::Mac mac =
      link::ConnectorMac(secret, r.hello, c.nonce);
  std::memcpy(r.proof.mac, mac.data(), mac.size());
  Send(fd, &r.proof, sizeof(r.proof));
  return r;
}

// Gloo's frame header (tcp::Op's preamble).
struct Preamble {
  size_t nbytes, opcode, slot, offset, length, roffset;
};

// The acceptor sends `text` on `slot` and the raw peer receives it through
// Gloo's own protocol: the connection is the pair's.
void ExpectPairCarries(Acceptor& a, int fd, uint64_t slot) {
  std::string text = "the pair is the peer's";
  auto buf = a.context->createUnboundBuffer(text.data(), text.size());
  buf->send(1, slot);
  Preamble ready{};
  REQUIRE(Recv(fd, &ready, sizeof(ready)));
  CHECK(ready.opcode == tcp::Op::NOTIFY_SEND_READY);
  CHECK(ready.slot == slot);
  Preamble go{
      sizeof(Preamble), tcp::Op::NOTIFY_RECV_READY, slot, 0, text.size(), 0};
  Send(fd, &go, sizeof(go));
  Preamble data{};
  REQUIRE(Recv(fd, &data, sizeof(data)));
  CHECK(data.opcode == tcp::Op::SEND_UNBOUND_BUFFER);
  std::string got(data.length, '\0');
  REQUIRE(Recv(fd, got.data(), got.size()));
  CHECK(got == text);
  buf->waitSend(std::chrono::seconds(5));
}

// The real peer connects, proves the secret, and the pair is its own: it
// carries data on `slot`. Returns the peer's socket.
int RealPeerTakesPair(Acceptor& a, uint64_t slot) {
  const int real = Connect(a.port);
  Handshake(real, a.port);
  REQUIRE(a.Connected(std::chrono::milliseconds(5000)));
  ExpectPairCarries(a, real, slot);
  return real;
}

}  // namespace

TEST_CASE(
    "hostile connections to a pair's listener are refused and the real peer "
    "gets the pair") {
  Acceptor a;
  // A burst of connections at once that say nothing: each is accepted at
  // once (with Gloo's backlog of 1, some waited for TCP to retry their SYN,
  // a second).
  const auto burst_start = std::chrono::steady_clock::now();
  std::vector<int> burst(12);
  {
    std::vector<std::thread> threads;
    for (int& fd : burst) {
      threads.emplace_back([&fd, &a] { fd = Connect(a.port); });
    }
    for (std::thread& t : threads) t.join();
  }
  CHECK(std::chrono::steady_clock::now() - burst_start <
        std::chrono::milliseconds(900));
  // Random bytes, another generation, other ranks, a wrong secret, and one
  // that says nothing at all, all before the real peer.
  const int noise = Connect(a.port);
  std::mt19937 rng(59);
  std::vector<char> junk(4096);
  for (char& c : junk) c = static_cast<char>(rng());
  Send(noise, junk.data(), junk.size());
  const int stale = Connect(a.port);
  const link::Hello old = MakeHello(a.port, kGeneration - 1);
  Send(stale, &old, sizeof(old));
  const int misrouted = Connect(a.port);
  const link::Hello other = MakeHello(a.port, kGeneration, 2, 0);
  // The right generation and ranks, for another listener (the pair of the
  // other communicator of the generation, say).
  const int redirected = Connect(a.port);
  const link::Hello elsewhere = MakeHello(a.port + 1);
  Send(redirected, &elsewhere, sizeof(elsewhere));
  Send(misrouted, &other, sizeof(other));
  const int silent = Connect(a.port);
  const int wrong = Connect(a.port);
  if (!Plain()) {
    const link::Hello h = MakeHello(a.port);
    Send(wrong, &h, sizeof(h));
    link::Challenge c{};
    REQUIRE(Recv(wrong, &c, sizeof(c)));
    // It cannot check the acceptor's MAC, and its own is wrong.
    CHECK_FALSE(holdfast::link_auth::Equal(
        c.mac, link::AcceptorMac("another secret", h, c.nonce).data()));
    const holdfast::link_auth::Mac mac =
        link::ConnectorMac("another secret", h, c.nonce);
    Send(wrong, mac.data(), mac.size());
  }
  for (int fd : {noise, stale, misrouted, redirected, wrong}) {
    CHECK(ClosedWithin(fd, std::chrono::milliseconds(2000)));
  }
  CHECK_FALSE(a.Connected(std::chrono::milliseconds(0)));

  const int real = RealPeerTakesPair(a, 42);
  // The silent one was closed once the pair had its peer.
  CHECK(ClosedWithin(silent, std::chrono::milliseconds(2000)));
  for (int fd : {noise, stale, misrouted, redirected, silent, wrong, real}) {
    close(fd);
  }
  for (int fd : burst) close(fd);
}

TEST_CASE("a replayed handshake is refused") {
  Recorded recorded;
  {
    Acceptor first;
    const int fd = Connect(first.port);
    recorded = Handshake(fd, first.port);
    REQUIRE(first.Connected(std::chrono::milliseconds(5000)));
    close(fd);
  }
  Acceptor a;
  // A whole handshake that succeeded, sent again to a new pair of the same
  // generation and ranks: its hello names the old listener's port.
  const int replay = Connect(a.port);
  Send(replay, &recorded.hello, sizeof(recorded.hello));
  Send(replay, &recorded.proof, sizeof(recorded.proof));
  CHECK(ClosedWithin(replay, std::chrono::milliseconds(2000)));
  // One to this very listener, cut before its proof was sent (a recorder
  // saw the hello and the proof): the proof answers an old challenge.
  link::Hello h = MakeHello(a.port);
  const int cut = Connect(a.port);
  Send(cut, &h, sizeof(h));
  link::Challenge old{};
  if (!Plain()) REQUIRE(Recv(cut, &old, sizeof(old)));
  const holdfast::link_auth::Mac proof =
      link::ConnectorMac(kSecret, h, old.nonce);
  close(cut);
  const int again = Connect(a.port);
  Send(again, &h, sizeof(h));
  Send(again, proof.data(), proof.size());
  CHECK(ClosedWithin(again, std::chrono::milliseconds(2000)));
  CHECK_FALSE(a.Connected(std::chrono::milliseconds(200)));
  const int real = RealPeerTakesPair(a, 43);
  close(replay);
  close(again);
  close(real);
}

TEST_CASE(
    "a frame a connected pair cannot parse fails the pair by name and the "
    "process lives") {
  // Data for a slot no receive asked for (Gloo enforces that by throwing
  // on its event loop's thread, which ended the process), a wrong length,
  // and 48 random bytes.
  const Preamble unasked{
      sizeof(Preamble) + 8, tcp::Op::SEND_UNBOUND_BUFFER, 9, 0, 8, 0};
  const Preamble too_long{
      sizeof(Preamble) + 64, tcp::Op::SEND_UNBOUND_BUFFER, 5, 0, 64, 0};
  Preamble random{};
  std::mt19937_64 rng(7);
  for (size_t* f : {&random.nbytes, &random.opcode, &random.slot,
                    &random.offset, &random.length, &random.roffset}) {
    *f = rng();
  }
  struct Case {
    const char* name;
    Preamble frame;
    const char* says;
  };
  for (const Case& k :
       {Case{"unasked", unasked, "data for slot 9, which it was not asked"},
        Case{"too long", too_long, "64 bytes for a receive of 8"},
        Case{"random", random, "not valid"}}) {
    SECTION(k.name) {
      Acceptor a;
      const int fd = Connect(a.port);
      Handshake(fd, a.port);
      REQUIRE(a.Connected(std::chrono::milliseconds(5000)));
      // A receive of 8 bytes on slot 5, which the peer hears of.
      char into[8] = {};
      auto buf = a.context->createUnboundBuffer(into, sizeof(into));
      buf->recv(1, 5);
      Preamble ready{};
      REQUIRE(Recv(fd, &ready, sizeof(ready)));
      CHECK(ready.opcode == tcp::Op::NOTIFY_RECV_READY);
      Send(fd, &k.frame, sizeof(k.frame));
      std::string error;
      try {
        buf->waitRecv(std::chrono::seconds(5));
      } catch (const std::exception& e) {
        error = e.what();
      }
      INFO(error);
      CHECK(error.find(k.says) != std::string::npos);
      CHECK(error.find("rank 1") != std::string::npos);
      close(fd);
    }
  }
}

TEST_CASE(
    "communicators of 3 ranks with the job's secret reduce, and a rank with "
    "another secret cannot join") {
  using holdfast::Communicator;
  using holdfast::CommunicatorOptions;
  auto run = [](const std::vector<std::string>& secrets,
                std::vector<absl::Status>* made) {
    auto store = holdfast::NewMemoryStore();
    const int n = static_cast<int>(secrets.size());
    std::vector<std::unique_ptr<Communicator>> comms(secrets.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        CommunicatorOptions o;
        o.rank = r;
        o.size = n;
        o.generation = kGeneration;
        o.link_secret = secrets[static_cast<size_t>(r)];
        o.connect_timeout = absl::Seconds(3);
        auto c = Communicator::Create(store, o);
        (*made)[static_cast<size_t>(r)] = c.status();
        if (c.ok()) comms[static_cast<size_t>(r)] = std::move(*c);
      });
    }
    for (auto& t : threads) t.join();
    return comms;
  };
  std::vector<absl::Status> made(3);
  auto comms = run({kSecret, kSecret, kSecret}, &made);
  for (const absl::Status& s : made) REQUIRE(s.ok());
  std::vector<std::thread> threads;
  std::vector<float> sums(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      float v = static_cast<float>(r + 1);
      const absl::Status s =
          comms[static_cast<size_t>(r)]
              ->AllReduce(&v, 1, holdfast::DataType::kFloat32,
                          holdfast::ReduceOp::kSum)
              ->Wait();
      CHECK(s.ok());
      sums[static_cast<size_t>(r)] = v;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(sums == std::vector<float>{6, 6, 6});

  // Rank 2 has another secret: no rank connects to it.
  std::vector<absl::Status> bad(3);
  run({kSecret, kSecret, "another secret"}, &bad);
  CHECK_FALSE(bad[2].ok());
  const std::string all = std::string(bad[0].message()) + " | " +
                          std::string(bad[1].message()) + " | " +
                          std::string(bad[2].message());
  INFO(all);
  CHECK(all.find("did not prove the job's secret") != std::string::npos);
}

TEST_CASE(
    "a connect whose peer's kernel answers but whose process does not "
    "fails in time and says it reached the peer") {
  using holdfast::backend::ConnectReachedPeer;
  auto device = Device();
  auto context = device->createContext(1, 2);
  context->setTimeout(std::chrono::milliseconds(200));  // connect: 5x that
  auto* pair = context->createPair(0).get();
  const auto own = tcp::Address(pair->address().bytes()).getSockaddr();
  const uint16_t own_port = reinterpret_cast<const sockaddr_in&>(own).sin_port;
  // A listener that never accepts (a stopped process), at an address that
  // sorts below this pair's, so that this pair connects (Gloo compares the
  // ports as stored, in network byte order).
  int silent = -1;
  sockaddr_in at{};
  for (int tries = 0; tries < 64 && silent < 0; ++tries) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(fd, 8) == 0);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    if (own_port - a.sin_port > 0) {
      silent = fd;
      at = a;
    } else {
      close(fd);
    }
  }
  REQUIRE(silent >= 0);
  const std::vector<char> peer =
      tcp::Address(reinterpret_cast<const sockaddr*>(&at), sizeof(at)).bytes();
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    pair->connect(peer);
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(error);
  CHECK_FALSE(error.empty());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
  if (!Plain()) CHECK(ConnectReachedPeer(pair));
  close(silent);
}
