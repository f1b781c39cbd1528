#include "src/control/controller/loss_ledger.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace holdfast::control {
namespace {

// Samples kept per reporter at most (a report every step end).
constexpr size_t kMaxSamples = 256;
// Stalls kept (of every worker) at most.
constexpr size_t kMaxStalls = 4096;

std::pair<std::string, std::string> Ordered(const std::string& a,
                                            const std::string& b) {
  return a < b ? std::make_pair(a, b) : std::make_pair(b, a);
}

}  // namespace

void LossLedger::Note(
    int slot, int64_t generation,
    const google::protobuf::RepeatedPtrField<PeerCount>& counts, absl::Time now,
    bool resumed) {
  if (generation < generation_) return;
  if (generation > generation_) {
    generation_ = generation;
    samples_.clear();  // a new communicator counts from zero
    stalls_.clear();   // and its slots may be other members'
    any_ = false;
  }
  Sample s{now, {}};
  for (const PeerCount& c : counts) {
    if (c.slot() >= 0 && c.count() > 0) s.counts[c.slot()] = c.count();
  }
  // Nothing kept while nobody has retransmitted anything (a report of
  // every member at every step, at any world size, costs one test).
  if (s.counts.empty() && !any_) return;
  any_ = true;
  std::deque<Sample>& q = samples_[slot];
  if (resumed) {
    // What it retransmitted during the stall: the stall's, not the loss's.
    Stall st{now, slot, {}};
    for (const auto& [peer, count] : s.counts) {
      int64_t was = 0;
      if (!q.empty()) {
        auto it = q.back().counts.find(peer);
        if (it != q.back().counts.end()) was = it->second;
      }
      if (count > was) st.grew[peer] = count - was;
    }
    if (!st.grew.empty()) stalls_.push_back(std::move(st));
    if (stalls_.size() > kMaxStalls) stalls_.pop_front();
    q.clear();  // the loss's growth is counted from this sample
  }
  if (s.counts.empty() && !q.empty() && q.back().counts.empty()) {
    q.back().at = now;  // still none: one sample, at zero since now
    return;
  }
  q.push_back(std::move(s));
  if (q.size() > kMaxSamples) q.pop_front();
}

std::map<LossLedger::HostPair, int64_t> LossLedger::HostPairs(
    const std::vector<std::string>& hosts, absl::Time now,
    absl::Duration window) const {
  std::map<HostPair, int64_t> out;
  for (const auto& [slot, q] : samples_) {
    if (slot < 0 || static_cast<size_t>(slot) >= hosts.size() || q.empty()) {
      continue;
    }
    // The window's growth: from the oldest sample inside it.
    const Sample* first = nullptr;
    for (const Sample& s : q) {
      if (s.at >= now - window) {
        first = &s;
        break;
      }
    }
    if (first == nullptr || first == &q.back()) continue;
    for (const auto& [peer, count] : q.back().counts) {
      if (peer < 0 || static_cast<size_t>(peer) >= hosts.size()) continue;
      auto was = first->counts.find(peer);
      const int64_t grew =
          count - (was == first->counts.end() ? 0 : was->second);
      const std::string& a = hosts[static_cast<size_t>(slot)];
      const std::string& b = hosts[static_cast<size_t>(peer)];
      if (grew > 0 && a != b) out[Ordered(a, b)] += grew;
    }
  }
  return out;
}

std::optional<LossLedger::Verdict> LossLedger::NameHost(
    const std::map<HostPair, int64_t>& pairs,
    const std::vector<std::string>& hosts, int64_t min_segments) {
  const std::set<std::string> all(hosts.begin(), hosts.end());
  if (all.size() < 3) return std::nullopt;
  // H must have lost at least min_segments with every other host.
  std::map<std::string, std::pair<size_t, int64_t>> reach;  // count, least
  for (const auto& [ab, n] : pairs) {
    if (n < min_segments) continue;
    for (const std::string* h : {&ab.first, &ab.second}) {
      auto [it, fresh] = reach.try_emplace(*h, 0, INT64_MAX);
      ++it->second.first;
      it->second.second = std::min(it->second.second, n);
    }
  }
  std::optional<Verdict> found;
  for (const auto& [h, r] : reach) {
    if (r.first + 1 < all.size()) continue;
    int64_t elsewhere = 0;
    std::vector<std::string> words;
    for (const auto& [ab, n] : pairs) {
      if (ab.first != h && ab.second != h) {
        elsewhere = std::max(elsewhere, n);
      } else {
        words.push_back(
            absl::StrCat(n, " with ", ab.first == h ? ab.second : ab.first));
      }
    }
    if (elsewhere * 4 > r.second) continue;
    if (found.has_value()) return std::nullopt;  // two such hosts: unclear
    Verdict v;
    v.host = h;
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (hosts[i] == h) v.slots.push_back(static_cast<int>(i));
    }
    v.evidence = absl::StrCat(
        "the training connections crossing it retransmitted ",
        absl::StrJoin(words, ", "),
        " TCP segments, and those between other hosts at most ", elsewhere);
    found = std::move(v);
  }
  return found;
}

std::optional<LossLedger::Verdict> LossLedger::Decide(
    const std::vector<std::string>& hosts, absl::Time now,
    absl::Duration window, int64_t min_segments) const {
  if (!any_) return std::nullopt;
  std::optional<Verdict> v =
      NameHost(HostPairs(hosts, now, window), hosts, min_segments);
  if (v.has_value()) {
    v->evidence = absl::StrCat("the data link of its host ", v->host,
                               " loses packets: over the last ",
                               absl::FormatDuration(window), " ", v->evidence);
  }
  return v;
}

std::optional<LossLedger::Verdict> LossLedger::DecideFlaps(
    const std::vector<std::string>& hosts, absl::Time now,
    absl::Duration window, int64_t min_segments, int min_stalls) const {
  if (stalls_.empty() || min_stalls <= 0) return std::nullopt;
  std::map<HostPair, int64_t> pairs;
  std::map<int, int> stalls_of;  // by slot
  for (const Stall& st : stalls_) {
    if (st.at < now - window || st.slot < 0 ||
        static_cast<size_t>(st.slot) >= hosts.size()) {
      continue;
    }
    const std::string& a = hosts[static_cast<size_t>(st.slot)];
    bool crossed = false;
    for (const auto& [peer, n] : st.grew) {
      if (peer < 0 || static_cast<size_t>(peer) >= hosts.size()) continue;
      const std::string& b = hosts[static_cast<size_t>(peer)];
      if (a == b) continue;
      pairs[Ordered(a, b)] += n;
      crossed = true;
    }
    stalls_of[st.slot] += crossed;
  }
  std::optional<Verdict> v = NameHost(pairs, hosts, min_segments);
  if (!v.has_value()) return v;
  int most = 0;  // the stalls of the host's most stalled worker
  for (int slot : v->slots) most = std::max(most, stalls_of[slot]);
  if (most < min_stalls) return std::nullopt;
  v->evidence = absl::StrCat(
      "the data link of its host ", v->host, " flaps: training stalled ", most,
      " times in the last ", absl::FormatDuration(window),
      ", and during the stalls ", v->evidence);
  return v;
}

}  // namespace holdfast::control
