// The links backup pieces travel on: one TCP connection per (owner, buddy)
// pair of a generation, each carrying one direction only, written and read
// with plain blocking calls by a thread of its own.
//
// Gloo's transport moves every byte of a process through one event-loop
// thread and leaves the checksums to a second pass over memory. Here the
// owner hashes each chunk just before it writes it and the buddy hashes
// each chunk just after it lands, both while the chunk is in the cache, and
// the two directions of an exchange run on two threads.
//
// Wire format (little-endian hosts only, like the rest of the wire formats
// here). A connection opens with a handshake that proves both ends know the
// job's token and names the generation and both slots: the owner's Hello
// (magic, generation, its slot, the buddy's slot, a fresh nonce), the
// buddy's Challenge (its own fresh nonce and an HMAC-SHA256 under the token
// of both), and the owner's Proof (its HMAC of both). A replayed Hello and
// Proof fail against the buddy's new nonce; a link from another generation
// is refused by name; nothing of a link that fails the handshake reaches a
// restore. Then, per round, a PieceHeader, the piece's bytes, and the
// owner's 8-byte checksum of them. The pieces themselves are not
// encrypted or signed (docs/security.md).
//
// Failure model: a read or write that makes no progress for `io_timeout`
// fails with DeadlineExceeded; a peer that closes or resets its end fails
// the op with Unavailable naming it; Abort() shuts every socket down, which
// wakes a blocked call at once, and every later op fails with Aborted
// naming the reason. A failed link stays failed: the runtime rebuilds the
// links with the side communicator of the next generation.
#ifndef HOLDFAST_SRC_CHECKPOINT_BULK_H_
#define HOLDFAST_SRC_CHECKPOINT_BULK_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/checkpoint/pieces.h"

struct addrinfo;  // <netdb.h>

namespace holdfast::bulk {

// Bytes hashed (and written or read) per call: small enough that a chunk
// is still in the cache when it is hashed.
inline constexpr size_t kChunkBytes = size_t{256} << 10;

// A listening socket for the links of one generation.
class Listener {
 public:
  // Listens on an ephemeral port of `interface`'s IPv4 address when it is
  // set, else of `bind_address` (an address or a host name).
  static absl::StatusOr<std::unique_ptr<Listener>> Open(
      const std::string& bind_address, const std::string& interface);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // "host:port", for peers to connect to.
  const std::string& address() const { return address_; }
  int fd() const { return fd_; }

 private:
  Listener(int fd, std::string address)
      : fd_(fd), address_(std::move(address)) {}
  int fd_;
  std::string address_;
};

// Polled while links are made; a reason stops the wait with Aborted.
using Cancelled = std::function<std::optional<std::string>()>;

// What follows a piece's bytes on a backup link.
struct PieceTrailer {
  uint64_t checksum = 0;  // the owner's, of the bytes
  pieces::Ledger ledger{};
};
static_assert(sizeof(PieceTrailer) == 32, "the wire layout is fixed");

class Links {
 public:
  // The links of member `slot` in `generation`. `token` (the job's token,
  // the handshake's key) must be the same on both ends of a link.
  Links(int64_t generation, int slot, std::string token,
        absl::Duration io_timeout);
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  // Opens the link to buddy `peer`, listening at `address`: waits for the
  // buddy's challenge, so the buddy must be accepting (AcceptFrom on
  // another thread) for it to return before `deadline`.
  absl::Status ConnectTo(int peer, const std::string& address,
                         absl::Time deadline);
  // Accepts one link from each owner in `peers` on `listener`. Strays (a
  // wrong token or generation, an unexpected or repeated slot, garbage) are
  // logged and closed, and the wait goes on until `deadline`.
  absl::Status AcceptFrom(const Listener& listener,
                          const std::vector<int>& peers, absl::Time deadline,
                          const Cancelled& cancelled);

