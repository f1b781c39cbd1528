#include "src/control/controller/membership.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/logging.h"
#include "src/control/controller/duration_text.h"
#include "src/control/controller/push_burst.h"

namespace holdfast::control {
namespace {

absl::Status CheckLength(absl::string_view what, const std::string& value,
                         size_t max) {
  if (value.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", value.size(), " bytes; the limit is ", max));
  }
  return absl::OkStatus();
}

// A checkpoint ack's step, on the heartbeat stream or in its own call.
absl::Status CheckAckStep(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ack step ", step, " is negative"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* IncidentKindName(IncidentKind kind) {
  switch (kind) {
    case INCIDENT_CRASHED:
      return "crashed";
    case INCIDENT_SILENT:
      return "silent";
    case INCIDENT_STALLED:
      return "stalled";
    case INCIDENT_REPORTED:
      return "reported";
    case INCIDENT_COMM_FAILED:
      return "comm_failed";
    case INCIDENT_LEFT:
      return "left";
    case INCIDENT_ABSENT:
      return "absent";
    case INCIDENT_DIAGNOSED:
      return "diagnosed";
    case INCIDENT_STRAGGLER:
      return "straggler";
    case INCIDENT_NUMERIC:
      return "numeric";
    case INCIDENT_CORRUPTION:
      return "corruption";
    case INCIDENT_UNREACHABLE:
      return "unreachable";
    default:
      return "unknown";
  }
}

const char* JobStateName(JobState state) {
  switch (state) {
    case JOB_RUNNING:
      return "running";
    case JOB_FINISHED:
      return "finished";
    case JOB_STOPPED:
      return "stopped";
    default:
      return "unknown";
  }
}

const char* StateName(MemberState state) {
  switch (state) {
    case STATE_ALIVE:
      return "alive";
    case STATE_DEAD:
      return "dead";
    case STATE_LEFT:
      return "left";
    default:
      return "unknown";
  }
}

Membership::Membership(int world_size, DetectionOptions detection,
                       absl::Time start, MembershipLimits limits,
                       RecoveryPolicy policy)
    : initial_world_size_(world_size),
      detection_(detection),
      limits_(limits),
      policy_(policy),
      slots_(world_size),
      started_(start) {}

int Membership::world_size() const {
  absl::MutexLock lock(&mu_);
  return slots_.world_size();
}

JobState Membership::job_state() const {
  absl::MutexLock lock(&mu_);
  return job_state_;
}

void Membership::set_observer(MembershipObserver* observer) {
  absl::MutexLock lock(&mu_);
  observer_ = observer;
}

absl::Status Membership::CheckRegister(const RegisterRequest& req) const {
  absl::Status s = CheckLength("host", req.host(), limits_.max_label_bytes);
  if (s.ok()) {
    s = CheckLength("failure_domain", req.failure_domain(),
                    limits_.max_label_bytes);
  }
  if (s.ok()) {
    s = CheckLength("topology_block", req.topology_block(),
                    limits_.max_label_bytes);
  }
  if (!s.ok()) return s;
  if (req.has_preferred_slot() && req.preferred_slot() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("preferred slot ", req.preferred_slot(),
                     " is negative (-1 asks for the standby role)"));
  }
  if (req.pid() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pid ", req.pid(), " is negative"));
  }
  if (req.resume()) {
    if (req.member_id() == 0) {
      return absl::InvalidArgumentError("resume without a member id");
    }
    if (req.slot() < -1 ||
        (req.world_size() > 0 && req.slot() >= req.world_size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", req.slot(), " is out of range [0, ",
                       req.world_size(), ") (-1 for a standby)"));
    }
    if (req.world_size() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("world size ", req.world_size(), " is negative"));
    }
    if (req.generation() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("generation ", req.generation(), " is negative"));
    }
  }
  return absl::OkStatus();
}

absl::Status Membership::CheckReport(const StepReport& r) const {
  if (r.step() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", r.step(), " is negative"));
  }
  if (r.last_step_us() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("last_step_us ", r.last_step_us(), " is negative"));
  }
  if (r.collective_seq() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective_seq ", r.collective_seq(), " is negative"));
  }
  if (!Phase_IsValid(r.phase())) {
    return absl::InvalidArgumentError(
        absl::StrCat("phase ", static_cast<int>(r.phase()), " is unknown"));
  }
  if (static_cast<size_t>(r.metrics_size()) > limits_.max_metrics) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.metrics_size(), " metrics; the limit is ", limits_.max_metrics));
  }
  for (const auto& [name, value] : r.metrics()) {
    if (name.empty() || name.size() > limits_.max_metric_name) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric name of ", name.size(),
                       " bytes; names are 1 to ", limits_.max_metric_name));
    }
  }
  return absl::OkStatus();
}

