// holdfast._C: the pybind11 binding of the runtime and its communicator.
//
// It knows nothing of torch: buffers cross as (address, element count,
// dtype code), and the `holdfast` package (python/holdfast/) turns torch
// tensors into those. So the module builds without libtorch and works with
// any torch version.
//
// Errors: a failed status raises the class of holdfast.errors that matches
// its code (PeerLostError for Unavailable, TimeoutError for
// DeadlineExceeded, ...). A holdfast error raised inside a step function
// goes back to the runtime as its status, so Run recovers from it; any
// other exception ends Run and is raised again from run().
//
// GIL: every call that can block (joining, communicator builds, collectives,
// the step loop) releases it; the step function and the metrics callback
// take it back.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "holdfast/communicator.h"
#ifdef HOLDFAST_PYTHON_NCCL
#include "holdfast/nccl.h"
#endif
#include "holdfast/runtime.h"
#include "holdfast/status.h"
#include "holdfast/types.h"
#include "src/runtime/fault_points.h"

namespace py = pybind11;

namespace holdfast {
namespace {

// Raises the holdfast.errors class for `status` (which is not OK).
[[noreturn]] void Raise(const absl::Status& status) {
  py::object errors = py::module_::import("holdfast.errors");
  py::object cls =
      errors.attr("error_for_code")(static_cast<int>(status.code()));
  PyErr_SetObject(cls.ptr(), py::str(status.ToString()).ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

DataType ToDataType(int code) {
  if (code < 0 || code >= kNumDataTypes) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "unknown dtype code ", code, " (0..", kNumDataTypes - 1, ")")));
  }
  return static_cast<DataType>(code);
}

ReduceOp ToReduceOp(int code) {
  if (code < 0 || code >= kNumReduceOps) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "unknown reduce op code ", code, " (0..", kNumReduceOps - 1, ")")));
  }
  return static_cast<ReduceOp>(code);
}

void* Ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

OpOptions MakeOpOptions(double timeout_s, uint32_t tag) {
  OpOptions o;
  if (timeout_s > 0) o.timeout = absl::Seconds(timeout_s);
  o.tag = tag;
  return o;
}

// Where an op issued without waiting stands: whether it reached its CUDA
// stream (OpOptions::on_queued), and which stream.
struct QueuedState {
  absl::Mutex mu;
  bool queued ABSL_GUARDED_BY(mu) = false;
  uintptr_t stream ABSL_GUARDED_BY(mu) = 0;
};

// An op issued with wait=False (holdfast.distributed issues device ops so):
// queued() returns once it is on the communicator's CUDA stream, so the
// caller can order its own stream after it; wait() returns once it is
// done, raising its error.
class PyPending {
 public:
  PyPending(std::shared_ptr<Work> work, std::shared_ptr<QueuedState> queued)
      : work_(std::move(work)), queued_(std::move(queued)) {}

  // The cudaStream_t (as an int) the op was queued on, or 0 if it never
  // was (refused, aborted, a host backend). Blocks with the GIL released.
  uintptr_t Queued() {
    py::gil_scoped_release release;
    absl::MutexLock lock(&queued_->mu);
    queued_->mu.Await(absl::Condition(&queued_->queued));
    return queued_->stream;
  }

  void Wait() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = work_->Wait();
    }
    Check(s);
  }

  bool Done() const { return work_->IsCompleted(); }

 private:
  std::shared_ptr<Work> work_;
  std::shared_ptr<QueuedState> queued_;
};

// A communicator of one generation, as seen from Python. The runtime owns
// the communicator and replaces it at a recovery; every call first checks
// that the generation is still the runtime's, so a handle kept across a
// recovery fails cleanly (Aborted) instead of touching a freed object.
class PyCommunicator {
 public:
  // Holds a reference to the Python runtime object, so a handle kept past
  // the runtime's life cannot reach a freed one. Made with the GIL held.
  PyCommunicator(Runtime* runtime, Communicator* comm)
      : owner_(py::cast(runtime, py::return_value_policy::reference)),
        runtime_(runtime),
        comm_(comm),
        generation_(comm->generation()) {}

