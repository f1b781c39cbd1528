// gRPC channel targets from the addresses users give.
#ifndef HOLDFAST_SRC_CONTROL_WIRE_TARGET_H_
#define HOLDFAST_SRC_CONTROL_WIRE_TARGET_H_

#include <algorithm>
#include <string>

#include "absl/time/time.h"

namespace holdfast::control {

// "HOST:PORT" stays as it is; a list "IP:PORT,IP:PORT" becomes gRPC's
// "ipv4:" (or, with brackets, "ipv6:") target, whose channel connects to
// the first address that accepts and moves on when it is lost: with
// controllers that listen only while they lead, the leader.
inline std::string ChannelTarget(const std::string& address) {
  if (address.find(',') == std::string::npos ||
      address.find("://") != std::string::npos ||
      address.rfind("ipv4:", 0) == 0 || address.rfind("ipv6:", 0) == 0) {
    return address;
  }
  return (address[0] == '[' ? "ipv6:" : "ipv4:") + address;
}

// Whether `address` names several servers (a list).
inline bool IsAddressList(const std::string& address) {
  return address.find(',') != std::string::npos;
}

// The longest reconnect back-off toward a list: its leader may fail over
// to another address, which is tried within this.
inline constexpr absl::Duration kListReconnectMax = absl::Milliseconds(300);

// The longest reconnect back-off toward `address`: `max`, or at most
// kListReconnectMax for a list.
inline absl::Duration ReconnectCap(const std::string& address,
                                   absl::Duration max) {
  return IsAddressList(address) ? std::min(max, kListReconnectMax) : max;
}

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_WIRE_TARGET_H_
