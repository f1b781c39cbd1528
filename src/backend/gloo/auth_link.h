// Gloo's TCP transport with holdfast's link handshake: every pair starts with
// a handshake that proves knowledge of the job's secret and names the
// generation and both ranks, and a frame the pair cannot parse fails the
// pair instead of ending the process.
//
// The handshake (the connecting side of a pair is Gloo's: the one whose
// address sorts higher):
//   1. the connecting rank sends a Hello: the generation, its rank, the
//      accepting rank, the port it connects to and a fresh nonce;
//   2. the accepting rank refuses a hello of another generation, for
//      other ranks or for another port; else it answers with a Challenge: its
//      own fresh nonce and an HMAC-SHA256 of the hello and that nonce under the
//      secret;
//   3. the connecting rank checks that MAC (a peer that cannot prove the
//      secret fails the connect) and answers with a Proof, its own MAC;
//   4. the accepting rank checks the proof; a wrong one (a wrong secret, or
//      a replayed handshake, which meets a new nonce) closes the connection
//      before any byte of it reaches Gloo.
// The accepting side takes every connection to the pair's listener as a
// candidate, on Gloo's event loop without blocking it: a connection that
// fails, or sends nothing, holds only itself. The first candidate to finish
// the handshake becomes the pair; the others are closed.
//
// Only gloo_backend.cc and the tests include this.
#ifndef HOLDFAST_SRC_BACKEND_GLOO_AUTH_LINK_H_
#define HOLDFAST_SRC_BACKEND_GLOO_AUTH_LINK_H_

#include <cstdint>
#include <memory>
#include <string>

#include <gloo/transport/device.h>
#include <gloo/transport/tcp/attr.h>

#include "src/common/link_auth.h"

namespace holdfast::backend {

// What a pair's handshake proves and names. An empty secret still names
// the generation and the ranks, but proves nothing: anyone can compute it.
struct LinkIdentity {
  int64_t generation = 0;
  std::string secret;
};

// A Gloo TCP device (Gloo's CreateDevice on `attr`) whose contexts' pairs
// run the handshake above. Throws as tcp::CreateDevice does.
std::shared_ptr<::gloo::transport::Device> CreateAuthDevice(
    const ::gloo::transport::tcp::attr& attr, LinkIdentity identity);

// Whether `pair` (of a CreateAuthDevice device), as the connecting side,
// reached its peer: the TCP connect completed, so the peer's kernel
// answered, even if the process did not (stopped). False for other pairs.
bool ConnectReachedPeer(::gloo::transport::Pair* pair);

// The wire format, for the handshake's tests.
namespace gloo_link {

constexpr char kMagic[8] = {'H', 'F', 'G', 'L', 'O', 'O', '0', '1'};

struct Hello {
  char magic[8];
  int64_t generation;
  int32_t from_rank;  // the connecting rank
  int32_t to_rank;    // the accepting rank
  // The port of the listener it connects to: a hello redirected to another
  // listener of the same ranks (the other communicator of the generation)
  // is refused.
  uint32_t to_port;
  uint32_t reserved;  // 0
  uint8_t nonce[link_auth::kNonce];
};
static_assert(sizeof(Hello) == 48, "the hello layout is fixed");

struct Challenge {
  uint8_t nonce[link_auth::kNonce];
  uint8_t mac[link_auth::kMac];  // AcceptorMac
};
static_assert(sizeof(Challenge) == 48, "the challenge layout is fixed");

struct Proof {
  uint8_t mac[link_auth::kMac];  // ConnectorMac
};

link_auth::Mac AcceptorMac(const std::string& secret, const Hello& hello,
                           const uint8_t* nonce);
link_auth::Mac ConnectorMac(const std::string& secret, const Hello& hello,
                            const uint8_t* nonce);

}  // namespace gloo_link
}  // namespace holdfast::backend

#endif  // HOLDFAST_SRC_BACKEND_GLOO_AUTH_LINK_H_