  int rank() { return Get()->rank(); }
  int size() { return Get()->size(); }
  int64_t generation() const { return generation_; }

  // Issues an op: `issue(comm, options)` returns its Work. With `wait`,
  // blocks until it is done (raising its error) and returns None; else
  // returns a PyPending at once. `after_event`: OpOptions::after_event.
  template <typename F>
  py::object Issue(bool wait, uintptr_t after_event, double timeout_s,
                   uint32_t tag, F&& issue) {
    OpOptions o = MakeOpOptions(timeout_s, tag);
    o.after_event = Ptr(after_event);
    Communicator* comm = Get();
    if (wait) {
      absl::Status s;
      {
        py::gil_scoped_release release;
        s = issue(comm, o)->Wait();
      }
      Check(s);
      return py::none();
    }
    auto queued = std::make_shared<QueuedState>();
    o.on_queued = [queued](void* stream) {
      absl::MutexLock lock(&queued->mu);
      queued->queued = true;
      queued->stream = reinterpret_cast<uintptr_t>(stream);
    };
    std::shared_ptr<Work> work;
    {
      py::gil_scoped_release release;
      work = issue(comm, o);
    }
    return py::cast(PyPending(std::move(work), std::move(queued)));
  }

  // "gloo" or "nccl".
  std::string backend() { return std::string(Get()->backend_name()); }
  // Whether its ops take CUDA device memory.
  bool device_memory() { return Get()->memory() == MemoryKind::kCudaDevice; }
  // The cudaStream_t (as an int) its collectives run on; 0 off NCCL.
  uintptr_t cuda_stream() {
#ifdef HOLDFAST_PYTHON_NCCL
    return reinterpret_cast<uintptr_t>(nccl::Stream(*Get()));
#else
    return 0;
#endif
  }

  Communicator* Get() {
    if (runtime_->generation() != generation_) {
      Raise(absl::AbortedError(absl::StrCat(
          "this communicator belongs to generation ", generation_,
          ", which was replaced by generation ", runtime_->generation(),
          "; take the current one from the step context")));
    }
    return comm_;
  }

 private:
  py::object owner_;
  Runtime* runtime_;
  Communicator* comm_;
  int64_t generation_;
};

struct PyStepContext {
  int64_t step = 0;
  int slot = 0;
  int world_size = 0;
  int64_t generation = 0;
  std::shared_ptr<PyCommunicator> comm;
};

py::dict ShardDict(const ShardView& v) {
  py::dict d;
  d["offset"] = v.offset;
  d["bytes"] = v.bytes;
  d["global_bytes"] = v.global_bytes;
  // Writable and shared with the runtime's buffer.
  d["data"] =
      py::memoryview::from_memory(v.data, static_cast<ssize_t>(v.bytes), false);
  return d;
}

