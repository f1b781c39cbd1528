// Membership: the controller's view of the job. Slots and standbys,
// generations, heartbeats, failure detection (crashed, silent, stalled,
// reported), incidents and fencing. Pure logic: no gRPC and no clock of
// its own (every call takes `now`), so tests drive it with a fake time.
//
// It is the slot and generation state machine; the rules it acts on live
// in objects of their own, each with its rules in its header:
//   - SlotTable (slot_table.h): who holds each slot, and the standbys;
//   - StragglerWatch (straggler_watch.h): the straggler rule's steps and
//     findings, and the budget of replacements;
//   - CheckpointLedger (checkpoint_ledger.h): the acks and the committed
//     step;
//   - AnomalyLedger (anomaly_ledger.h), fed by ReplicaLedger and
//     GradientLedger: numeric anomalies, rollbacks, skipped data;
//   - detection.h (StepPace, LinkWatch, HealthyPace, the straggler rule)
//     and LossLedger (loss_ledger.h), applied by the scans over the member
//     table (membership_scan.cc);
//   - NetworkEvidence (network_evidence.h): who lost whom on the data
//     network, judged by src/diagnosis/reachability.h;
//   - DiagnosisCases (diagnosis_cases.h): generations awaiting a verdict.
//
// Threading: thread-safe (one mutex). Sinks and the observer are called with
// that mutex held; they must not call back into Membership.
#ifndef HOLDFAST_SRC_CONTROL_CONTROLLER_MEMBERSHIP_H_
#define HOLDFAST_SRC_CONTROL_CONTROLLER_MEMBERSHIP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/control/controller/anomaly_ledger.h"
#include "src/control/controller/checkpoint_ledger.h"
#include "src/control/controller/detection.h"
#include "src/control/controller/diagnosis_cases.h"
#include "src/control/controller/gradient_ledger.h"
#include "src/control/controller/incident_log.h"
#include "src/control/controller/loss_ledger.h"
#include "src/control/controller/network_evidence.h"
#include "src/control/controller/push_merge.h"
#include "src/control/controller/replica_ledger.h"
#include "src/control/controller/slot_table.h"
#include "src/control/controller/straggler_watch.h"
#include "src/control/controller/verdict.h"
#include "src/control/wire/controller.pb.h"
#include "src/control/wire/member_sink.h"
#include "src/diagnosis/diagnosis.h"
#include "src/diagnosis/reachability.h"

