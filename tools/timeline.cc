#include "tools/timeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace holdfast::run {
namespace {

using nlohmann::json;

constexpr int kWidth = 1200;
constexpr int kLeft = 110;  // lane labels
constexpr int kRight = 20;
constexpr int kAxis = 58;   // the time axis and the incident labels, on top
constexpr int kLane = 36;   // one slot's lane, and the commits'
constexpr int kStage = 18;  // one recovery's bar
constexpr int kMinLabelGap = 30;  // px between two step labels of a lane

// The stages of a recovery, as its record's timestamps bound them
// ("comm_ready_ms" is derived: see Recoveries).
struct Stage {
  const char* from;
  const char* to;
  const char* name;
  const char* color;
  bool only_if_lasted = false;  // no sliver when it took no time
};
constexpr Stage kStages[] = {
    {"seen_ms", "aborted_ms", "abort", "#e4572e"},
    {"aborted_ms", "agreed_ms", "new generation agreed", "#f3a712"},
    {"agreed_ms", "rebuilt_ms", "communicator rebuilt", "#a8c686"},
    {"rebuilt_ms", "restored_ms", "state restored", "#669bbc"},
    {"restored_ms", "comm_ready_ms", "training communicator awaited", "#b56576",
     true},
    {"comm_ready_ms", "first_step_ms", "first step", "#29335c"},
};

std::string ShortId(const std::string& id) {
  return id.size() > 6 ? id.substr(id.size() - 6) : id;
}

}  // namespace

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters other than tab and newline are not XML.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

void Timeline::Sample(const control::StatusResponse& s, absl::Time now) {
  const int64_t ms = absl::ToUnixMillis(now);
  for (const auto& m : s.members()) {
    if (m.role() != control::ROLE_WORKER || m.slot() < 0 || m.step() < 0 ||
        m.state() != control::STATE_ALIVE) {
      continue;
    }
    std::vector<Mark>& lane = steps_[m.slot()];
    if (!lane.empty() && lane.back().step == m.step() &&
        lane.back().member == m.member_id()) {
      continue;
    }
    lane.push_back({ms, m.step(), m.member_id()});
  }
  if (s.committed_step() >= 0 &&
      (commits_.empty() || commits_.back().step != s.committed_step())) {
    commits_.push_back({ms, s.committed_step(), 0});
  }
}

// The page's drawing area: time maps to x, and the SVG text grows.
struct Canvas {
  int64_t t0 = 0, t1 = 0;
  int slots = 0;
  int commits_y = kAxis, lanes_y = 0, stages_y = 0, height = 0;
  std::string svg;

  double X(int64_t t) const {
    const double span = static_cast<double>(std::max<int64_t>(t1 - t0, 1));
    return kLeft +
           (static_cast<double>(t - t0) / span) * (kWidth - kLeft - kRight);
  }
};

