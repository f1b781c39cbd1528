// holdfast's log, written to a string as well for one scope (a test
// case), at info level or finer while it lives. Header-only.
#ifndef HOLDFAST_TEST_SUPPORT_LOG_CAPTURE_H_
#define HOLDFAST_TEST_SUPPORT_LOG_CAPTURE_H_

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "spdlog/sinks/ostream_sink.h"
#include "src/common/logging.h"

namespace holdfast::test {

class LogCapture {
 public:
  LogCapture()
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)),
        level_(holdfast::log::Get().level()) {
    auto& logger = holdfast::log::Get();
    logger.set_level(std::min(level_, spdlog::level::info));
    logger.sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& logger = holdfast::log::Get();
    auto& sinks = logger.sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    logger.set_level(level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // What was logged so far.
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  const spdlog::level::level_enum level_;
};

}  // namespace holdfast::test

#endif  // HOLDFAST_TEST_SUPPORT_LOG_CAPTURE_H_
