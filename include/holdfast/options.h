// Options for communicators and single operations.
// Default values come from the built-in defaults, overridden by HOLDFAST_*
// environment variables (see docs/configuration.md); a field set in code wins
// over both. Plain structs: copy them freely; not shared between threads.
#ifndef HOLDFAST_OPTIONS_H_
#define HOLDFAST_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace holdfast {

class Clock;

// Defaults after environment overrides. Each reads its variable once.
namespace defaults {
absl::Duration OpTimeout();         // HOLDFAST_TIMEOUT_MS (60000)
absl::Duration ConnectTimeout();    // HOLDFAST_CONNECT_TIMEOUT_MS (60000)
absl::Duration WatchdogInterval();  // HOLDFAST_WATCHDOG_INTERVAL_MS (10)
size_t TraceCapacity();             // HOLDFAST_TRACE_CAPACITY (4096)
std::string TraceDir();             // HOLDFAST_TRACE_DIR ("": no file dump)
std::string BindAddress();          // HOLDFAST_BIND_ADDR ("127.0.0.1")
std::string Interface();            // HOLDFAST_IFACE ("": use BindAddress)
std::string Backend();              // HOLDFAST_BACKEND ("gloo")
int Device();                       // HOLDFAST_DEVICE, else LOCAL_RANK, else 0
}  // namespace defaults

struct CommunicatorOptions {
  // This process's rank in [0, size) and the group size (>= 1).
  int rank = -1;
  int size = 0;
  // The membership generation this communicator belongs to. Rendezvous keys,
  // trace records and abort notices carry it.
  int64_t generation = 0;

  // Deadline of an operation that sets none itself, counted from the moment
  // it is issued.
  absl::Duration timeout = defaults::OpTimeout();
  // Deadline for all ranks to meet and connect in Create().
  absl::Duration connect_timeout = defaults::ConnectTimeout();
  // How often the watchdog looks at in-flight deadlines.
  absl::Duration watchdog_interval = defaults::WatchdogInterval();

  // Where the transport listens: an address or host name, or a network
  // interface name (which wins when set).
  std::string bind_address = defaults::BindAddress();
  std::string interface = defaults::Interface();

  // The transport: "gloo" (TCP, host memory) or "nccl" (CUDA device memory;
  // only in builds with the NCCL backend, see docs/gpu.md), and the CUDA
  // device NCCL runs on.
  std::string backend = defaults::Backend();
  int device = defaults::Device();

  // The job's secret. Every Gloo pair starts with a handshake that proves
  // it and names the generation and both ranks (an HMAC-SHA256 over fresh
  // nonces): a connection that cannot is closed before Gloo reads a byte of
  // it. The runtime sets it to the job's token. Empty: the handshake still
  // names the generation and ranks, but proves nothing.
  std::string link_secret;

  // Entries in the per-rank trace ring, and the directory the ring is
  // written to as JSON when the communicator aborts (created if missing;
  // "" writes no file).
  size_t trace_capacity = defaults::TraceCapacity();
  std::string trace_dir = defaults::TraceDir();

  // Polled (every 50 to 100 ms) while Create() waits for and connects to
  // its peers. When it returns a reason, Create() stops with Aborted naming
  // it, instead of waiting out connect_timeout for peers that will not come
  // (the runtime cancels a generation's rendezvous when a newer one opens).
  // Null: never cancelled.
  std::function<std::optional<std::string>()> rendezvous_cancelled;

  // Clock for deadlines and trace timestamps; null means the real clock.
  // Not owned; must outlive the communicator.
  Clock* clock = nullptr;
};

struct OpOptions {
  // Deadline of this operation; zero or negative means the communicator's
  // default.
  absl::Duration timeout = absl::ZeroDuration();
  // Send/Recv only: a user tag; a Send matches the Recv with the same tag,
  // count and dtype.
  uint32_t tag = 0;

  // Ordering on the device, for a backend on CUDA (NCCL); a host backend
  // (Gloo) ignores `after_event` and calls `on_queued` with null.
  //
  // `after_event`: a cudaEvent_t (as void*) that the caller recorded on
  // its own stream; the op starts on the device only after it (the
  // communicator's stream waits on it). It must stay valid until
  // `on_queued` has been called. Null: no ordering beyond issue order.
  void* after_event = nullptr;
  // Called exactly once per op, on some thread of the communicator (or
  // the caller's, for an op refused at once), and always before its Work
  // finishes: with the cudaStream_t (as void*) the op was queued on, as
  // soon as it is there and before it completes on the device, or with
  // null when it was never queued (refused, aborted, a host backend). A
  // caller orders its own stream after the op by recording an event on
  // that stream inside the call. It must not block or call into the
  // communicator.
  std::function<void(void* stream)> on_queued;
};

}  // namespace holdfast

#endif  // HOLDFAST_OPTIONS_H_
