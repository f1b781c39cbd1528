// The backup links (src/checkpoint/bulk.h) on real loopback sockets: pieces
// and checksums arrive intact and hashed as the runtime expects, and every
// way a link can go wrong (a stray connection, a wrong token or generation,
// a replayed handshake, a peer that closes mid-piece, a mismatched header,
// an abort, a stalled peer) ends in an error that names it, never a hang.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "spdlog/sinks/ostream_sink.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/pieces.h"
#include "src/common/logging.h"
#include "src/common/status_util.h"
#include "test/support/log_capture.h"

namespace {

namespace bulk = holdfast::bulk;
namespace pieces = holdfast::pieces;

const std::string kToken = "the job's token";

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// Slot 0's link to slot 1 and slot 1's link from slot 0, connected.
struct Pair {
  std::unique_ptr<bulk::Listener> listener;
  std::unique_ptr<bulk::Links> owner;  // slot 0
  std::unique_ptr<bulk::Links> buddy;  // slot 1
};

Pair Connect(absl::Duration io_timeout = absl::Seconds(10)) {
  Pair p;
  auto l = bulk::Listener::Open("127.0.0.1", "");
  REQUIRE(l.ok());
  p.listener = std::move(*l);
  p.owner = std::make_unique<bulk::Links>(7, 0, kToken, io_timeout);
  p.buddy = std::make_unique<bulk::Links>(7, 1, kToken, io_timeout);
  absl::Status accepted;
  std::thread acceptor([&] {
    accepted = p.buddy->AcceptFrom(*p.listener, {0}, Soon(), nullptr);
  });
  const absl::Status connected =
      p.owner->ConnectTo(1, p.listener->address(), Soon());
  acceptor.join();
  REQUIRE(connected.ok());
  REQUIRE(accepted.ok());
  return p;
}

// A plain TCP connection to `address` ("127.0.0.1:port"), or -1.
int TryConnect(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(
      static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int RawConnect(const std::string& address) {
  const int fd = TryConnect(address);
  REQUIRE(fd >= 0);
  return fd;
}

// A piece of 100 bytes crosses the link from `owner` (slot 0) to `buddy`
// (slot 1).
void PieceCrosses(bulk::Links& owner, bulk::Links& buddy) {
  std::vector<uint8_t> out(100, 9), in(100);
  std::thread sender(
      [&] { (void)owner.SendPiece(1, 1, out.data(), out.size(), nullptr); });
  CHECK(buddy.RecvPiece(0, 1, in.data(), in.size(), nullptr).ok());
  sender.join();
  CHECK(in == out);
}

}  // namespace

TEST_CASE(
    "a piece, its checksum and its ledger cross a link intact and hashed") {
  Pair p = Connect();
  // Not a multiple of the chunk size, so the last chunk is short.
  const size_t size = 3 * bulk::kChunkBytes + 12345;
  std::vector<uint8_t> out(size), in(size, 0);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(i * 131);
  pieces::CopyHasher sent_hash, got_hash;
  size_t landed = 0;
  absl::Status send;
  std::thread sender([&] {
    send = p.owner->SendPiece(1, 42, out.data(), size, &sent_hash);
    if (send.ok()) {
      send = p.owner->SendTrailer(1, {sent_hash.Digest(), {7, 8, 9}});
    }
  });
  absl::Status recv =
      p.buddy->RecvPiece(0, 42, in.data(), size, [&](size_t off, size_t n) {
        CHECK(off == landed);
        got_hash.Update(in.data() + off, n);
        landed += n;
      });
  absl::StatusOr<bulk::PieceTrailer> trailer = p.buddy->RecvTrailer(0);
  sender.join();
  REQUIRE(send.ok());
  REQUIRE(recv.ok());
  REQUIRE(trailer.ok());
  CHECK(landed == size);
  CHECK(in == out);
  CHECK(trailer->checksum == pieces::Checksum(out.data(), size));
  CHECK(got_hash.Digest() == trailer->checksum);
  CHECK(trailer->ledger == pieces::Ledger{7, 8, 9});
}

TEST_CASE("a receiver refuses a piece of another step or size") {
  Pair p = Connect();
  std::vector<uint8_t> out(1000, 1), in(1000);
  std::thread sender(
      [&] { (void)p.owner->SendPiece(1, 5, out.data(), out.size(), nullptr); });
  absl::Status s = p.buddy->RecvPiece(0, 6, in.data(), in.size(), nullptr);
  sender.join();
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("sent its piece of step 5 (1000 bytes) where its "
                             "piece of step 6 (1000 bytes) was expected"));
}

TEST_CASE("an owner killed mid-piece is named by the receiver") {
  auto l = bulk::Listener::Open("127.0.0.1", "");
  REQUIRE(l.ok());
  const size_t size = size_t{64} << 20;  // more than the sockets buffer
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    bulk::Links owner(7, 0, kToken, absl::Seconds(30));
    std::vector<uint8_t> out(size, 1);
    if (owner.ConnectTo(1, (*l)->address(), Soon()).ok()) {
      (void)owner.SendPiece(1, 3, out.data(), size, nullptr);
    }
    _exit(0);
  }
  bulk::Links buddy(7, 1, kToken, absl::Seconds(30));
  REQUIRE(buddy.AcceptFrom(**l, {0}, Soon(), nullptr).ok());
  // The owner blocks once the socket buffers are full; kill it there.
  absl::SleepFor(absl::Milliseconds(300));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  std::vector<uint8_t> in(size);
  absl::Status s = buddy.RecvPiece(0, 3, in.data(), size, nullptr);
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("slot 0 closed its backup link (received"));
}