RuntimeOptions MakeOptions(const py::kwargs& kw) {
  RuntimeOptions o;
  for (auto item : kw) {
    const std::string key = py::cast<std::string>(item.first);
    py::handle v = item.second;
    if (v.is_none()) continue;
    if (key == "controller") {
      o.controller = py::cast<std::string>(v);
    } else if (key == "token") {
      o.token = py::cast<std::string>(v);
    } else if (key == "token_file") {
      o.token_file = py::cast<std::string>(v);
    } else if (key == "host") {
      o.host = py::cast<std::string>(v);
    } else if (key == "topology_block") {
      o.topology_block = py::cast<std::string>(v);
    } else if (key == "faults") {
      o.faults = py::cast<std::string>(v);
    } else if (key == "preferred_slot") {
      o.preferred_slot = py::cast<int>(v);
    } else if (key == "replicas") {
      o.replicas = py::cast<int>(v);
    } else if (key == "verify_backups") {
      const std::string when = py::cast<std::string>(v);
      if (when == "arrival") {
        o.verify_backups = holdfast::VerifyBackups::kArrival;
      } else if (when == "restore") {
        o.verify_backups = holdfast::VerifyBackups::kRestore;
      } else {
        Raise(absl::InvalidArgumentError(
            absl::StrCat("Runtime: verify_backups is '", when,
                         "'; it is 'arrival' or 'restore'")));
      }
    } else if (key == "tp_size") {
      o.tp_size = py::cast<int>(v);
    } else if (key == "pp_size") {
      o.pp_size = py::cast<int>(v);
    } else if (key == "checkpoint_dir") {
      o.checkpoint_dir = py::cast<std::string>(v);
    } else if (key == "checkpoint_every") {
      o.checkpoint_every = py::cast<int64_t>(v);
    } else if (key == "backend") {
      o.comm.backend = py::cast<std::string>(v);
    } else if (key == "device") {
      o.comm.device = py::cast<int>(v);
    } else if (key == "timeout") {
      o.comm.timeout = absl::Seconds(py::cast<double>(v));
    } else if (key == "connect_timeout") {
      o.comm.connect_timeout = absl::Seconds(py::cast<double>(v));
    } else if (key == "join_timeout") {
      o.join_timeout = absl::Seconds(py::cast<double>(v));
    } else if (key == "recovery_timeout") {
      o.recovery_timeout = absl::Seconds(py::cast<double>(v));
    } else if (key == "max_step_retries") {
      o.max_step_retries = py::cast<int>(v);
    } else {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("Runtime: unknown option '", key, "'")));
    }
  }
  return o;
}

// Destroying a runtime leaves the job and joins its threads: never with
// the GIL held, which they may wait on through a step function.
struct ReleaseGilDelete {
  void operator()(Runtime* runtime) const {
    py::gil_scoped_release release;
    delete runtime;
  }
};
using RuntimeHolder = std::unique_ptr<Runtime, ReleaseGilDelete>;

// RunOptions::state_ready for registered CUDA tensors, whose host copies
// are filled by copies that record `events` (cudaEvent_t handles;
// holdfast/runtime.py, _DeviceState); none without events.
std::function<absl::Status()> StateReady(const std::vector<uintptr_t>& events) {
  if (events.empty()) return nullptr;
#ifdef HOLDFAST_PYTHON_NCCL
  return [events]() -> absl::Status {
    for (uintptr_t e : events) {
      HOLDFAST_RETURN_IF_ERROR(
          nccl::AwaitEvent(reinterpret_cast<void*>(e), absl::Seconds(60)));
    }
    return absl::OkStatus();
  };
#else
  throw py::value_error(
      "run: state_events need holdfast built with CUDA and NCCL");
#endif
}

// RunOptions::standby_warmup from Python's callable (None: none). What it
// raises becomes the error the runtime logs; the standby goes on.
std::function<absl::Status()> StandbyWarmup(const py::object& fn) {
  if (fn.is_none()) return nullptr;
  return [&fn]() -> absl::Status {
    py::gil_scoped_acquire gil;
    try {
      fn();
      return absl::OkStatus();
    } catch (py::error_already_set& e) {
      return absl::UnknownError(absl::StrCat("the warm-up raised ", e.what()));
    }
  };
}