uint64_t Membership::NewIdLocked() {
  // Random ids stay unique across controller restarts, which forget which
  // ids they handed out.
  for (;;) {
    uint64_t id = absl::Uniform<uint64_t>(rng_);
    if (id != 0 && !members_.contains(id) && !fenced_.contains(id)) return id;
  }
}

RegisterResponse Membership::AssignmentLocked(const Member& m) const {
  RegisterResponse r;
  r.set_member_id(m.id);
  r.set_role(m.role);
  r.set_slot(m.slot);
  r.set_generation(generation_);
  r.set_world_size(slots_.world_size());
  r.set_heartbeat_interval_ms(ToMs(detection_.heartbeat_interval));
  r.set_lease_ms(ToMs(Lease(detection_)));
  r.set_committed_step(checkpoints_.committed());
  anomalies_.FillSkipData(r.mutable_skip_data());
  return r;
}

absl::StatusOr<RegisterResponse> Membership::Register(
    const RegisterRequest& req, absl::Time now) {
  if (absl::Status s = CheckRegister(req); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (job_state_ != JOB_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job has ", JobStateName(job_state_), ": ", job_reason_));
  }
  if (req.resume()) {
    const uint64_t id = req.member_id();
    if (fenced_.contains(id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("member ", id,
                       " was declared dead and is fenced; register as a "
                       "new member"));
    }
    auto it = members_.find(id);
    if (it != members_.end()) {
      // Known here: a reconnect after a stream broke cleanly. Same identity.
      if (it->second.state != STATE_ALIVE) {
        return absl::FailedPreconditionError(
            absl::StrCat("member ", id, " has left the job"));
      }
      it->second.last_seen = now;
      return AssignmentLocked(it->second);
    }
    // Unknown: this controller restarted and rebuilds the job from the
    // members' own view.
    if (req.generation() < generation_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "member ", id, " resumes at generation ", req.generation(),
          " but the job is at generation ", generation_));
    }
    const int world = req.generation() > generation_ && req.world_size() > 0
                          ? req.world_size()
                          : slots_.world_size();
    if (req.slot() >= world) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", req.slot(), " is out of range [0, ", world,
                       ") (-1 for a standby)"));
    }
    if (req.slot() >= 0 && slots_.holder(req.slot()) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("member ", id, " resumes slot ", req.slot(),
                       ", which member ", slots_.holder(req.slot()), " holds"));
    }
    if (req.generation() > generation_) {
      if (world != slots_.world_size() && !slots_.Resize(world)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "member ", id, " resumes generation ", req.generation(), " of ",
            world, " slots, but members here hold slots beyond it"));
      }
      generation_ = req.generation();
      checkpoints_.NewGeneration();
      // Members that registered afresh meanwhile learn the generation.
      BroadcastGenerationLocked({}, 0, nullptr, now);
    }
    const Member& m = AddMemberLocked(id, req, req.slot(), now);
    HOLDFAST_LOG_INFO("member {} ({}, pid {}) resumed as {} at generation {}",
                      id, m.host, m.pid,
                      m.slot >= 0 ? absl::StrCat("slot ", m.slot) : "standby",
                      generation_);
    return AssignmentLocked(m);
  }

  // Once a worker has finished, nobody new takes a slot.
  int slot = finished_workers_ > 0 ? -1 : slots_.LowestVacant();
  if (slot >= 0 && req.has_preferred_slot()) {
    if (req.preferred_slot() < 0) {
      slot = -1;
    } else if (slots_.vacant(req.preferred_slot())) {
      slot = req.preferred_slot();
    }
  }
  const Member& m = AddMemberLocked(NewIdLocked(), req, slot, now);
  HOLDFAST_LOG_INFO("member {} ({}, pid {}, domain '{}') registered as {}",
                    m.id, m.host, m.pid, m.failure_domain,
                    m.slot >= 0 ? absl::StrCat("slot ", m.slot) : "standby");
  return AssignmentLocked(m);
}

