// holdfast's logger: one spdlog logger writing timestamped lines to stderr,
// level from HOLDFAST_LOG_LEVEL. Thread-safe.
#ifndef HOLDFAST_SRC_COMMON_LOGGING_H_
#define HOLDFAST_SRC_COMMON_LOGGING_H_

#include <spdlog/spdlog.h>

namespace holdfast::log {

spdlog::logger& Get();

}  // namespace holdfast::log

#define HOLDFAST_LOG_DEBUG(...) ::holdfast::log::Get().debug(__VA_ARGS__)
#define HOLDFAST_LOG_INFO(...) ::holdfast::log::Get().info(__VA_ARGS__)
#define HOLDFAST_LOG_WARN(...) ::holdfast::log::Get().warn(__VA_ARGS__)
#define HOLDFAST_LOG_ERROR(...) ::holdfast::log::Get().error(__VA_ARGS__)

#endif  // HOLDFAST_SRC_COMMON_LOGGING_H_