namespace {

void Axis(Canvas& c) {
  const double seconds = static_cast<double>(c.t1 - c.t0) / 1000.0;
  const double tick = seconds > 60   ? 10
                      : seconds > 20 ? 5
                      : seconds > 5  ? 1
                                     : 0.5;
  for (double s = 0; s <= seconds + 1e-9; s += tick) {
    const double tx = c.X(c.t0 + static_cast<int64_t>(s * 1000));
    absl::StrAppendFormat(
        &c.svg,
        "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>"
        "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%gs</text>\n",
        tx, 18, tx, c.stages_y, tx, 14, s);
  }
}

void LaneLabel(Canvas& c, int y, const std::string& label) {
  absl::StrAppendFormat(
      &c.svg,
      "<rect x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>"
      "<text x=\"6\" y=\"%d\">%s</text>\n",
      y, kWidth, kLane, (y / kLane) % 2 ? "#f7f7f7" : "#ffffff", y + 22,
      XmlEscape(label));
}

// The incidents, across every lane, marked on the slot they name.
void Incidents(Canvas& c, const json& incidents) {
  // Labels go to the first of three rows where they do not overlap the
  // previous one (about 6 px a character).
  double row_end[3] = {-1e9, -1e9, -1e9};
  for (const json& i : incidents) {
    const double ix = c.X(i.value("detected_unix_ms", int64_t{0}));
    std::string title =
        absl::StrCat("incident #", i.value("id", 0), " ", i.value("kind", ""),
                     " slot ", i.value("slot", -1), " (generation ",
                     i.value("generation", 0), "): ", i.value("evidence", ""));
    std::string label =
        absl::StrCat("#", i.value("id", 0), " ", i.value("kind", ""));
    if (i.contains("diagnosis")) {
      const json& d = i["diagnosis"];
      const std::vector<int> culprits = d.value("culprits", std::vector<int>{});
      absl::StrAppend(
          &label, ": ", d.value("kind", ""),
          culprits.empty()
              ? std::string()
              : absl::StrCat(" [", absl::StrJoin(culprits, ","), "]"));
      absl::StrAppend(&title, "\ndiagnosis: ", d.value("kind", ""), "; ",
                      d.value("evidence", ""),
                      "\naction: ", d.value("action", ""), " (",
                      d.value("action_reason", ""), ")");
    }
    // Marked on the culprits when the verdict names them, else on the
    // slot the incident names (for comm_failed, the reporter).
    std::vector<int> marked;
    if (i.contains("diagnosis")) {
      marked = i["diagnosis"].value("culprits", std::vector<int>{});
    }
    if (marked.empty() && i.value("slot", -1) >= 0) {
      marked.push_back(i.value("slot", -1));
    }
    absl::StrAppendFormat(
        &c.svg,
        "<g><title>%s</title><line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" "
        "y2=\"%d\" stroke=\"#d62828\" stroke-dasharray=\"4 2\"/>",
        XmlEscape(title), ix, 20, ix, c.stages_y);
    for (int slot : marked) {
      absl::StrAppendFormat(
          &c.svg, "<circle cx=\"%.1f\" cy=\"%d\" r=\"5\" fill=\"#d62828\"/>",
          ix, c.lanes_y + slot * kLane + 17);
    }
    int row = 0;
    while (row < 2 && row_end[row] > ix) ++row;
    row_end[row] = ix + 8 + 6.0 * static_cast<double>(label.size());
    absl::StrAppendFormat(
        &c.svg, "<text x=\"%.1f\" y=\"%d\" fill=\"#d62828\">%s</text></g>\n",
        ix + 4, 29 + 11 * row, XmlEscape(label));
  }
}

// The recoveries, one bar each, by stage, and the legend.
void Recoveries(Canvas& c, const json& recoveries) {
  for (size_t k = 0; k < recoveries.size(); ++k) {
    // Where the training communicator was built during the restore
    // (comm_up_ms, NCCL jobs), the first step waited for it past the
    // restore's end; else it was up before the restore began.
    json r = recoveries[k];
    const int64_t restored = r.value("restored_ms", int64_t{0});
    r["comm_ready_ms"] = std::max(restored, r.value("comm_up_ms", int64_t{0}));
    const int y = c.stages_y + static_cast<int>(k) * kStage;
    for (const Stage& st : kStages) {
      const int64_t a = r.value(st.from, int64_t{0});
      const int64_t b = r.value(st.to, int64_t{0});
      if (a <= 0 || b < a || (b == a && st.only_if_lasted)) continue;
      absl::StrAppendFormat(
          &c.svg,
          "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
          "fill=\"%s\"><title>recovery to generation %d: %s, %d ms</title>"
          "</rect>\n",
          c.X(a), y, std::max(1.0, c.X(b) - c.X(a)), kStage - 4, st.color,
          r.value("generation", 0), st.name, b - a);
    }
  }
  int lx = kLeft;
  const int ly = c.height - 14;
  for (const Stage& st : kStages) {
    absl::StrAppendFormat(
        &c.svg,
        "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
        "<text x=\"%d\" y=\"%d\">%s</text>\n",
        lx, ly - 9, st.color, lx + 14, ly, st.name);
    lx += 24 + 7 * static_cast<int>(std::string(st.name).size());
  }
}

// The incidents as a table.
std::string Table(const json& incidents, int64_t t0) {
  std::string rows;
  for (const json& i : incidents) {
    const json d = i.value("diagnosis", json::object());
    const double at =
        static_cast<double>(i.value("detected_unix_ms", int64_t{0}) - t0) /
        1000.0;
    absl::StrAppendFormat(
        &rows,
        "<tr><td>#%d</td><td>%s</td><td>%d</td><td>%d</td><td>%.3f s</td>"
        "<td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
        i.value("id", 0), XmlEscape(i.value("kind", "")), i.value("slot", -1),
        i.value("generation", 0), at, XmlEscape(d.value("kind", "pending")),
        absl::StrJoin(d.value("culprits", std::vector<int>{}), ", "),
        absl::StrJoin(d.value("victims", std::vector<int>{}), ", "),
        XmlEscape(d.value("action", "")),
        XmlEscape(absl::StrCat(i.value("evidence", ""), " / ",
                               d.value("evidence", ""))));
  }
  return absl::StrCat(
      "<h2>Incidents</h2>\n<table>\n<tr><th>id</th><th>kind</th>"
      "<th>slot</th><th>generation</th><th>detected</th><th>diagnosis</th>"
      "<th>culprits</th><th>victims</th><th>action</th><th>evidence</th>"
      "</tr>\n",
      rows, "</table>\n");
}

}  // namespace