Membership::Member& Membership::AddMemberLocked(uint64_t id,
                                                const RegisterRequest& req,
                                                int slot, absl::Time now) {
  Member m;
  m.id = id;
  m.host = req.host();
  m.pid = req.pid();
  m.failure_domain = req.failure_domain();
  m.topology_block = req.topology_block();
  m.last_seen = m.step_changed_at = m.joined = now;
  m.slot = slot;
  if (slot >= 0) {
    m.role = ROLE_WORKER;
    slots_.Take(slot, id);
  } else {
    m.role = ROLE_STANDBY;
    m.standby_order = slots_.AddStandby(id);
  }
  return members_.emplace(id, std::move(m)).first->second;
}

absl::StatusOr<Membership::Member*> Membership::LiveMemberLocked(uint64_t id) {
  if (fenced_.contains(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("member ", id, " was declared dead and is fenced"));
  }
  auto it = members_.find(id);
  if (it == members_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown member id ", id));
  }
  if (it->second.state != STATE_ALIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("member ", id, " has left the job"));
  }
  return &it->second;
}

absl::Status Membership::Heartbeat(const HeartbeatRequest& req,
                                   MemberSink* sink, absl::Time now) {
  if (absl::Status s = CheckReport(req.report()); !s.ok()) return s;
  // A malformed ack is named before the stream binds, so it does not
  // supersede the member's live stream.
  if (req.has_checkpoint_ack()) {
    if (absl::Status s = CheckAckStep(req.checkpoint_ack().step()); !s.ok()) {
      return s;
    }
  }
  absl::MutexLock lock(&mu_);
  auto m = LiveMemberLocked(req.member_id());
  if (!m.ok()) return m.status();
  Member& mem = **m;
  if (req.generation() > generation_ || req.generation() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation ", req.generation(),
        " is not one this controller opened (current ", generation_, ")"));
  }
  absl::StatusOr<bool> bound = BindStream(&mem.sink, sink);
  if (!bound.ok()) return bound.status();
  if (*bound && req.generation() < generation_ && !pushes_.waiting()) {
    // A new stream of a member that missed a generation while it was not
    // bound (a push goes only to bound streams; a merged push pending
    // goes to this stream when it is flushed).
    HeartbeatResponse msg = GenerationPushLocked({}, 0, nullptr);
    msg.mutable_membership()->set_role(mem.role);
    msg.mutable_membership()->set_slot(mem.slot);
    sink->Push(msg);
  }
  if (*bound && checkpoints_.committed() >= 0) {
    // A new stream learns the committed step it may have missed while it
    // was not bound (a commit is pushed only to bound streams).
    PushCommittedLocked(sink);
  }
  ++heartbeats_total_;
  if (observer_ != nullptr) observer_->OnHeartbeat();
  mem.last_seen = now;
  mem.seen_generation = std::max(mem.seen_generation, req.generation());
  // The first step after a stall: what it retransmitted came with the
  // stall (a link cut for a moment), not with training slowed by loss.
  const bool resumed = req.report().step() != mem.step &&
                       now - mem.step_changed_at > loss_stall_;
  NoteReportLocked(mem, req.report(), now);
  NoteReplicaChecksLocked(mem, req.report(), now);
  NoteLocalNormsLocked(mem, req.report(), now);
  if (mem.role == ROLE_WORKER && mem.slot >= 0 &&
      req.report().retransmits_generation() == generation_) {
    losses_.Note(mem.slot, generation_, req.report().retransmits(), now,
                 resumed);
  }
  return absl::OkStatus();
}

void Membership::NoteReportLocked(Member& mem, const StepReport& r,
                                  absl::Time now) {
  if (r.has_rendezvous_generation() &&
      r.rendezvous_generation() > mem.rendezvous_generation) {
    mem.rendezvous_generation = r.rendezvous_generation();
    mem.rendezvous_at = now;
  }
  if (r.step() != mem.step) {
    mem.step = r.step();
    mem.step_changed_at = now;
  }
  mem.phase = r.phase();
  mem.collective_seq = r.collective_seq();
  if (r.last_step_us() > 0) mem.last_step_us = r.last_step_us();
  if (!r.metrics().empty()) {
    mem.metrics.clear();
    for (const auto& [k, v] : r.metrics()) mem.metrics.emplace(k, v);
  }
  if (r.step_end() && r.last_step_us() > 0 && mem.role == ROLE_WORKER) {
    NoteStepEndLocked(mem, r);
  }
}