namespace holdfast::control {

// A generation whose incidents await the culprit analysis, with what the
// controller knows of each of its slots (liveness, phase, step); the
// trace tails are in the members' abort notices, in the job's store.
struct DiagnosisCase {
  int64_t generation = -1;
  absl::Time since;  // its first incident's detection
  std::vector<diagnosis::SlotEvidence> slots;
};

struct MembershipLimits {
  size_t max_label_bytes = 256;  // host, failure domain, topology block
  size_t max_metrics = 64;       // per report
  size_t max_metric_name = 64;   // bytes
  size_t max_reason_bytes = 4096;
  size_t max_incidents = 1024;     // kept for Status (the oldest drop)
  size_t max_dead_records = 4096;  // dead or left members kept for Status
  int64_t max_pending_ack_steps = 1024;
};

// What happens when a worker is lost.
struct RecoveryPolicy {
  // false (replace): a standby takes the lost slot; with none left the
  // world shrinks. true: the survivors are always renumbered into a
  // smaller world.
  bool shrink = false;
  // Below this many workers the job stops (JobEnd STOPPED), >= 1.
  int min_world = 1;
  // The world grows up to this many workers when standbys wait and the
  // world is smaller (after a shrink, or above the start's size when it
  // is larger): a generation of its own gives the standbys that waited
  // longest the new slots (the survivors keep theirs), once every worker
  // came to the current generation's rendezvous and the newest of those
  // standbys joined grow_settle ago (a node's standbys join together).
  // 0: the world never grows.
  int max_world = 0;
  absl::Duration grow_settle = absl::Seconds(1);
  // Stragglers (DetectionOptions::straggler_*): false, report them only;
  // true, also replace one with a standby once the straggler rule holds
  // over the last straggler_replace_after steps every worker reported too
  // and its peers spend at least straggler_min_cost of each step waiting for
  // it. Never without a standby, and at most straggler_budget times per
  // job: a slowdown of every rank shows no straggler, and one that moves
  // from rank to rank does not evict them all.
  bool replace_stragglers = false;
  int straggler_replace_after = 16;
  double straggler_min_cost = 0.2;
  int straggler_budget = 2;
  // A loop bound: after this many rebuilds of the group in a row that
  // committed no step and named nobody (communicator failures), the
  // controller acts on the best evidence it has (who lost whom on the
  // data network, src/diagnosis/reachability.h) or, with none, stops the
  // job with a report instead of rebuilding forever. 0: no bound.
  int max_unexplained_rebuilds = 6;
};

// Metrics hooks; called with the Membership mutex held.
class MembershipObserver {
 public:
  virtual ~MembershipObserver() = default;
  virtual void OnHeartbeat() {}
  virtual void OnIncident(const Incident& incident) { (void)incident; }
};

class Membership {
 public:
  // `start` is the controller's start time (for uptime).
  Membership(int world_size, DetectionOptions detection, absl::Time start,
             MembershipLimits limits = {}, RecoveryPolicy policy = {});

  // `observer` (may be null) must outlive this object.
  void set_observer(MembershipObserver* observer);

  // New members get the lowest vacant slot, or the standby role when every
  // slot is held. A resume keeps its id, slot and generation when they are
  // still consistent with what this controller knows (after a controller
  // restart it knows nothing, and adopts them). InvalidArgument for bad
  // fields; FailedPrecondition for a fenced member, a stale generation or a
  // slot held by another member.
  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& req,
                                            absl::Time now);

  // A message on `sink`'s stream. The first one binds the stream to the
  // member (a previous stream of the same member is closed as superseded).
  // InvalidArgument for an unknown id or a bad report; FailedPrecondition
  // for a fenced or departed member.
  absl::Status Heartbeat(const HeartbeatRequest& req, MemberSink* sink,
                         absl::Time now);

  // `sink`'s stream ended. `clean`: the member said it was leaving;
  // `finished`: a worker that completed its last step. A member whose
  // current stream breaks is declared crashed; a worker that leaves
  // unfinished while the job runs is declared lost (kind left). When every
  // worker has finished, the job ends (JobEnd FINISHED to the standbys).
  // `heard_at`: when the stream last carried anything (a host agent's
  // stream carries the beats of several members; unset: the member's own
  // last heartbeat). A stream that breaks more than two heartbeat
  // intervals after that is the late news of a link that was down: the
  // silence rule decides.
  // After Close, a stream that breaks only unbinds its sink.
  void Detach(uint64_t member_id, MemberSink* sink, bool clean, bool finished,
              absl::string_view why, absl::Time now,
              absl::Time heard_at = absl::InfinitePast());

  // The process of a live member is exiting or gone, as this machine's
  // /proc shows (ProcessWatch: `why`): declared crashed while the job runs,
  // without waiting for its stream to end.
  void ProcessExiting(uint64_t member_id, absl::string_view why,
                      absl::Time now);

  // The host agent carrying `sink` has heard nothing from the member on
  // its local stream for `quiet`: at DetectionOptions::quiet_after or
  // more, a live member still bound to `sink` is declared silent (a
  // stopped or frozen process).
  void NoteQuiet(uint64_t member_id, MemberSink* sink, absl::Duration quiet,
                 absl::Time now);

