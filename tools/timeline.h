// holdfast-run's picture of a run: DIR/timeline.html, one self-contained
// page (inline SVG, no script and no external asset; well-formed XML, so
// any XML parser reads it) with one lane per slot showing its steps, a
// lane of commits, each incident with its diagnosis, and each recovery
// with its stages. The launcher samples the controller's status while
// the job runs (Sample) and renders the page at the end (Html).
#ifndef HOLDFAST_TOOLS_TIMELINE_H_
#define HOLDFAST_TOOLS_TIMELINE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"
#include "src/control/wire/controller.pb.h"

namespace holdfast::run {

struct Canvas;  // the page's drawing area (tools/timeline.cc)

class Timeline {
 public:
  // Records each worker slot's step when it changed since the last sample
  // (and which member holds the slot), and the committed step.
  void Sample(const control::StatusResponse& s, absl::Time now);
  // The page, from the samples and summary.json's incidents and
  // recoveries.
  std::string Html(const nlohmann::json& summary) const;

 private:
  struct Mark {
    int64_t unix_ms = 0;
    int64_t step = 0;
    uint64_t member = 0;
  };
  // Fills the frame: the time range and the lanes' places.
  void Frame(const nlohmann::json& summary, Canvas* c) const;
  // One lane's marks (a member change shown as a diamond).
  void Marks(Canvas& c, const std::vector<Mark>& lane, int y, const char* color,
             const char* what) const;

  std::map<int, std::vector<Mark>> steps_;  // by slot
  std::vector<Mark> commits_;
};

// `text` with &, <, >, " and ' escaped for XML.
std::string XmlEscape(const std::string& text);

}  // namespace holdfast::run

#endif  // HOLDFAST_TOOLS_TIMELINE_H_