void Membership::NoteStepEndLocked(Member& mem, const StepReport& r) {
  healthy_pace_.Note(generation_, slots_.world_size(), r.step(),
                     r.last_step_us(), r.collective_us());
  stragglers_.NoteStepEnd(
      mem.slot, generation_,
      StepSample{r.step(), OwnWork(r.last_step_us(), r.collective_us()),
                 r.arrival_us()});
  pace_.Note(r.step(), r.last_step_us());
}

void Membership::Unbind(uint64_t member_id, MemberSink* sink) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(member_id);
  if (it != members_.end() && it->second.sink == sink) {
    it->second.sink = nullptr;
  }
}

void Membership::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void Membership::Detach(uint64_t member_id, MemberSink* sink, bool clean,
                        bool finished, absl::string_view why, absl::Time now,
                        absl::Time heard_at) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(member_id);
  if (it == members_.end() || it->second.sink != sink) return;
  Member& m = it->second;
  m.sink = nullptr;
  if (m.state != STATE_ALIVE || (closed_ && !clean)) return;
  const bool worker = m.role == ROLE_WORKER;
  if (clean && worker && !finished && job_state_ == JOB_RUNNING &&
      finished_workers_ == 0) {
    DeclareLocked(m, INCIDENT_LEFT, "left the job before it finished",
                  m.last_seen, 0, now);
    return;
  }
  if (clean) {
    HOLDFAST_LOG_INFO("member {} ({}) {}", m.id,
                      m.slot >= 0 ? absl::StrCat("slot ", m.slot) : "standby",
                      finished && worker ? "finished" : "left");
    m.state = STATE_LEFT;
    VacateLocked(m);
    RetireLocked(m.id);
    if (finished && worker) {
      ++finished_workers_;
      MaybeFinishLocked();
    }
    return;
  }
  // A stream that breaks after its member went quiet may be the late news
  // of a link that was down (the member's side gave up on it): the
  // silence rule decides, and the member may resume on a new stream.
  if (now - std::max(m.last_seen, heard_at) >
      2 * detection_.heartbeat_interval) {
    HOLDFAST_LOG_INFO(
        "member {} ({}): heartbeat stream broke ({}) {} after its last "
        "heartbeat; left to the silence rule",
        m.id, m.slot >= 0 ? absl::StrCat("slot ", m.slot) : "standby",
        std::string(why), Seconds(now - m.last_seen));
    return;
  }
  DeclareLocked(m, INCIDENT_CRASHED,
                absl::StrCat("heartbeat stream broke (", why, ")"), m.last_seen,
                0, now);
}

void Membership::ProcessExiting(uint64_t member_id, absl::string_view why,
                                absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(member_id);
  if (it == members_.end() || it->second.state != STATE_ALIVE ||
      job_state_ != JOB_RUNNING || closed_) {
    return;
  }
  // A member behind a host agent: its goodbye may still be on the way
  // through the agent, which reports the exit itself, in order.
  if (it->second.sink != nullptr && it->second.sink->Relayed()) return;
  DeclareLocked(it->second, INCIDENT_CRASHED,
                absl::StrCat(why, " (seen in /proc by the controller)"),
                it->second.last_seen, 0, now);
}

absl::StatusOr<bool> Membership::CommFailedLocked(
    Member& r, const ReportFailureRequest& req, absl::Time now) {
  if (r.role != ROLE_WORKER) {
    return absl::FailedPreconditionError(
        absl::StrCat("member ", r.id, " is a standby; it has no communicator"));
  }
  if (job_state_ != JOB_RUNNING || finished_workers_ > 0) return false;
  if (policy_.max_unexplained_rebuilds > 0 &&
      network_.rebuilds() >= policy_.max_unexplained_rebuilds) {
    // Never loop: act on the best evidence, or stop.
    if (NoteUnreachableLocked(r, req, /*force=*/true, now)) return true;
    EndJobLocked(
        JOB_STOPPED,
        absl::StrCat(
            "the group was rebuilt ", network_.rebuilds(),
            " times in a row without committing a step or naming a "
            "culprit; the job stops rather than rebuild forever (last: "
            "slot ",
            r.slot, ": ", req.reason(),
            "). Resume it from its disk tier (holdfast-run prints the "
            "checkpoint directory) once the fault is found"));
    return false;
  }
  network_.NoteRebuild();
  RecordIncidentLocked(MakeIncidentLocked(
      r, INCIDENT_COMM_FAILED,
      absl::StrCat("slot ", r.slot,
                   " reported its communicator failed: ", req.reason()),
      now, r.id, now));
  AbortOrder abort;
  abort.set_reason(
      absl::StrCat("slot ", r.slot, "'s communicator failed: ", req.reason()));
  abort.set_failed_slot(-1);
  OpenGenerationLocked(-1, "", "", std::move(abort), now);
  return true;
}