void Timeline::Marks(Canvas& c, const std::vector<Mark>& lane, int y,
                     const char* color, const char* what) const {
  double last_label = -1e9;
  uint64_t member = 0;
  for (const Mark& m : lane) {
    const double mx = c.X(m.unix_ms);
    absl::StrAppendFormat(
        &c.svg,
        "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\">"
        "<title>%s %d</title></line>\n",
        mx, y + 8, mx, y + 26, color, what, m.step);
    if (mx - last_label >= kMinLabelGap) {
      absl::StrAppendFormat(&c.svg, "<text x=\"%.1f\" y=\"%d\">%d</text>\n",
                            mx + 2, y + 34, m.step);
      last_label = mx;
    }
    if (m.member != 0 && member != 0 && m.member != member) {
      absl::StrAppendFormat(
          &c.svg,
          "<path d=\"M %.1f %d l 5 5 l -5 5 l -5 -5 z\" fill=\"#2a9d8f\">"
          "<title>member %d takes the slot</title></path>\n",
          mx, y + 2, m.member);
    }
    if (m.member != 0) member = m.member;
  }
}

void Timeline::Frame(const json& summary, Canvas* c) const {
  c->t0 = INT64_MAX;
  c->t1 = INT64_MIN;
  auto cover = [c](int64_t t) {
    if (t <= 0) return;
    c->t0 = std::min(c->t0, t);
    c->t1 = std::max(c->t1, t);
  };
  for (const auto& [slot, lane] : steps_) {
    for (const Mark& m : lane) cover(m.unix_ms);
    c->slots = std::max(c->slots, slot + 1);
  }
  for (const Mark& m : commits_) cover(m.unix_ms);
  const json incidents = summary.value("incidents", json::array());
  for (const json& i : incidents) {
    cover(i.value("detected_unix_ms", int64_t{0}));
    if (i.contains("diagnosis")) {
      cover(i["diagnosis"].value("verdict_unix_ms", int64_t{0}));
    }
    c->slots = std::max(c->slots, i.value("slot", -1) + 1);
  }
  const json recoveries = summary.value("recoveries", json::array());
  for (const json& r : recoveries) {
    for (const Stage& st : kStages) cover(r.value(st.to, int64_t{0}));
  }
  if (c->t0 > c->t1) c->t0 = c->t1 = 0;
  c->lanes_y = c->commits_y + kLane;
  c->stages_y = c->lanes_y + c->slots * kLane + 10;
  c->height = c->stages_y + static_cast<int>(recoveries.size()) * kStage + 40;
}

std::string Timeline::Html(const json& summary) const {
  Canvas c;
  Frame(summary, &c);
  c.svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      kWidth, c.height);
  Axis(c);
  LaneLabel(c, c.commits_y, "commits");
  Marks(c, commits_, c.commits_y, "#2a9d8f", "committed step");
  for (int slot = 0; slot < c.slots; ++slot) {
    const int y = c.lanes_y + slot * kLane;
    LaneLabel(c, y, absl::StrCat("slot ", slot));
    auto lane = steps_.find(slot);
    if (lane != steps_.end()) Marks(c, lane->second, y, "#555", "step");
  }
  Incidents(c, summary.value("incidents", json::array()));
  Recoveries(c, summary.value("recoveries", json::array()));
  c.svg += "</svg>\n";
  std::string first;
  for (const auto& [slot, lane] : steps_) {
    if (!lane.empty()) {
      absl::StrAppend(&first, first.empty() ? "" : ", ", "slot ", slot,
                      " member ", ShortId(absl::StrCat(lane[0].member)));
    }
  }
  return absl::StrCat(
      "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\">\n"
      "<head><meta charset=\"utf-8\"/><title>holdfast run timeline</title>\n"
      "<style>body{font-family:sans-serif;margin:16px}"
      "table{border-collapse:collapse}td,th{border:1px solid #ccc;"
      "padding:2px 6px;font-size:12px;vertical-align:top}</style></head>\n"
      "<body>\n<h1>holdfast run: ",
      XmlEscape(summary.value("outcome", "")), "</h1>\n<p>",
      XmlEscape(absl::StrCat("steps ", summary.value("steps", 0), ", world ",
                             summary.value("world_size_initial", 0), " to ",
                             summary.value("world_size_final", 0),
                             ", generation ", summary.value("generation", 0),
                             ", state ",
                             summary.value("state_hash", std::string("-")),
                             "; first members: ", first)),
      "</p>\n", c.svg, Table(summary.value("incidents", json::array()), c.t0),
      "</body>\n</html>\n");
}

}  // namespace holdfast::run