TEST_CASE("abort wakes a receiver blocked on a silent peer") {
  Pair p = Connect();
  std::vector<uint8_t> in(1 << 20);
  absl::Status s;
  std::thread receiver(
      [&] { s = p.buddy->RecvPiece(0, 1, in.data(), in.size(), nullptr); });
  absl::SleepFor(absl::Milliseconds(100));
  p.buddy->Abort("generation 8 opened");
  receiver.join();
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(s.message()), Catch::Contains("generation 8 opened"));
  // Every later op fails the same way.
  CHECK(p.buddy->RecvTrailer(0).status().code() == absl::StatusCode::kAborted);
}

TEST_CASE("a peer that stalls fails the op after the io timeout") {
  Pair p = Connect(absl::Milliseconds(200));
  std::vector<uint8_t> in(1 << 20);
  absl::Status s = p.buddy->RecvPiece(0, 1, in.data(), in.size(), nullptr);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("the backup link with slot 0 made no progress"));
}

TEST_CASE("strays are refused and the expected owner still gets through") {
  auto l = bulk::Listener::Open("127.0.0.1", "");
  REQUIRE(l.ok());
  bulk::Links buddy(7, 1, kToken, absl::Seconds(10));
  // Garbage, a wrong token, another generation, and an unexpected slot
  // come first; then the real owner, slot 0.
  const int garbage = RawConnect((*l)->address());
  const char junk[40] = "GET / HTTP/1.0\r\n\r\n";
  REQUIRE(write(garbage, junk, sizeof(junk)) == sizeof(junk));
  absl::Status accepted;
  std::thread acceptor(
      [&] { accepted = buddy.AcceptFrom(**l, {0}, Soon(), nullptr); });
  bulk::Links wrong_token(7, 0, kToken + "!", absl::Seconds(10));
  bulk::Links old_generation(6, 0, kToken, absl::Seconds(10));
  bulk::Links unexpected(7, 2, kToken, absl::Seconds(10));
  bulk::Links owner(7, 0, kToken, absl::Seconds(10));
  // Each is told so: the buddy's proof fails under a wrong token, and the
  // others are closed at their hello.
  absl::Status s = wrong_token.ConnectTo(1, (*l)->address(), Soon());
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("did not prove the job's token"));
  s = old_generation.ConnectTo(1, (*l)->address(), Soon());
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("slot 1 closed its backup link"));
  CHECK_FALSE(unexpected.ConnectTo(1, (*l)->address(), Soon()).ok());
  REQUIRE(owner.ConnectTo(1, (*l)->address(), Soon()).ok());
  acceptor.join();
  REQUIRE(accepted.ok());
  close(garbage);
  // The accepted link is the owner's: a piece crosses it.
  PieceCrosses(owner, buddy);
}