absl::StatusOr<bool> Membership::ReportFailure(const ReportFailureRequest& req,
                                               absl::Time now) {
  if (absl::Status s =
          CheckLength("reason", req.reason(), limits_.max_reason_bytes);
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  auto reporter = LiveMemberLocked(req.member_id());
  if (!reporter.ok()) return reporter.status();
  for (int u : req.unreachable_slots()) {
    if (u < 0 || u >= slots_.world_size()) {
      return absl::InvalidArgumentError(absl::StrCat("unreachable slot ", u,
                                                     " is out of range [0, ",
                                                     slots_.world_size(), ")"));
    }
  }
  // Evidence of the data network counts from late reports too: in a loop
  // of failing rendezvous only the first report of a generation opens the
  // next, and the others are what tells who lost whom.
  if (req.unreachable_slots_size() > 0 && job_state_ == JOB_RUNNING &&
      finished_workers_ == 0 &&
      NoteUnreachableLocked(**reporter, req, /*force=*/false, now)) {
    return true;
  }
  if (req.evidence_only()) return false;
  if (req.generation() != generation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report from generation ", req.generation(), "; the job is at ",
        generation_, " (the failure was already handled)"));
  }
  if (req.has_anomaly()) {
    return ReportAnomalyLocked(**reporter, req.anomaly(), now);
  }
  if (req.peer_slot() < -1 || req.peer_slot() >= slots_.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer slot ", req.peer_slot(), " is out of range [0, ",
                     slots_.world_size(), ") (-1: the communicator failed)"));
  }
  if (req.peer_slot() == -1) return CommFailedLocked(**reporter, req, now);
  const uint64_t peer_id = slots_.holder(req.peer_slot());
  if (peer_id == 0 || peer_id == req.member_id()) return false;
  Member& peer = members_.at(peer_id);
  DeclareLocked(peer, INCIDENT_REPORTED,
                absl::StrCat("slot ", (*reporter)->slot, " (member ",
                             req.member_id(), ") reported: ", req.reason()),
                peer.last_seen, req.member_id(), now);
  return true;
}

absl::StatusOr<int64_t> Membership::AckCheckpoint(
    const AckCheckpointRequest& req, absl::Time now, MemberSink* stream) {
  (void)now;
  if (absl::Status s = CheckAckStep(req.step()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto m = LiveMemberLocked(req.member_id());
  if (!m.ok()) return m.status();
  if (req.generation() != generation_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ack from generation ", req.generation(),
                     "; the job is at ", generation_));
  }
  if ((*m)->role != ROLE_WORKER) {
    return absl::FailedPreconditionError(
        absl::StrCat("member ", req.member_id(), " is a standby"));
  }
  if (req.step() <= checkpoints_.committed()) {
    if (stream != nullptr) PushCommittedLocked(stream);
    return checkpoints_.committed();
  }
  if (checkpoints_.Ack((*m)->slot, req.step(), slots_.world_size())) {
    CommittedLocked();
  }
  return checkpoints_.committed();
}

void Membership::CommittedLocked() {
  const int64_t step = checkpoints_.committed();
  network_.Spend();  // the data network carried a step
  anomalies_.NoteCommit(step);
  HeartbeatResponse msg;
  msg.set_committed_step(step);
  PushBurst burst;  // one write per host agent's stream
  for (auto& [id, m] : members_) {
    if (m.state == STATE_ALIVE && m.sink != nullptr) m.sink->Push(msg);
  }
}

void Membership::PushCommittedLocked(MemberSink* sink) {
  HeartbeatResponse msg;
  msg.set_committed_step(checkpoints_.committed());
  sink->Push(msg);
}

void Membership::VacateLocked(Member& m) {
  if (m.slot >= 0) {
    slots_.Vacate(m.slot);
  } else {
    slots_.RemoveStandby(m.standby_order);
  }
}

void Membership::RetireLocked(uint64_t id) {
  retired_.push_back(id);
  while (retired_.size() > limits_.max_dead_records) {
    members_.erase(retired_.front());
    retired_.pop_front();
  }
}

