// Membership's scans (members gone silent, rendezvous no-shows, stalled
// steps) and its status reply.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/logging.h"
#include "src/control/controller/duration_text.h"
#include "src/control/controller/membership.h"

namespace holdfast::control {

void Membership::Scan(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<Member*> silent;
  const absl::Duration suspect = link_.Suspect();
  int alive = 0, unheard = 0;
  for (auto& [id, m] : members_) {
    if (m.state != STATE_ALIVE) continue;
    ++alive;
    if (now - m.last_seen > suspect) ++unheard;
    if (now - m.last_seen > detection_.silent_after) silent.push_back(&m);
  }
  const LinkWatch::Seen seen = link_.Observe(alive, unheard, now);
  if (seen.restart_clocks) {
    for (auto& [id, m] : members_) {
      if (m.state == STATE_ALIVE) {
        m.step_changed_at = std::max(m.step_changed_at, now);
      }
    }
  }
  if (seen.hold_silence) silent.clear();
  for (Member* m : silent) {
    DeclareLocked(
        *m, INCIDENT_SILENT,
        absl::StrCat("no heartbeat for ", Seconds(now - m->last_seen),
                     " (threshold ", Seconds(detection_.silent_after), ")"),
        m->last_seen, 0, now);
  }
  ScanStallsLocked(now);
  ScanStragglersLocked(now);
  ScanLossLocked(now);
  ScanRendezvousLocked(now);
  ScanAnomaliesLocked(now);
  ScanGrowthLocked(now);
}

void Membership::NoteQuiet(uint64_t member_id, MemberSink* sink,
                           absl::Duration quiet, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const absl::Duration after = QuietAfter(detection_);
  if (after <= absl::ZeroDuration() || quiet < after ||
      job_state_ != JOB_RUNNING) {
    return;
  }
  auto it = members_.find(member_id);
  if (it == members_.end() || it->second.state != STATE_ALIVE ||
      it->second.sink != sink || sink == nullptr) {
    return;
  }
  Member& m = it->second;
  DeclareLocked(
      m, INCIDENT_SILENT,
      absl::StrCat("its host agent on ", m.host, " heard nothing from it for ",
                   Seconds(quiet), " while the agent was heard (threshold ",
                   Seconds(after),
                   "): a stopped or frozen process, as a local stream has "
                   "no link to blip"),
      now - quiet, 0, now);
}

void Membership::ScanRendezvousLocked(absl::Time now) {
  // The first generation's members set up at their own pace; a finishing
  // job has no group to rebuild; a vacant slot has nobody to wait for.
  if (generation_ == 0 || job_state_ != JOB_RUNNING || finished_workers_ > 0 ||
      slots_.vacant_count() > 0) {
    return;
  }
  absl::Time ready_at = absl::InfinitePast();
  int ready = 0;
  std::vector<Member*> absent;
  for (uint64_t id : slots_.holders()) {
    Member& m = members_.at(id);
    if (m.rendezvous_generation >= generation_) {
      ++ready;
      ready_at = std::max(ready_at, m.rendezvous_at);
    } else {
      absent.push_back(&m);
    }
  }
  if (ready == 0 || absent.empty()) return;
  const absl::Duration quiet =
      std::max(detection_.rendezvous_grace, 2 * detection_.heartbeat_interval);
  const int64_t gen = generation_;
  std::vector<std::pair<Member*, std::string>> out;
  for (Member* m : absent) {
    const bool answers =
        m->seen_generation >= gen && now - m->last_seen <= quiet;
    const absl::Duration bound =
        answers ? detection_.rendezvous_timeout : detection_.rendezvous_grace;
    if (now - ready_at < bound) continue;
    out.emplace_back(
        m,
        absl::StrCat(
            "did not come to the rendezvous of generation ", gen, " within ",
            Seconds(bound), " of the other ", ready, " member(s) being there; ",
            answers ? "it still heartbeats (its training thread is stuck)"
                    : absl::StrCat("no answer: last heartbeat ",
                                   Seconds(now - m->last_seen), " ago",
                                   m->seen_generation < gen
                                       ? ", never of this generation"
                                       : "")));
  }
  // Every absent member is declared, each opening a generation of its own.
  for (auto& [m, evidence] : out) {
    DeclareLocked(*m, INCIDENT_ABSENT, std::move(evidence), ready_at, 0, now);
  }
}

void Membership::ScanStallsLocked(absl::Time now) {
  const std::optional<absl::Duration> threshold = pace_.StallThreshold();
  if (!threshold.has_value()) return;
  // The rule is detection.h's Laggards.
  std::vector<Member*> stuck;
  std::vector<Progress> progress;
  int live_workers = 0;
  for (auto& [id, m] : members_) {
    if (m.state != STATE_ALIVE || m.role != ROLE_WORKER) continue;
    ++live_workers;
    if (m.phase == PHASE_RECOVERING) continue;
    if (now - m.step_changed_at > *threshold) {
      stuck.push_back(&m);
      progress.emplace_back(m.step, m.collective_seq);
    }
  }
  if (stuck.empty()) return;
  const Stall stall = Laggards(progress, live_workers);
  std::vector<Member*> laggards;
  for (size_t i : stall.laggards) laggards.push_back(stuck[i]);
  const absl::Duration median = pace_.Median();
  auto evidence = [&](const Member* m) {
    return absl::StrCat(
        "step ", m->step, " has not advanced for ",
        Seconds(now - m->step_changed_at), " (threshold ", Seconds(*threshold),
        ": ", detection_.stall_factor, " x median step ", Seconds(median),
        ", floor ", Seconds(detection_.stall_floor), "); phase ",
        PhaseName(m->phase), ", last collective #", m->collective_seq);
  };
  if (stall.job_wide) {
    // Every worker is stuck at the same point: no culprit to fence. Record
    // it once per step and generation.
    if (job_stall_step_ == laggards[0]->step &&
        job_stall_generation_ == generation_) {
      return;
    }
    job_stall_step_ = laggards[0]->step;
    job_stall_generation_ = generation_;
    Incident inc;
    inc.set_kind(INCIDENT_STALLED);
    inc.set_slot(-1);
    inc.set_generation(generation_);
    inc.set_detected_unix_ms(absl::ToUnixMillis(now));
    inc.set_time_to_detect_ms(std::max<int64_t>(
        0, ToMs(now - (laggards[0]->step_changed_at + median))));
    inc.set_evidence(absl::StrCat(
        "all ", live_workers,
        " workers stuck alike, no culprit: ", evidence(laggards[0])));
    RecordIncidentLocked(std::move(inc));
    return;
  }
  for (Member* m : laggards) {
    DeclareLocked(*m, INCIDENT_STALLED, evidence(m),
                  m->step_changed_at + median, 0, now);
  }
}

StatusResponse Membership::Status(const StatusRequest& req,
                                  absl::Time now) const {
  absl::MutexLock lock(&mu_);
  StatusResponse r;
  r.set_world_size(slots_.world_size());
  r.set_initial_world_size(initial_world_size_);
  r.set_job_state(job_state_);
  r.set_job_reason(job_reason_);
  r.set_shrink(policy_.shrink);
  r.set_min_world(policy_.min_world);
  r.set_max_world(policy_.max_world);
  r.set_generation(generation_);
  r.set_committed_step(checkpoints_.committed());
  anomalies_.FillSkipData(r.mutable_skip_data());
  r.set_rollbacks(anomalies_.rollbacks());
  r.set_pace_step_us(healthy_pace_.step_us());
  r.set_pace_healthy_us(healthy_pace_.healthy_us());
  r.set_uptime_ms(ToMs(now - started_));
  r.set_vacant_slots(slots_.vacant_count());
  r.set_standbys(static_cast<int32_t>(slots_.standbys().size()));
  r.set_median_step_us(absl::ToInt64Microseconds(pace_.Median()));
  auto threshold = pace_.StallThreshold();
  r.set_stall_threshold_ms(threshold.has_value() ? ToMs(*threshold) : -1);
  r.set_heartbeats_total(heartbeats_total_);
  r.set_incidents_total(incidents_.total());
  int alive = 0, left = 0;
  for (const auto& [id, m] : members_) {
    alive += m.state == STATE_ALIVE;
    left += m.state == STATE_LEFT;
    if (!req.include_members()) continue;
    MemberInfo* info = r.add_members();
    info->set_member_id(m.id);
    info->set_role(m.role);
    info->set_slot(m.slot);
    info->set_state(m.state);
    info->set_host(m.host);
    info->set_pid(m.pid);
    info->set_failure_domain(m.failure_domain);
    info->set_topology_block(m.topology_block);
    info->set_step(m.step);
    info->set_phase(m.phase);
    info->set_collective_seq(m.collective_seq);
    info->set_last_step_us(m.last_step_us);
    info->set_heartbeat_age_ms(ToMs(now - m.last_seen));
    info->mutable_metrics()->insert(m.metrics.begin(), m.metrics.end());
    info->set_connected(m.sink != nullptr);
  }
  r.set_alive(alive);
  // Every member declared dead is fenced, also those whose records dropped.
  r.set_dead(static_cast<int32_t>(fenced_.size()));
  r.set_left(left);
  if (req.include_members()) {
    std::sort(r.mutable_members()->begin(), r.mutable_members()->end(),
              [](const MemberInfo& a, const MemberInfo& b) {
                auto key = [](const MemberInfo& m) {
                  return std::make_tuple(m.state() != STATE_ALIVE,
                                         m.slot() < 0 ? INT32_MAX : m.slot(),
                                         m.member_id());
                };
                return key(a) < key(b);
              });
  }
  incidents_.Newest(req.max_incidents(), r.mutable_incidents());
  return r;
}

bool Membership::StragglerLocked(Member& m, const StragglerWatch::Finding& f,
                                 absl::Time now) {
  const SlowWindow& w = f.window;
  const std::string evidence = absl::StrFormat(
      "its own work took %.1f ms a step against its peers' %.1f ms "
      "(%.2fx) over the last %d steps every worker reported, and it was "
      "slow on %d of them (step time less time inside collectives, or "
      "more where it issued its collectives late; threshold %.2fx): the "
      "others wait for it in each collective",
      w.mine / w.steps / 1000.0, w.peers / w.steps / 1000.0,
      w.peers > 0 ? w.mine / w.peers : 0.0, w.steps, w.slow,
      detection_.straggler_factor);
  // The share of each step its peers spend waiting for it.
  const double cost = w.mine > 0 ? 1.0 - w.peers / w.mine : 0.0;
  if (policy_.replace_stragglers && f.replace_due &&
      cost >= policy_.straggler_min_cost && !slots_.standbys().empty() &&
      stragglers_.CanReplace(1)) {
    const int spent = stragglers_.SpendReplacement();
    DeclareLocked(
        m, INCIDENT_STRAGGLER,
        absl::StrFormat("%s; it costs the job %.0f%% of each "
                        "step, so a standby replaces it (%d of "
                        "the job's budget of %d)",
                        evidence, 100 * cost, spent, stragglers_.budget()),
        now, 0, now);
    return true;
  }
  if (stragglers_.reported(f.slot, generation_)) return false;
  stragglers_.MarkReported(f.slot, generation_);
  RecordIncidentLocked(
      MakeIncidentLocked(m, INCIDENT_STRAGGLER, evidence, now, 0, now));
  return false;
}

void Membership::ScanStragglersLocked(absl::Time now) {
  // Only new step ends can change the answer.
  if (!stragglers_.TakeStepEnds() || job_state_ != JOB_RUNNING ||
      finished_workers_ > 0) {
    return;
  }
  for (uint64_t id : slots_.holders()) {
    if (id == 0 || members_.at(id).state != STATE_ALIVE) return;
  }
  for (const StragglerWatch::Finding& f :
       stragglers_.Scan(slots_.world_size(), generation_, pace_.Median())) {
    // A replacement opens a new generation: the steps start over.
    if (StragglerLocked(members_.at(slots_.holder(f.slot)), f, now)) return;
  }
}

void Membership::ScanLossLocked(absl::Time now) {
  if (detection_.lossy_link_min_segments <= 0) return;
  // Training goes on, slowed: a link that is cut stops it, and the
  // retransmissions of the cut are not counted (the data-link verdicts
  // name that host; LossLedger::Note drops what a stall retransmitted).
  loss_moving_ = std::max(absl::Milliseconds(300), 5 * pace_.Median());
  loss_stall_ = std::max(detection_.link_stall, 5 * pace_.Median());
  if (!losses_.any() || job_state_ != JOB_RUNNING || finished_workers_ > 0 ||
      loss_reported_generation_ == generation_) {
    return;
  }
  std::vector<std::string> hosts;
  for (uint64_t id : slots_.holders()) {
    if (id == 0) return;
    const Member& m = members_.at(id);
    if (now - m.step_changed_at > loss_moving_) return;
    hosts.push_back(m.host);
  }
  std::optional<LossLedger::Verdict> v =
      losses_.Decide(hosts, now, detection_.lossy_link_window,
                     detection_.lossy_link_min_segments);
  if (!v.has_value()) {
    v = losses_.DecideFlaps(hosts, now, detection_.flap_window,
                            detection_.lossy_link_min_segments,
                            detection_.flap_min_stalls);
  }
  if (!v.has_value()) return;
  loss_reported_generation_ = generation_;
  // Replaced under the straggler policy when standbys on other hosts can
  // take every one of its slots within the budget; the host takes no
  // slot again, as a host cut off from the data network.
  int elsewhere = 0;
  for (const auto& [order, id] : slots_.standbys()) {
    const Member& s = members_.at(id);
    elsewhere += s.host != v->host && !network_.IsCutOff(s.host);
  }
  const int n = static_cast<int>(v->slots.size());
  const bool replace =
      policy_.replace_stragglers && elsewhere >= n && stragglers_.CanReplace(n);
  if (replace) network_.CutOff(v->host);
  for (int slot : v->slots) {
    const uint64_t id = slots_.holder(slot);
    if (id == 0) continue;
    Member& m = members_.at(id);
    if (!replace) {
      RecordIncidentLocked(
          MakeIncidentLocked(m, INCIDENT_STRAGGLER, v->evidence, now, 0, now));
      continue;
    }
    const int spent = stragglers_.SpendReplacement();
    DeclareLocked(
        m, INCIDENT_STRAGGLER,
        absl::StrCat(v->evidence, "; a standby on another host replaces it (",
                     spent, " of the job's budget of ", stragglers_.budget(),
                     ")"),
        now, 0, now);
  }
}

}  // namespace holdfast::control