// Runtime.run: runs the loop with the GIL released, the step function,
// the metrics and the restore hook taking it back; a Python exception of
// the step function or the hook ends the run and is raised again here.
RunResult RunFromPython(Runtime& rt, const py::function& step_fn, int64_t steps,
                        int64_t snapshot_every, const py::object& metrics,
                        const py::object& on_restore,
                        const std::string& snapshot_copy,
                        const DataRanges& skip_data, double spike_factor,
                        int64_t start_step,
                        const std::vector<uintptr_t>& state_events,
                        const py::object& standby_warmup) {
  RunOptions ro;
  ro.standby_warmup = StandbyWarmup(standby_warmup);
  ro.state_ready = StateReady(state_events);
  ro.skip_data = skip_data;
  ro.start_step = start_step;
  ro.numerics.spike_factor = spike_factor;
  if (snapshot_copy == "auto") {
    ro.snapshot_copy = RunOptions::SnapshotCopy::kAuto;
  } else if (snapshot_copy == "between_steps") {
    ro.snapshot_copy = RunOptions::SnapshotCopy::kBetweenSteps;
  } else if (snapshot_copy == "during_next_step") {
    ro.snapshot_copy = RunOptions::SnapshotCopy::kDuringNextStep;
  } else {
    throw py::value_error(
        "run: snapshot_copy is '" + snapshot_copy +
        "'; it is 'auto', 'between_steps' or 'during_next_step'");
  }
  // An exception of the step function that is not a holdfast
  // error: Run stops, and it is raised again here.
  std::optional<py::error_already_set> raised;
  py::object holdfast_error =
      py::module_::import("holdfast.errors").attr("HoldfastError");
  auto fn = [&](const StepContext& ctx) -> absl::Status {
    py::gil_scoped_acquire gil;
    PyStepContext pc;
    pc.step = ctx.step;
    pc.slot = ctx.slot;
    pc.world_size = ctx.world_size;
    pc.generation = ctx.generation;
    pc.comm = std::make_shared<PyCommunicator>(&rt, ctx.comm);
    try {
      step_fn(pc);
      return absl::OkStatus();
    } catch (py::error_already_set& e) {
      if (e.matches(holdfast_error)) {
        const int code = py::cast<int>(e.value().attr("code"));
        return absl::Status(static_cast<absl::StatusCode>(code),
                            py::cast<std::string>(py::str(e.value())));
      }
      raised.emplace(std::move(e));
      return absl::UnknownError("the step function raised a Python exception");
    }
  };
  ro.steps = steps;
  ro.snapshot_every = snapshot_every;
  if (!metrics.is_none()) {
    ro.metrics = [&metrics]() {
      py::gil_scoped_acquire gil;
      return py::cast<std::map<std::string, double>>(metrics());
    };
  }
  if (!on_restore.is_none()) {
    ro.on_restore = [&](int64_t step) -> absl::Status {
      py::gil_scoped_acquire gil;
      try {
        on_restore(step);
        return absl::OkStatus();
      } catch (py::error_already_set& e) {
        raised.emplace(std::move(e));
        return absl::UnknownError("the restore hook raised a Python exception");
      }
    };
  }
  absl::StatusOr<RunResult> r;
  {
    py::gil_scoped_release release;
    r = rt.Run(fn, ro);
  }
  if (raised.has_value()) throw *raised;
  Check(r.status());
  return *r;
}