Incident Membership::MakeIncidentLocked(const Member& m, IncidentKind kind,
                                        std::string evidence, absl::Time onset,
                                        uint64_t reporter,
                                        absl::Time now) const {
  Incident inc;
  inc.set_kind(kind);
  inc.set_member_id(m.id);
  inc.set_slot(m.slot);
  inc.set_host(m.host);
  inc.set_generation(generation_);
  inc.set_detected_unix_ms(absl::ToUnixMillis(now));
  inc.set_time_to_detect_ms(std::max<int64_t>(0, ToMs(now - onset)));
  inc.set_evidence(std::move(evidence));
  inc.set_reporter_id(reporter);
  inc.set_phase(m.phase);
  inc.set_step(m.step);
  inc.set_collective_seq(m.collective_seq);
  return inc;
}

void Membership::RecordIncidentLocked(Incident kept) {
  Incident& incident = incidents_.Add(std::move(kept));
  HOLDFAST_LOG_WARN("incident {}: {} member {} slot {} ({}): {} [{} ms]",
                    incident.id(), IncidentKindName(incident.kind()),
                    incident.member_id(), incident.slot(), incident.host(),
                    incident.evidence(), incident.time_to_detect_ms());
  cases_.NoteIncident(&incident, slots_.holders());
  if (observer_ != nullptr) observer_->OnIncident(incident);
}

void Membership::DeclareLocked(Member& m, IncidentKind kind,
                               std::string evidence, absl::Time onset,
                               uint64_t reporter, absl::Time now) {
  Incident inc =
      MakeIncidentLocked(m, kind, std::move(evidence), onset, reporter, now);
  inc.set_evicted(true);
  DeclareFencedLocked(m, std::move(inc), now);
}

void Membership::DeclareFencedLocked(Member& m, Incident incident,
                                     absl::Time now) {
  const IncidentKind kind = incident.kind();
  const std::string evidence = incident.evidence();
  RecordIncidentLocked(std::move(incident));

  m.state = STATE_DEAD;
  m.fenced_by = kind;
  m.fenced_at = now;
  fenced_.insert(m.id);
  if (m.sink != nullptr) {
    m.sink->Close(absl::FailedPreconditionError(absl::StrCat(
        "member ", m.id, " was declared dead (", IncidentKindName(kind), ": ",
        evidence, ") and is fenced")));
    m.sink = nullptr;
  }
  const int slot = m.slot;
  VacateLocked(m);
  RetireLocked(m.id);
  if (slot < 0) return;  // a standby: the workers are unaffected
  if (job_state_ != JOB_RUNNING) return;
  if (finished_workers_ > 0) {
    // The job is finishing: the finished slots hold no communicator any
    // more, so there is no group to rebuild.
    MaybeFinishLocked();
    return;
  }
  AbortOrder abort;
  abort.set_reason(absl::StrCat("slot ", slot, " (member ", m.id, ") ",
                                IncidentKindName(kind), ": ", evidence));
  abort.set_failed_slot(slot);
  abort.set_failed_member_id(m.id);
  OpenGenerationLocked(slot, m.host, m.topology_block, std::move(abort), now);
}

std::map<uint64_t, uint64_t>::const_iterator Membership::PickStandbyLocked(
    const std::string& lost_host, const std::string& topology_block) const {
  const std::map<uint64_t, uint64_t>& standbys = slots_.standbys();
  auto pick = standbys.end();
  int best = -1;
  for (auto it = standbys.begin(); it != standbys.end(); ++it) {
    const Member& c = members_.at(it->second);
    if (network_.IsCutOff(c.host)) continue;
    const bool elsewhere = lost_host.empty() || c.host != lost_host;
    const bool near =
        !topology_block.empty() && c.topology_block == topology_block;
    const int rank = 2 * elsewhere + near;
    if (rank > best) {  // the first of a rank waited longest
      best = rank;
      pick = it;
    }
  }
  return pick;
}

