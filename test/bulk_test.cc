// The backup links (src/checkpoint/bulk.h) on real loopback sockets: pieces
// and checksums arrive intact and hashed as the runtime expects, and every
// way a link can go wrong (a stray connection, a wrong token or generation,
// a peer that closes mid-piece, a mismatched header, an abort, a stalled
// peer) ends in an error that names it, never a hang.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "src/checkpoint/bulk.h"
#include "src/checkpoint/pieces.h"
#include "src/common/status_util.h"

namespace {

namespace bulk = holdfast::bulk;
namespace pieces = holdfast::pieces;

constexpr uint64_t kToken = 0x1234;

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
  REQUIRE(p.owner->ConnectTo(1, p.listener->address(), Soon()).ok());
  REQUIRE(p.buddy->AcceptFrom(*p.listener, {0}, Soon(), nullptr).ok());
  return p;
}

// A plain TCP connection to `address` ("127.0.0.1:port").
int RawConnect(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(
      static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
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
  bulk::Links wrong_token(7, 0, kToken + 1, absl::Seconds(10));
  bulk::Links old_generation(6, 0, kToken, absl::Seconds(10));
  bulk::Links unexpected(7, 2, kToken, absl::Seconds(10));
  bulk::Links owner(7, 0, kToken, absl::Seconds(10));
  REQUIRE(wrong_token.ConnectTo(1, (*l)->address(), Soon()).ok());
  REQUIRE(old_generation.ConnectTo(1, (*l)->address(), Soon()).ok());
  REQUIRE(unexpected.ConnectTo(1, (*l)->address(), Soon()).ok());
  REQUIRE(owner.ConnectTo(1, (*l)->address(), Soon()).ok());
  REQUIRE(buddy.AcceptFrom(**l, {0}, Soon(), nullptr).ok());
  close(garbage);
  // The accepted link is the owner's: a piece crosses it.
  std::vector<uint8_t> out(100, 9), in(100);
  std::thread sender(
      [&] { (void)owner.SendPiece(1, 1, out.data(), out.size(), nullptr); });
  CHECK(buddy.RecvPiece(0, 1, in.data(), in.size(), nullptr).ok());
  sender.join();
  CHECK(in == out);
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