void BindCommunicator(py::module_& m) {
  py::class_<PyCommunicator, std::shared_ptr<PyCommunicator>>(m, "Communicator")
      .def_property_readonly("rank", &PyCommunicator::rank)
      .def_property_readonly("size", &PyCommunicator::size)
      .def_property_readonly("generation", &PyCommunicator::generation)
      .def(
          "all_reduce",
          [](PyCommunicator& c, uintptr_t data, size_t count, int dtype, int op,
             double timeout_s, uintptr_t after_event, bool wait) {
            DataType t = ToDataType(dtype);
            ReduceOp r = ToReduceOp(op);
            return c.Issue(wait, after_event, timeout_s, 0,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->AllReduce(Ptr(data), count, t, r, o);
                           });
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("timeout") = 0.0, py::arg("after_event") = 0,
          py::arg("wait") = true)
      .def(
          "broadcast",
          [](PyCommunicator& c, uintptr_t data, size_t count, int dtype,
             int root, double timeout_s, uintptr_t after_event, bool wait) {
            DataType t = ToDataType(dtype);
            return c.Issue(wait, after_event, timeout_s, 0,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->Broadcast(Ptr(data), count, t, root,
                                                    o);
                           });
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("timeout") = 0.0, py::arg("after_event") = 0,
          py::arg("wait") = true)
      .def(
          "all_gather",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t count,
             int dtype, double timeout_s, uintptr_t after_event, bool wait) {
            DataType t = ToDataType(dtype);
            return c.Issue(wait, after_event, timeout_s, 0,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->AllGather(Ptr(send), Ptr(recv), count,
                                                    t, o);
                           });
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("timeout") = 0.0, py::arg("after_event") = 0,
          py::arg("wait") = true)
      .def(
          "reduce_scatter",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t count,
             int dtype, int op, double timeout_s, uintptr_t after_event,
             bool wait) {
            DataType t = ToDataType(dtype);
            ReduceOp r = ToReduceOp(op);
            return c.Issue(wait, after_event, timeout_s, 0,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->ReduceScatter(Ptr(send), Ptr(recv),
                                                        count, t, r, o);
                           });
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("op"), py::arg("timeout") = 0.0, py::arg("after_event") = 0,
          py::arg("wait") = true)
      .def(
          "all_to_all",
          [](PyCommunicator& c, uintptr_t send, uintptr_t recv, size_t count,
             int dtype, double timeout_s, uintptr_t after_event, bool wait) {
            DataType t = ToDataType(dtype);
            return c.Issue(wait, after_event, timeout_s, 0,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->AllToAll(Ptr(send), Ptr(recv), count,
                                                   t, o);
                           });
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"),
          py::arg("timeout") = 0.0, py::arg("after_event") = 0,
          py::arg("wait") = true)
      .def(
          "barrier",
          [](PyCommunicator& c, double timeout_s, uintptr_t after_event,
             bool wait) {
            return c.Issue(wait, after_event, timeout_s, 0,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->Barrier(o);
                           });
          },
          py::arg("timeout") = 0.0, py::arg("after_event") = 0,
          py::arg("wait") = true)
      .def(
          "send",
          [](PyCommunicator& c, uintptr_t data, size_t count, int dtype,
             int peer, uint32_t tag, double timeout_s, uintptr_t after_event,
             bool wait) {
            DataType t = ToDataType(dtype);
            return c.Issue(wait, after_event, timeout_s, tag,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->Send(Ptr(data), count, t, peer, o);
                           });
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("peer"),
          py::arg("tag") = 0, py::arg("timeout") = 0.0,
          py::arg("after_event") = 0, py::arg("wait") = true)
      .def(
          "recv",
          [](PyCommunicator& c, uintptr_t data, size_t count, int dtype,
             int peer, uint32_t tag, double timeout_s, uintptr_t after_event,
             bool wait) {
            DataType t = ToDataType(dtype);
            return c.Issue(wait, after_event, timeout_s, tag,
                           [&](Communicator* comm, const OpOptions& o) {
                             return comm->Recv(Ptr(data), count, t, peer, o);
                           });
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("peer"),
          py::arg("tag") = 0, py::arg("timeout") = 0.0,
          py::arg("after_event") = 0, py::arg("wait") = true)
      .def_property_readonly("backend", &PyCommunicator::backend)
      .def_property_readonly("device_memory", &PyCommunicator::device_memory)
      .def_property_readonly("cuda_stream", &PyCommunicator::cuda_stream)
      .def(
          "abort",
          [](PyCommunicator& c, const std::string& reason) {
            c.Get()->Abort(reason);
          },
          py::arg("reason") = "aborted from Python")
      .def("dump_trace",
           [](PyCommunicator& c) { return c.Get()->DumpTrace(); });
}

void BindPending(py::module_& m) {
  py::class_<PyPending>(m, "PendingOp")
      .def("queued", &PyPending::Queued)
      .def("wait", &PyPending::Wait)
      .def("done", &PyPending::Done);
}