void Membership::OpenGenerationLocked(int lost_slot,
                                      const std::string& lost_host,
                                      const std::string& topology_block,
                                      AbortOrder abort, absl::Time now) {
  NextGenerationLocked(&abort);
  std::vector<SlotChange> changes;
  int removed = 0;  // slots a shrink took away
  const std::map<uint64_t, uint64_t>& standbys = slots_.standbys();
  const auto pick = PickStandbyLocked(lost_host, topology_block);
  if (lost_slot >= 0 && !policy_.shrink && pick != standbys.end()) {
    slots_changed_at_ = generation_;
    const uint64_t id = pick->second;
    PromoteStandbyLocked(pick->first, lost_slot, now, &changes);
    HOLDFAST_LOG_INFO("generation {}: standby {} takes slot {}", generation_,
                      id, lost_slot);
  } else if (lost_slot >= 0) {
    // Shrink: the survivors are renumbered in their old order.
    removed = slots_.Compact();
    slots_changed_at_ = generation_;
    for (int i = 0; i < slots_.world_size(); ++i) {
      members_.at(slots_.holder(i)).slot = i;
    }
    // Below the minimum world the job stops (below).
    if (slots_.world_size() >= policy_.min_world) {
      HOLDFAST_LOG_INFO(
          "generation {}: slot {} lost, {}; the world shrinks "
          "to {}",
          generation_, lost_slot,
          policy_.shrink ? "shrink mode" : "no standby left",
          slots_.world_size());
    }
  } else {
    HOLDFAST_LOG_INFO("generation {}: the group is rebuilt ({})", generation_,
                      abort.reason());
  }
  if (slots_.world_size() < policy_.min_world) {
    // Below the minimum the job stops, and the survivors get the stop
    // (which aborts their communicators), never the smaller world: a
    // member that read the new generation first would train in it, and a
    // fast one finished the job there before the stop reached it.
    EndJobLocked(JOB_STOPPED,
                 absl::StrCat(slots_.world_size(),
                              " live workers, below the minimum "
                              "world size ",
                              policy_.min_world, " (", abort.reason(), ")"));
    return;
  }
  BroadcastGenerationLocked(changes, removed, &abort, now);
}

void Membership::NextGenerationLocked(AbortOrder* abort) {
  // The generation that ends; every member of it aborts.
  abort->set_generation(generation_);
  ++generation_;
  checkpoints_.NewGeneration();
  replicas_.Restart(checkpoints_.committed());
  norms_.Restart(checkpoints_.committed());
}

void Membership::PromoteStandbyLocked(uint64_t order, int slot, absl::Time now,
                                      std::vector<SlotChange>* changes) {
  Member& s = members_.at(slots_.standbys().at(order));
  slots_.RemoveStandby(order);
  s.role = ROLE_WORKER;
  s.slot = slot;
  s.step_changed_at = now;
  slots_.Take(slot, s.id);
  SlotChange& c = changes->emplace_back();
  c.set_slot(slot);
  c.set_member_id(s.id);
}

void Membership::ScanGrowthLocked(absl::Time now) {
  const int world = slots_.world_size();
  if (job_state_ != JOB_RUNNING || finished_workers_ > 0 ||
      world >= policy_.max_world || slots_.vacant_count() > 0 ||
      slots_.standbys().empty()) {
    return;
  }
  // Not while the group is being built: every worker is in this
  // generation's group.
  for (uint64_t id : slots_.holders()) {
    if (members_.at(id).rendezvous_generation < generation_) return;
  }
  // The standbys that waited longest, heartbeating and not cut off from
  // the data network; none until the newest of them settled.
  std::vector<std::pair<uint64_t, uint64_t>> picked;  // order, id
  absl::Time newest = absl::InfinitePast();
  for (const auto& [order, id] : slots_.standbys()) {
    if (static_cast<int>(picked.size()) == policy_.max_world - world) break;
    const Member& s = members_.at(id);
    if (s.sink == nullptr || network_.IsCutOff(s.host)) continue;
    picked.emplace_back(order, id);
    newest = std::max(newest, s.joined);
  }
  if (picked.empty() || now - newest < policy_.grow_settle) return;
  const int grown = world + static_cast<int>(picked.size());
  AbortOrder abort;
  abort.set_reason(absl::StrCat(
      "the world grows from ", world, " to ", grown, " workers (",
      picked.size() == 1 ? "a standby"
                         : absl::StrCat(picked.size(), " standbys"),
      " waited; --max-world ", policy_.max_world, ")"));
  abort.set_failed_slot(-1);
  NextGenerationLocked(&abort);
  slots_.Resize(grown);
  slots_changed_at_ = generation_;
  std::vector<SlotChange> changes;
  for (int i = 0; i < static_cast<int>(picked.size()); ++i) {
    PromoteStandbyLocked(picked[i].first, world + i, now, &changes);
  }
  HOLDFAST_LOG_INFO("generation {}: {}", generation_, abort.reason());
  BroadcastGenerationLocked(changes, 0, &abort, now);
}

