#include "tpreload/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <memory>
#include <mutex>

#include "tpreload/core/error.h"

namespace tpreload {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  // Logs go to stderr so that stdout stays machine-readable (reports, benchmark rows).
  auto logger = spdlog::stderr_color_mt("tpreload");
  logger->set_pattern("[%H:%M:%S.%e] [rank ?/?] [%^%l%$] %v");
  return logger;
}

std::shared_ptr<spdlog::logger>& logger_instance() {
  static std::shared_ptr<spdlog::logger> logger = make_logger();
  return logger;
}

}  // namespace

void init_logging(int rank, int world_size, const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off")
    raise<UsageError>("unknown log level '", level,
                      "' (expected trace, debug, info, warn, error or off)");
  auto& logger = logger_instance();
  logger->set_pattern(detail::concat("[%H:%M:%S.%e] [rank ", rank, "/", world_size,
                                     "] [%^%l%$] %v"));
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::warn);
}

spdlog::logger& log() { return *logger_instance(); }

}  // namespace tpreload