void BindRecords(py::module_& m) {
  py::class_<PyStepContext>(m, "StepContext")
      .def_readonly("step", &PyStepContext::step)
      .def_readonly("slot", &PyStepContext::slot)
      .def_readonly("world_size", &PyStepContext::world_size)
      .def_readonly("generation", &PyStepContext::generation)
      .def_readonly("comm", &PyStepContext::comm);

  py::class_<RecoveryRecord>(m, "RecoveryRecord")
      .def_readonly("failed_generation", &RecoveryRecord::failed_generation)
      .def_readonly("generation", &RecoveryRecord::generation)
      .def_readonly("cause", &RecoveryRecord::cause)
      .def_readonly("restored_step", &RecoveryRecord::restored_step)
      .def_readonly("lost_steps", &RecoveryRecord::lost_steps)
      .def_readonly("received_state", &RecoveryRecord::received_state)
      .def_readonly("from_disk", &RecoveryRecord::from_disk)
      .def_readonly("bytes_received", &RecoveryRecord::bytes_received)
      .def_readonly("bytes_read_in_place", &RecoveryRecord::bytes_read_in_place)
      .def_readonly("seen_ms", &RecoveryRecord::seen_ms)
      .def_readonly("aborted_ms", &RecoveryRecord::aborted_ms)
      .def_readonly("agreed_ms", &RecoveryRecord::agreed_ms)
      .def_readonly("rebuilt_ms", &RecoveryRecord::rebuilt_ms)
      .def_readonly("restored_ms", &RecoveryRecord::restored_ms)
      .def_readonly("first_step_ms", &RecoveryRecord::first_step_ms)
      .def_readonly("comm_up_ms", &RecoveryRecord::comm_up_ms)
      .def_property_readonly("recovery_ms", [](const RecoveryRecord& r) {
        return r.restored_ms - r.seen_ms;
      });

  py::class_<RunResult>(m, "RunResult")
      .def_readonly("final_step", &RunResult::final_step)
      .def_readonly("world_size", &RunResult::world_size)
      .def_readonly("slot", &RunResult::slot)
      .def_readonly("generation", &RunResult::generation)
      .def_readonly("recoveries", &RunResult::recoveries)
      .def_readonly("snapshots", &RunResult::snapshots)
      .def_readonly("snapshots_skipped", &RunResult::snapshots_skipped)
      .def_readonly("snapshots_overlapped", &RunResult::snapshots_overlapped)
      .def_readonly("snapshots_unfenced", &RunResult::snapshots_unfenced)
      .def_readonly("productive_ms", &RunResult::productive_ms)
      .def_readonly("wall_ms", &RunResult::wall_ms)
      .def_readonly("backups", &RunResult::backups)
      .def_readonly("backup_bytes", &RunResult::backup_bytes)
      .def_readonly("skipped_data", &RunResult::skipped_data);
}

void BindRuntime(py::module_& m) {
  py::class_<Runtime, RuntimeHolder>(m, "Runtime")
      .def(py::init([](py::kwargs kw) {
        RuntimeOptions options = MakeOptions(kw);
        absl::StatusOr<std::unique_ptr<Runtime>> rt;
        {
          py::gil_scoped_release release;
          rt = Runtime::Create(std::move(options));
        }
        Check(rt.status());
        return RuntimeHolder(rt->release());
      }))
      .def_property_readonly("standby", &Runtime::standby)
      .def_property_readonly("slot", &Runtime::slot)
      .def_property_readonly("world_size", &Runtime::world_size)
      .def_property_readonly("generation", &Runtime::generation)
      .def_property_readonly("committed_step", &Runtime::committed_step)
      .def(
          "register_state",
          [](Runtime& rt, const std::string& name, uintptr_t data,
             size_t bytes) { Check(rt.RegisterState(name, Ptr(data), bytes)); },
          py::arg("name"), py::arg("data"), py::arg("bytes"))
      .def(
          "register_sharded_state",
          [](Runtime& rt, const std::string& name, size_t global_bytes,
             size_t unit_bytes) {
            absl::StatusOr<ShardView> v =
                rt.RegisterShardedState(name, global_bytes, unit_bytes);
            Check(v.status());
            return ShardDict(*v);
          },
          py::arg("name"), py::arg("global_bytes"), py::arg("unit_bytes"))
      .def(
          "shard",
          [](Runtime& rt, const std::string& name) {
            absl::StatusOr<ShardView> v = rt.Shard(name);
            Check(v.status());
            return ShardDict(*v);
          },
          py::arg("name"))
      .def("communicator",
           [](Runtime& rt) {
             absl::StatusOr<Communicator*> c;
             {
               py::gil_scoped_release release;
               c = rt.communicator();
             }
             Check(c.status());
             return std::make_shared<PyCommunicator>(&rt, *c);
           })
      .def("run", &RunFromPython, py::arg("step_fn"), py::arg("steps"),
           py::arg("snapshot_every") = 1, py::arg("metrics") = py::none(),
           py::arg("on_restore") = py::none(),
           py::arg("snapshot_copy") = "auto",
           py::arg("skip_data") = DataRanges{},
           py::arg("spike_factor") = NumericChecks().spike_factor,
           py::arg("start_step") = 0,
           py::arg("state_events") = std::vector<uintptr_t>{},
           py::arg("standby_warmup") = py::none())
      .def(
          "register_data_position",
          [](Runtime& rt, const std::string& name, uintptr_t data) {
            Check(rt.RegisterDataPosition(name,
                                          static_cast<int64_t*>(Ptr(data))));
          },
          py::arg("name"), py::arg("data"))
      .def(
          "check_finite",
          [](Runtime& rt, const std::string& what, uintptr_t data,
             size_t count) {
            return rt.CheckFinite(what, static_cast<float*>(Ptr(data)), count);
          },
          py::arg("what"), py::arg("data"), py::arg("count"))
      .def("report_non_finite",
           [](Runtime& rt, const std::string& what) {
             rt.ReportNonFinite(what);
           })
      .def("report_local_squares",
           [](Runtime& rt, double sum_of_squares) {
             rt.ReportLocalSquares(sum_of_squares);
           })
      .def("inject_nan_now",
           [](Runtime& rt) { return runtime_internal::NanFaultFiresNow(rt); })
      .def("gradient_flip_bit_now",
           [](Runtime& rt) { return runtime_internal::GradientFlipBitNow(rt); })
      .def("begin_state_update",
           [](Runtime& rt) {
             // It may wait for a memory copy on the backup thread.
             py::gil_scoped_release release;
             rt.BeginStateUpdate();
           })
      .def("report_early_write",
           [](Runtime& rt, const std::string& what) {
             rt.ReportEarlyWrite(what);
           })
      .def(
          "leave",
          [](Runtime& rt, bool finished) {
            py::gil_scoped_release release;
            rt.Leave(finished);
          },
          py::arg("finished") = false);
}