void Membership::EndJobLocked(JobState state, std::string reason) {
  if (job_state_ != JOB_RUNNING) return;
  job_state_ = state;
  job_reason_ = std::move(reason);
  if (state == JOB_STOPPED) {
    HOLDFAST_LOG_ERROR("job stopped: {}", job_reason_);
  } else {
    HOLDFAST_LOG_INFO("job {}: {}", JobStateName(state), job_reason_);
  }
  HeartbeatResponse msg;
  msg.mutable_job_end()->set_state(state);
  msg.mutable_job_end()->set_reason(job_reason_);
  PushBurst burst;  // one write per host agent's stream
  for (auto& [id, m] : members_) {
    if (m.state == STATE_ALIVE && m.sink != nullptr) m.sink->Push(msg);
  }
}

void Membership::MaybeFinishLocked() {
  // Not while a worker is still running.
  if (finished_workers_ == 0 || slots_.held() > 0) return;
  EndJobLocked(JOB_FINISHED, absl::StrCat(finished_workers_,
                                          " workers finished at "
                                          "generation ",
                                          generation_));
}

void Membership::BroadcastGenerationLocked(
    const std::vector<SlotChange>& changes, int removed,
    const AbortOrder* abort, absl::Time now) {
  // Else merged with the generations that follow it (push_merge.h).
  if (pushes_.Add(changes, removed, abort, now)) {
    PushGenerationLocked(changes, removed, abort, now);
  }
}

void Membership::PushGenerationLocked(const std::vector<SlotChange>& changes,
                                      int removed, const AbortOrder* abort,
                                      absl::Time now) {
  pushes_.Pushed(now);
  const absl::Time began = absl::Now();
  size_t pushed = 0;
  HeartbeatResponse msg = GenerationPushLocked(changes, removed, abort);
  MembershipUpdate* u = msg.mutable_membership();
  {
    PushBurst burst;  // one write per host agent's stream
    for (auto& [id, m] : members_) {
      if (m.state != STATE_ALIVE || m.sink == nullptr) continue;
      u->set_role(m.role);
      u->set_slot(m.slot);
      m.sink->Push(msg);
      ++pushed;
    }
  }
  if (pushed >= 10000) {
    HOLDFAST_LOG_INFO("generation {}: pushed to {} members in {}", generation_,
                      pushed, absl::FormatDuration(absl::Now() - began));
  }
}

HeartbeatResponse Membership::GenerationPushLocked(
    const std::vector<SlotChange>& changes, int removed,
    const AbortOrder* abort) const {
  HeartbeatResponse msg;
  MembershipUpdate* u = msg.mutable_membership();
  u->set_generation(generation_);
  u->set_world_size(slots_.world_size());
  u->set_committed_step(checkpoints_.committed());
  u->set_rollback(anomalies_.rollback_pending());
  anomalies_.FillSkipData(u->mutable_skip_data());
  for (const SlotChange& c : changes) *u->add_changes() = c;
  u->set_slots_removed(removed);
  if (abort != nullptr) *msg.mutable_abort() = *abort;
  return msg;
}

absl::Time Membership::PushDue() const {
  absl::MutexLock lock(&mu_);
  return pushes_.Due();
}

void Membership::FlushPushes(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::optional<PushMerge::Merged> due = pushes_.TakeDue(now);
  if (!due.has_value()) return;
  const PushMerge::Merged& m = *due;
  if (job_state_ != JOB_RUNNING) return;  // the job end was pushed instead
  std::vector<SlotChange> changes;
  for (const auto& [slot, id] : m.changes) {
    // A slot that the shrink renumbered away is no change any more.
    if (slot >= slots_.world_size()) continue;
    SlotChange& c = changes.emplace_back();
    c.set_slot(slot);
    c.set_member_id(id);
  }
  if (m.generations > 1) {
    HOLDFAST_LOG_INFO(
        "generation {}: one push for {} generations opened within {}",
        generation_, m.generations,
        absl::FormatDuration(detection_.push_merge));
  }
  PushGenerationLocked(changes, m.removed,
                       m.abort.has_value() ? &*m.abort : nullptr, now);
}

}  // namespace holdfast::control
