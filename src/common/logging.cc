#include "src/common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include "src/common/config.h"

namespace holdfast::log {

spdlog::logger& Get() {
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* l = new spdlog::logger("holdfast", std::move(sink));
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e holdfast[%P] %l: %v");
    std::string level = config::StringParam("HOLDFAST_LOG_LEVEL");
    auto parsed = spdlog::level::from_str(level);
    // from_str maps unknown names to "off"; keep "info" unless asked.
    if (parsed == spdlog::level::off && level != "off") {
      parsed = spdlog::level::info;
    }
    l->set_level(parsed);
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace holdfast::log
