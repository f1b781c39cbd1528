// What the Gloo backend needs of Gloo's TCP transport beyond its public
// API, in one place (only gloo_backend.cc includes it).
#ifndef HOLDFAST_SRC_BACKEND_GLOO_GLOO_ACCESS_H_
#define HOLDFAST_SRC_BACKEND_GLOO_GLOO_ACCESS_H_

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <tuple>

#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/tcp/unbound_buffer.h>

#include "absl/time/time.h"

namespace holdfast::backend {
namespace tcp = ::gloo::transport::tcp;

// A deadline as Gloo's timeouts take it (at least 1 ms).
inline std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Some tcp::Pair and tcp::UnboundBuffer members that holdfast needs are
// protected in this Gloo version. A derived class may name them as pointers
// to members of the base, which can then be applied to any object of it.
// These structs are never instantiated.
struct UnboundBufferAccess : tcp::UnboundBuffer {
  static void Signal(tcp::UnboundBuffer* buf, std::exception_ptr ex) {
    (buf->*(&UnboundBufferAccess::signalException))(std::move(ex));
  }
  // Whether a receive posted on `buf` has completed, without waiting.
  static bool Received(tcp::UnboundBuffer* buf) {
    std::lock_guard<std::mutex> lock(buf->*(&UnboundBufferAccess::m_));
    return buf->*(&UnboundBufferAccess::recvCompletions_) > 0;
  }
};

struct PairAccess : tcp::Pair {
  // Makes the pair's socket fail once data it sent has stayed
  // unacknowledged for `timeout` (TCP_USER_TIMEOUT), so an op whose peer
  // was cut off on the data network fails within that, naming the peer,
  // instead of after TCP's retransmissions (minutes). 0 on success, else
  // errno.
  static int SetUserTimeout(tcp::Pair* pair, absl::Duration timeout) {
    const unsigned int ms =
        static_cast<unsigned int>(absl::ToInt64Milliseconds(timeout));
    const int fd = pair->*(&PairAccess::fd_);
    return setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms)) == 0
               ? 0
               : errno;
  }
  // The segments retransmitted on the pair's socket (TCP_INFO's
  // tcpi_total_retrans), or -1.
  static int64_t Retransmits(tcp::Pair* pair) {
    const int fd = pair->*(&PairAccess::fd_);
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) {
      return -1;
    }
    return info.tcpi_total_retrans;
  }
  static void Fail(tcp::Pair* pair, const std::string& msg) {
    (pair->*(&PairAccess::signalExceptionExternal))(msg);
  }
  static std::string PeerAddress(const tcp::Pair* pair) {
    return (pair->*(&PairAccess::peer))().str();
  }
  // If the pair has failed, wakes every unbound-buffer op still bound to
  // it with the pair's error and returns it; returns null otherwise.
  //
  // Why: when a pair fails, this Gloo version does not signal every
  // unbound-buffer op: not sends already queued in tx_ (a message larger
  // than the socket buffer), nor a receive in progress (rx_), nor ops
  // waiting for the peer's notification (localPendingSend_/Recv_). A thread
  // in waitSend or waitRecv on one would sleep until Gloo's own timeout,
  // even after abort. Signalling a buffer twice is harmless. Lock order is
  // Gloo's own: pair, then buffer.
  static std::exception_ptr WakeStranded(tcp::Pair* pair) {
    std::lock_guard<std::mutex> lock(pair->*(&PairAccess::m_));
    std::exception_ptr ex = pair->*(&PairAccess::ex_);
    if (ex == nullptr) return nullptr;
    auto wake = [&ex](auto& weak) {
      ::gloo::NonOwningPtr<tcp::UnboundBuffer> buf(weak);
      if (buf) UnboundBufferAccess::Signal(buf.operator->(), ex);
    };
    for (tcp::Op& op : pair->*(&PairAccess::tx_)) wake(op.ubuf);
    wake((pair->*(&PairAccess::rx_)).ubuf);
    for (auto& [slot, ops] : pair->*(&PairAccess::localPendingSend_)) {
      for (auto& op : ops) wake(std::get<0>(op));
    }
    for (auto& [slot, ops] : pair->*(&PairAccess::localPendingRecv_)) {
      for (auto& op : ops) wake(std::get<0>(op));
    }
    return ex;
  }
};

}  // namespace holdfast::backend

#endif  // HOLDFAST_SRC_BACKEND_GLOO_GLOO_ACCESS_H_