  // `sink` no longer carries the member, and that says nothing of its
  // health (its host agent is restarting): it may resume on a new stream,
  // and the silence rule decides if it does not.
  void Unbind(uint64_t member_id, MemberSink* sink);
  // The server stops serving (a shutdown, or a deposed leader abandoning
  // the job): the streams it cuts say nothing about their members, so a
  // broken stream is no longer taken for a crash (a clean leave still
  // counts), and neither is a process exit its /proc watch, which runs
  // until the server is destroyed, still sees.
  void Close();

  // Declares the reporter's peer dead (kind reported). Returns false if it
  // already was. A peer slot of -1 reports that the reporter's
  // communicator failed with no peer known dead: the group is rebuilt at
  // the next generation (kind comm_failed, nobody fenced). FailedPrecondition
  // for a fenced reporter or a stale generation.
  absl::StatusOr<bool> ReportFailure(const ReportFailureRequest& req,
                                     absl::Time now);

  // Records that the member holds its piece of `step`; returns the
  // committed step (every slot of the current generation acked it). An ack
  // that arrived on `stream` (the member's bound heartbeat stream) is
  // answered there: the commit it completes is pushed to every stream, and
  // a step committed already is pushed to `stream`.
  // (A report with an anomaly is a numeric anomaly, not a failure: the
  // job rolls back to a clean committed step and skips the step's data;
  // see ReportAnomalyLocked.)
  absl::StatusOr<int64_t> AckCheckpoint(const AckCheckpointRequest& req,
                                        absl::Time now,
                                        MemberSink* stream = nullptr);

  // Runs the silent, stalled and absent detectors.
  void Scan(absl::Time now);

  // Generation changes that come within DetectionOptions::push_merge of
  // the last push are merged into one push (of the newest): PushDue says
  // when it is due (InfiniteFuture: none waits), and FlushPushes sends it
  // once it is.
  absl::Time PushDue() const;
  void FlushPushes(absl::Time now);

  // The generations with an incident (of a worker) and no verdict yet. A
  // member is dead when its process is gone (its stream broke, or it
  // left), silent when its last heartbeat was more than three heartbeat
  // intervals (at least 1 s) before now or before it was fenced.
  std::vector<DiagnosisCase> PendingDiagnoses(absl::Time now) const;
  // Records the verdict on generation `generation`'s incidents (and on
  // later ones of it), logs it, and acts on it: when it is Actionable,
  // the culprits still alive in their slots are fenced (kind diagnosed)
  // and replaced. A mismatch verdict is not acted on again when no step
  // was committed since the last one was (the mismatch came back with a
  // new member: it is the program's). Returns the verdict as recorded,
  // with its action.
  Verdict SetDiagnosis(int64_t generation, const diagnosis::Diagnosis& d,
                       absl::Time now);

  StatusResponse Status(const StatusRequest& req, absl::Time now) const;

  int world_size() const;
  JobState job_state() const;