namespace {

// `silent` connections that send nothing reach the buddy's listener, then
// the owner: it gets its link within 0.5 s, and a piece crosses it.
void ExpectOwnerAfterSilent(int silent) {
  auto l = bulk::Listener::Open("127.0.0.1", "");
  REQUIRE(l.ok());
  bulk::Links buddy(7, 1, kToken, absl::Seconds(10));
  absl::Status accepted;
  std::thread acceptor(
      [&] { accepted = buddy.AcceptFrom(**l, {0}, Soon(), nullptr); });
  std::vector<int> fds;
  for (int i = 0; i < silent; ++i) fds.push_back(RawConnect((*l)->address()));
  absl::SleepFor(absl::Milliseconds(100));  // accepted first
  bulk::Links owner(7, 0, kToken, absl::Seconds(10));
  const absl::Time t0 = absl::Now();
  const absl::Status s = owner.ConnectTo(1, (*l)->address(), Soon());
  const absl::Duration took = absl::Now() - t0;
  INFO(s.ToString());
  CHECK(s.ok());
  acceptor.join();  // by its deadline if the owner was refused
  for (int fd : fds) close(fd);
  REQUIRE(s.ok());
  REQUIRE(accepted.ok());
  CHECK(took < absl::Milliseconds(500));
  PieceCrosses(owner, buddy);
}

}  // namespace

TEST_CASE("a silent connection does not hold the owner behind it") {
  // Each accepted connection has its handshake on a thread of its own; one
  // at a time, a connection that sent nothing held the owner that came
  // next for the hello's timeout (2 s).
  ExpectOwnerAfterSilent(1);
}

TEST_CASE(
    "silent connections that fill the handshakes in progress do not keep "
    "the owner out") {
  // More silent connections than the handshakes that may be in progress
  // at once (16): the newest were refused, and so was the owner after
  // them (a hostile client held a generation's backup links for the
  // hello's timeout, 2 s). Now the oldest makes room.
  ExpectOwnerAfterSilent(20);
}

TEST_CASE("an owner whose handshake the buddy dropped connects again") {
  // A buddy with its handshakes in progress full drops the oldest for a
  // newcomer (the case above), which may be the owner: here its first
  // connection is accepted and closed before the buddy starts AcceptFrom.
  // The owner gave up ("slot 1 closed its backup link (received 0 of 48
  // bytes)"), and its generation's backup links with it.
  auto l = bulk::Listener::Open("127.0.0.1", "");
  REQUIRE(l.ok());
  bulk::Links buddy(7, 1, kToken, absl::Seconds(10));
  bulk::Links owner(7, 0, kToken, absl::Seconds(10));
  absl::Status accepted;
  std::thread acceptor([&] {
    const int first = accept((*l)->fd(), nullptr, nullptr);
    if (first >= 0) close(first);
    accepted = buddy.AcceptFrom(**l, {0}, Soon(), nullptr);
  });
  holdfast::test::LogCapture log;
  const absl::Status connected = owner.ConnectTo(1, (*l)->address(), Soon());
  acceptor.join();
  INFO(connected.ToString());
  REQUIRE(connected.ok());
  REQUIRE(accepted.ok());
  CHECK(log.text().find("slot 1 closed our backup link's handshake") !=
        std::string::npos);
  PieceCrosses(owner, buddy);
}

TEST_CASE("an owner does not connect again to a buddy that is gone") {
  // A refused connect names the buddy at once: only a handshake the buddy
  // dropped is tried again.
  std::string address;
  {
    auto l = bulk::Listener::Open("127.0.0.1", "");
    REQUIRE(l.ok());
    address = (*l)->address();
  }
  bulk::Links owner(7, 0, kToken, absl::Seconds(10));
  holdfast::test::LogCapture log;
  const absl::Status s = owner.ConnectTo(1, address, Soon());
  CHECK(absl::IsUnavailable(s));
  CHECK(s.message().find("cannot connect to slot 1 at " + address) !=
        absl::string_view::npos);
  CHECK(log.text().find("connecting again") == std::string::npos);
}