  // Sends the `size` bytes of this member's piece of `step` to `peer`,
  // hashing each chunk into `hasher` (if not null) just before writing it.
  absl::Status SendPiece(int peer, int64_t step, const uint8_t* data,
                         size_t size, pieces::CopyHasher* hasher);
  // Sends what follows a piece's bytes: its checksum and metadata.
  absl::Status SendTrailer(int peer, const PieceTrailer& trailer);

  // Receives `peer`'s piece of `step` into `data`; its header must name
  // that step and `size`. `landed(offset, n)` runs after each chunk lands.
  absl::Status RecvPiece(int peer, int64_t step, uint8_t* data, size_t size,
                         const std::function<void(size_t, size_t)>& landed);
  absl::StatusOr<PieceTrailer> RecvTrailer(int peer);

  // Shuts every link down; ops in progress and later ones fail with
  // Aborted naming `reason`. Idempotent; the first reason stays.
  void Abort(absl::string_view reason);

 private:
  // One connect to buddy `peer` at `address` (resolved: `to`) and the
  // owner's side of the handshake; *dropped says the buddy closed or reset
  // the connection before the handshake ended (worth another try).
  absl::Status Dial(int peer, const std::string& address, const addrinfo& to,
                    absl::Time deadline, bool* dropped);
  // The owner's side of the handshake on `fd`, connected to buddy `peer`.
  absl::Status Handshake(int fd, int peer);
  // The buddy's side on accepted `fd`: "" once an owner in `want` proved
  // the token (its slot in *from), else why it is refused.
  std::string Admit(int fd, const std::set<int>& want, int* from);
  // AcceptFrom's handshakes in progress (bulk.cc).
  struct Admissions;
  // AcceptFrom's loop: accepts until every owner in `want` has a link (each
  // is erased as it comes), the deadline, Abort() or `cancelled`.
  absl::Status AcceptLoop(const Listener& listener, std::set<int>* want,
                          absl::Time deadline, const Cancelled& cancelled,
                          Admissions& a);
  // Starts the handshake of accepted `fd` on a thread of its own, bounded
  // by kHelloTimeout. With kMaxAdmissions in progress the oldest is shut
  // down to make room (connections that say nothing hold no owner out),
  // unless every one of them is being shut down already: then `fd` is
  // refused.
  void StartAdmission(Admissions& a, int fd, const std::set<int>& want,
                      absl::Duration left);
  // Takes the handshakes that ended: an owner in `want` that proved the
  // token becomes a link (and leaves `want`); the others are logged and
  // closed.
  absl::Status TakeAdmissions(Admissions& a, std::set<int>* want);
  // Shuts down the handshakes still in progress, joins their threads and
  // closes what they admitted that was not taken.
  void EndAdmissions(Admissions& a);
  // The socket of the link to (out) or from (in) `peer`, or an error.
  absl::StatusOr<int> Fd(int peer, bool out);
  // Moves all `size` bytes; an error counts them as bytes `at`.. of a
  // message of `total` (0: of `size`).
  absl::Status Write(int fd, int peer, const void* data, size_t size,
                     size_t at = 0, size_t total = 0);
  absl::Status Read(int fd, int peer, void* data, size_t size, size_t at = 0,
                    size_t total = 0);
  // An I/O error (errno `err`, or 0 for the peer's end of stream) as a
  // status naming `peer`; Aborted once Abort() ran.
  absl::Status IoError(int peer, const char* what, int err, size_t done,
                       size_t total);

  const int64_t generation_;
  const int slot_;
  const std::string token_;
  const absl::Duration io_timeout_;

  absl::Mutex mu_;
  std::map<int, int> out_ ABSL_GUARDED_BY(mu_);  // buddy slot -> socket
  std::map<int, int> in_ ABSL_GUARDED_BY(mu_);   // owner slot -> socket
  // ConnectTo's and AcceptFrom's sockets in their handshake.
  std::set<int> handshaking_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace holdfast::bulk

#endif  // HOLDFAST_SRC_CHECKPOINT_BULK_H_