// nccl_versions(): (the NCCL loaded in this process, the one holdfast was
// compiled against), as NCCL's version codes; None in a build without the
// NCCL backend.
void BindNccl(py::module_& m) {
  m.def("nccl_versions", []() -> py::object {
#ifdef HOLDFAST_PYTHON_NCCL
    return py::make_tuple(nccl::LoadedVersion(), nccl::BuiltVersion());
#else
    return py::none();
#endif
  });
}

void BindCodes(py::module_& m) {
  m.attr("DTYPE_CODES") =
      py::dict(py::arg("float32") = static_cast<int>(DataType::kFloat32),
               py::arg("float64") = static_cast<int>(DataType::kFloat64),
               py::arg("int32") = static_cast<int>(DataType::kInt32),
               py::arg("int64") = static_cast<int>(DataType::kInt64),
               py::arg("bfloat16") = static_cast<int>(DataType::kBFloat16),
               py::arg("float16") = static_cast<int>(DataType::kFloat16),
               py::arg("uint8") = static_cast<int>(DataType::kUInt8),
               py::arg("int8") = static_cast<int>(DataType::kInt8),
               py::arg("bool") = static_cast<int>(DataType::kBool));
  m.attr("REDUCE_CODES") =
      py::dict(py::arg("sum") = static_cast<int>(ReduceOp::kSum),
               py::arg("min") = static_cast<int>(ReduceOp::kMin),
               py::arg("max") = static_cast<int>(ReduceOp::kMax),
               py::arg("product") = static_cast<int>(ReduceOp::kProduct),
               py::arg("average") = static_cast<int>(ReduceOp::kAverage));
}

}  // namespace
}  // namespace holdfast

PYBIND11_MODULE(_C, m) {
  m.doc() = "holdfast's runtime and communicator (see the holdfast package)";
  holdfast::BindPending(m);
  holdfast::BindCommunicator(m);
  holdfast::BindRecords(m);
  holdfast::BindRuntime(m);
  holdfast::BindCodes(m);
  holdfast::BindNccl(m);
}
