// Process-wide logging through spdlog with a "[rank r/n]" prefix in the pattern.
//
// init_logging() is called once per process, as soon as the rank is known
// (programs call it right after MPI is up). Library code logs through log(),
// never printf. Before init_logging() the prefix reads "[rank ?/?]".
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace tpreload {

// Set the rank prefix and level ("trace", "debug", "info", "warn", "error", "off").
// Throws UsageError for an unknown level. Safe to call again (e.g. after a split).
void init_logging(int rank, int world_size, const std::string& level = "info");

// The library's logger.
spdlog::logger& log();

}  // namespace tpreload