 private:
  struct Member {
    uint64_t id = 0;
    Role role = ROLE_STANDBY;
    int slot = -1;
    MemberState state = STATE_ALIVE;
    std::string host, failure_domain, topology_block;
    int64_t pid = 0;
    int64_t step = -1;
    Phase phase = PHASE_UNSPECIFIED;
    int64_t collective_seq = 0;
    int64_t last_step_us = 0;
    std::map<std::string, double> metrics;
    absl::Time last_seen;
    absl::Time step_changed_at;
    uint64_t standby_order = 0;  // lower joined earlier
    absl::Time joined;           // when it registered (or resumed)
    MemberSink* sink = nullptr;
    // The newest generation its heartbeats carried, and the newest whose
    // rendezvous it came to (-1: none), since when.
    int64_t seen_generation = -1;
    int64_t rendezvous_generation = -1;
    absl::Time rendezvous_at;
    // Why and when it was declared dead.
    IncidentKind fenced_by = INCIDENT_UNSPECIFIED;
    absl::Time fenced_at;
  };
  // A generation's roster when its first incident came: the member of
  // each slot (0: vacant).
  absl::Status CheckRegister(const RegisterRequest& req) const;
  absl::Status CheckReport(const StepReport& report) const;
  // The live member `id`, or InvalidArgument (unknown) / FailedPrecondition
  // (fenced or departed).
  absl::StatusOr<Member*> LiveMemberLocked(uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a live member with the request's labels, in `slot` (marked held)
  // or, for -1, as the newest standby.
  Member& AddMemberLocked(uint64_t id, const RegisterRequest& req, int slot,
                          absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RegisterResponse AssignmentLocked(const Member& m) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `m` dead, fences it, records the incident and, for a worker,
  // opens the next generation (a standby takes the slot if there is one).
  void DeclareLocked(Member& m, IncidentKind kind, std::string evidence,
                     absl::Time onset, uint64_t reporter, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same with the incident made (its kind and evidence say why).
  void DeclareFencedLocked(Member& m, Incident incident, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the next generation after `lost_slot` was lost (-1: none lost,
  // the group is only rebuilt) by the member on `lost_host` in
  // `topology_block`: a standby takes the slot, or the world shrinks;
  // below the minimum world the job stops. Pushes it all.
  void OpenGenerationLocked(int lost_slot, const std::string& lost_host,
                            const std::string& topology_block, AbortOrder abort,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The standby that takes a slot lost by a member on `lost_host` in
  // `topology_block`, or end(): never one on a host cut off from the data
  // network; one on another host before one on `lost_host` (which may
  // have failed whole: its standby's last heartbeat can be recent enough
  // while it is as dead); then one in `topology_block`, so communication
  // groups stay compact; then the one that waited longest.
  std::map<uint64_t, uint64_t>::const_iterator PickStandbyLocked(
      const std::string& lost_host, const std::string& topology_block) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the generation `abort` names (the current one) and starts the
  // next: the ledgers that count per generation start over.
  void NextGenerationLocked(AbortOrder* abort)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The standby of `order` takes vacant `slot` (slot < world size); the
  // change is appended to `changes`.
  void PromoteStandbyLocked(uint64_t order, int slot, absl::Time now,
                            std::vector<SlotChange>* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grows the world toward policy_.max_world when standbys wait (the
  // rules at RecoveryPolicy::max_world). Pushes it.
  void ScanGrowthLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndJobLocked(JobState state, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job as finished once a worker has finished and none is left.
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An incident about `m`, detected at `now`, its onset at `onset`.
  Incident MakeIncidentLocked(const Member& m, IncidentKind kind,
                              std::string evidence, absl::Time onset,
                              uint64_t reporter, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `incident` (with the verdict on its generation, if there is
  // one); an incident of a worker's generation with none yet opens its
  // diagnosis case.
  void RecordIncidentLocked(Incident incident)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  diagnosis::SlotEvidence::Liveness LivenessLocked(const Member& m,
                                                   absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What SetDiagnosis does about `v` (sets its action).
  void ActOnVerdictLocked(int64_t generation, const DiagnosisCases::Case& c,
                          const diagnosis::Diagnosis& d, Verdict* v,
                          absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes the new generation to every live member (personalized), with an
  // abort order when `abort` is set.
  // Merges it with the generations opened within push_merge of the last
  // push (FlushPushes sends them as one).
  // `removed`: slots a shrink took away (MembershipUpdate.slots_removed).
  void BroadcastGenerationLocked(const std::vector<SlotChange>& changes,
                                 int removed, const AbortOrder* abort,
                                 absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushGenerationLocked(const std::vector<SlotChange>& changes, int removed,
                            const AbortOrder* abort, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current generation's push, without the receiver's role and slot.
  HeartbeatResponse GenerationPushLocked(const std::vector<SlotChange>& changes,
                                         int removed,
                                         const AbortOrder* abort) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void VacateLocked(Member& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScanStallsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reports the workers slower than their peers (straggler_*).
  void ScanStragglersLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A host whose data link loses packets or flaps (LossLedger): its
  // workers are reported as stragglers, once a generation.
  void ScanLossLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leaves out the members absent from a recovery's rendezvous
  // (DetectionOptions::rendezvous_grace).
  void ScanRendezvousLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker reported that its communicator failed, naming nobody: the
  // group is rebuilt (a new generation), up to the loop bound; past it the
  // best evidence of the data network is acted on, or the job stops.
  absl::StatusOr<bool> CommFailedLocked(Member& r,
                                        const ReportFailureRequest& req,
                                        absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `m` is a straggler (`f`): an incident once a generation, or a
  // standby replaces it where the policy says so, the replacement is due
  // and it costs its peers at least straggler_min_cost. Whether it was
  // replaced.
  bool StragglerLocked(Member& m, const StragglerWatch::Finding& f,
                       absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a heartbeat's step report says of `mem`: its step, phase and
  // metrics; at a worker's step end, its pace, its work time (for the
  // straggler scan) and the job's step history.
  void NoteReportLocked(Member& mem, const StepReport& r, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteStepEndLocked(Member& mem, const StepReport& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step committed: what follows (the evidence it spends, the anomaly
  // ledger's commits) and its push to every live member.
  void CommittedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Numeric anomalies (membership_numeric.cc). A report joins the
  // generation's case; the case is decided when every worker has reported
  // or anomaly_settle after the first report: the job rolls back to the
  // newest clean committed step the members still keep, skips the step's
  // data, and opens the next generation; a slot that was the source of
  // non-finite values at two different data is fenced instead (suspected
  // silent data corruption) and its data is not skipped.
  absl::StatusOr<bool> ReportAnomalyLocked(Member& reporter,
                                           const Anomaly& anomaly,
                                           absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScanAnomaliesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DecideAnomalyLocked(const AnomalyLedger::Case& c, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's replica checks (StepReport::replica_checks); those of
  // another generation than the current one count for nothing. A step
  // where slots hold different replicated state rolls the job back as a
  // numeric anomaly of kind "replica" (anomaly_ledger.h).
  void NoteReplicaChecksLocked(const Member& m, const StepReport& r,
                               absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's local gradient norms (StepReport::local_norms); those of
  // another generation count for nothing. A slot whose norm of a step is
  // far above the others' rolls the job back as a numeric anomaly of kind
  // "gradient" (anomaly_ledger.h), before the step can commit: a step's
  // norms come before its checkpoint acks.
  void NoteLocalNormsLocked(const Member& m, const StepReport& r,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One norm (of a report, or of an anomaly report); true when it made
  // the case that opened a new generation.
  bool NoteLocalNormLocked(const Member& m, const LocalNorm& n, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Data-network evidence (ReportFailureRequest::unreachable_slots): keeps
  // `req`'s edges when its generation's slots are still the current ones,
  // then fences the members the triangulation names, if it names any.
  // Returns whether it fenced anyone. `force`: act on a verdict reached
  // from one reporter's evidence too (the loop bound).
  bool NoteUnreachableLocked(const Member& reporter,
                             const ReportFailureRequest& req, bool force,
                             absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The evidence since the last commit between live workers, by slot and
  // host, and how many members gave it (`reporters`).
  diagnosis::ReachInput ReachInputLocked(size_t* reporters) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes the committed step to one stream (one that may have missed
  // the push of the commit).
  void PushCommittedLocked(MemberSink* sink) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int initial_world_size_;
  const DetectionOptions detection_;
  const MembershipLimits limits_;
  const RecoveryPolicy policy_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  JobState job_state_ ABSL_GUARDED_BY(mu_) = JOB_RUNNING;
  std::string job_reason_ ABSL_GUARDED_BY(mu_);
  int finished_workers_ ABSL_GUARDED_BY(mu_) = 0;
  MembershipObserver* observer_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Member> members_ ABSL_GUARDED_BY(mu_);
  // Ids of members declared dead: refused forever (bounded by the job's
  // failures, 8 bytes each).
  absl::flat_hash_set<uint64_t> fenced_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> retired_
      ABSL_GUARDED_BY(mu_);  // dead/left, oldest first
  // Who holds each slot, and the standbys in order.
  SlotTable slots_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The last generation whose slots changed (a replacement, a shrink): a
  // slot number in a report of an older generation may name another
  // member now.
  int64_t slots_changed_at_ ABSL_GUARDED_BY(mu_) = 0;
  // Who lost whom on the data network, the rebuilds that named nobody,
  // and the hosts cut off from it.
  NetworkEvidence network_ ABSL_GUARDED_BY(mu_);
  // Since when more than half of the live members are unheard (silence
  // verdicts pause meanwhile; see DetectionOptions::lease).
  // No silence verdicts before this (after an isolation).

  // The job's pace against its healthy pace (detection.h).
  HealthyPace healthy_pace_ ABSL_GUARDED_BY(mu_){detection_};

  // Steps already reported as a job-wide stall (no culprit), per generation.
  int64_t job_stall_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t job_stall_generation_ ABSL_GUARDED_BY(mu_) = -1;

  // The acks of the current generation and the committed step.
  CheckpointLedger checkpoints_ ABSL_GUARDED_BY(mu_){
      limits_.max_pending_ack_steps};
  // Numeric anomalies: the open case, the commits the members keep, the
  // data skipped.
  AnomalyLedger anomalies_ ABSL_GUARDED_BY(mu_);
  ReplicaLedger replicas_ ABSL_GUARDED_BY(mu_);
  GradientLedger norms_ ABSL_GUARDED_BY(mu_);
  LossLedger losses_ ABSL_GUARDED_BY(mu_);
  // The generation in which a lossy data link was last reported.
  int64_t loss_reported_generation_ ABSL_GUARDED_BY(mu_) = -1;
  // Training moves when every worker's step ended within loss_moving_; a
  // gap between a worker's step ends longer than loss_stall_ is a stall
  // (DetectionOptions::link_stall). ScanLossLocked keeps both from the
  // pace of the job.
  absl::Duration loss_moving_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(300);
  absl::Duration loss_stall_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(800);

  // Generations waiting to be pushed as one (BroadcastGenerationLocked).
  PushMerge pushes_ ABSL_GUARDED_BY(mu_){detection_.push_merge};

  IncidentLog incidents_ ABSL_GUARDED_BY(mu_){limits_.max_incidents};
  // Diagnosis cases by generation, and the verdicts reached (the newest
  // limits_.max_incidents of each).
  DiagnosisCases cases_ ABSL_GUARDED_BY(mu_){limits_.max_incidents};
  // The committed step when a mismatch verdict last replaced its culprits
  // (-2: never).
  int64_t mismatch_replaced_at_ ABSL_GUARDED_BY(mu_) = -2;
  // The straggler rule's steps and findings, and the replacement budget.
  StragglerWatch stragglers_ ABSL_GUARDED_BY(mu_){
      detection_, policy_.straggler_replace_after, policy_.straggler_budget};
  // Failure detection's own state (detection.h): the job's step pace and
  // the watch on the controller's link.
  StepPace pace_ ABSL_GUARDED_BY(mu_){detection_};
  LinkWatch link_ ABSL_GUARDED_BY(mu_){detection_};
  uint64_t heartbeats_total_ ABSL_GUARDED_BY(mu_) = 0;
  const absl::Time started_;
};

// "crashed", "silent", ... (for logs, the CLI and metric labels).
const char* IncidentKindName(IncidentKind kind);
const char* JobStateName(JobState state);
const char* StateName(MemberState state);

}  // namespace holdfast::control

#endif  // HOLDFAST_SRC_CONTROL_CONTROLLER_MEMBERSHIP_H_