namespace {

// Relays one connection accepted on `front` to `back` ("127.0.0.1:port")
// until either end closes, keeping what the client sent. (Runs on a thread
// of its own: no Catch assertions.)
std::string Relay(bulk::Listener& front, const std::string& back) {
  const int a = accept(front.fd(), nullptr, nullptr);
  const int b = a < 0 ? -1 : TryConnect(back);
  std::string sent;
  char buf[4096];
  for (bool open = a >= 0 && b >= 0; open;) {
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    if (poll(p, 2, 5000) <= 0) break;
    for (int i = 0; i < 2 && open; ++i) {
      if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = read(p[i].fd, buf, sizeof(buf));
      open = n > 0 && write(i == 0 ? b : a, buf, static_cast<size_t>(n)) == n;
      if (open && i == 0) sent.append(buf, static_cast<size_t>(n));
    }
  }
  if (a >= 0) close(a);
  if (b >= 0) close(b);
  return sent;
}

}  // namespace

TEST_CASE(
    "a handshake recorded on the wire and replayed does not open a link") {
  // A real handshake through a relay that records the owner's bytes.
  auto l = bulk::Listener::Open("127.0.0.1", "");
  auto front = bulk::Listener::Open("127.0.0.1", "");
  REQUIRE(l.ok());
  REQUIRE(front.ok());
  bulk::Links buddy(7, 1, kToken, absl::Seconds(10));
  bulk::Links owner(7, 0, kToken, absl::Seconds(10));
  std::string recorded;
  std::thread relay([&] { recorded = Relay(**front, (*l)->address()); });
  absl::Status accepted;
  std::thread acceptor(
      [&] { accepted = buddy.AcceptFrom(**l, {0}, Soon(), nullptr); });
  REQUIRE(owner.ConnectTo(1, (*front)->address(), Soon()).ok());
  acceptor.join();
  REQUIRE(accepted.ok());
  owner.Abort("done");
  buddy.Abort("done");
  relay.join();
  // Hello (48 bytes) and proof (32), and nothing else.
  REQUIRE(recorded.size() == 80);
  // The same bytes, replayed to a buddy of the same generation and slots,
  // meet a new challenge: the link is refused and the wait goes on.
  bulk::Links again(7, 1, kToken, absl::Seconds(10));
  // (Catch's assertions stay on this thread.)
  const int fd = RawConnect((*l)->address());
  const timeval three_s{3, 0};  // a link wrongly opened leaves read waiting
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &three_s, sizeof(three_s));
  size_t got = 0;
  ssize_t after = -1;
  std::thread replay([&] {
    char challenge[48];
    if (write(fd, recorded.data(), 48) != 48) return;
    while (got < sizeof(challenge)) {
      const ssize_t n = read(fd, challenge + got, sizeof(challenge) - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (write(fd, recorded.data() + 48, 32) != 32) return;
    char byte;
    after = read(fd, &byte, 1);
  });
  const absl::Status s =
      again.AcceptFrom(**l, {0}, absl::Now() + absl::Seconds(1), nullptr);
  replay.join();
  close(fd);
  CHECK(got == 48);   // a challenge came
  CHECK(after == 0);  // and the link was closed after the replayed proof
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(s.message()), Catch::Contains("no link from slot 0"));
}

TEST_CASE("an owner that never connects is named when the wait ends") {
  auto l = bulk::Listener::Open("127.0.0.1", "");
  REQUIRE(l.ok());
  bulk::Links buddy(7, 1, kToken, absl::Seconds(10));
  absl::Status s = buddy.AcceptFrom(
      **l, {0, 2}, absl::Now() + absl::Milliseconds(300), nullptr);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("no link from slots 0, 2"));
  CHECK(holdfast::GetAbsent(s) == 0);
  // A cancelled wait stops at once with the reason.
  s = buddy.AcceptFrom(**l, {0}, Soon(),
                       [] { return std::optional<std::string>("left"); });
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(s.message()), Catch::Contains("left"));
}

TEST_CASE("bad listen addresses and interfaces are named") {
  auto a = bulk::Listener::Open("no-such-host.invalid", "");
  CHECK_FALSE(a.ok());
  CHECK_THAT(std::string(a.status().message()),
             Catch::Contains("no-such-host.invalid"));
  auto b = bulk::Listener::Open("127.0.0.1", "no-such-if0");
  CHECK_FALSE(b.ok());
  CHECK_THAT(std::string(b.status().message()),
             Catch::Contains("network interface 'no-such-if0'"));
  bulk::Links owner(7, 0, kToken, absl::Seconds(1));
  absl::Status s = owner.ConnectTo(1, "nonsense", Soon());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("slot 1 published a bad address 'nonsense'"));
}
