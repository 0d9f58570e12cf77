#include "tpreload/runtime/progress.h"

#include <unistd.h>

#include <cstdlib>

#include <memory>

#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {

ProgressPrinter::ProgressPrinter(std::FILE* out, bool terminal, std::chrono::milliseconds interval)
    : out_(out), terminal_(terminal), interval_(interval) {}

std::string ProgressPrinter::line(const ReloadProgress& p) {
  const double gb = 1e9, done = p.bytes_done / gb, total = p.bytes_total / gb;
  const double rate = p.seconds > 0 ? done / p.seconds : 0;
  const int percent = p.bytes_total ? static_cast<int>(100.0 * p.bytes_done / p.bytes_total) : 100;
  char text[160];
  if (p.finished)
    std::snprintf(text, sizeof text, "%.2f / %.2f GB (%d%%), %.2f GB/s, done in %.2f s", done,
                  total, percent, rate, p.seconds);
  else
    std::snprintf(text, sizeof text, "%.2f / %.2f GB (%d%%), %.2f GB/s, %.1f s left", done, total,
                  percent, rate, rate > 0 ? (total - done) / rate : 0.0);
  return text;
}

void ProgressPrinter::operator()(const ReloadProgress& p) {
  const double every = terminal_ ? 0.1 : std::chrono::duration<double>(interval_).count();
  if (!p.finished && last_ >= 0 && p.seconds - last_ < every) return;
  if (!p.finished && last_ < 0 && !terminal_ && p.seconds < every)
    return;  // short reloads: the end only
  last_ = p.seconds;
  if (terminal_) {
    std::fprintf(out_, "\r\033[Kreload: %s%s", line(p).c_str(), p.finished ? "\n" : "");
    std::fflush(out_);
  } else {
    log().info("reload progress: {}", line(p));
  }
  if (p.finished) last_ = -1;  // the next reload starts afresh
}

ReloadOptions with_progress(ReloadOptions options, const std::string& mode) {
  std::string chosen = mode;
  const char* env = std::getenv("TPRELOAD_PROGRESS");
  const bool from_env = chosen == "auto" && env && *env;
  if (chosen == "auto") chosen = from_env ? env : isatty(STDERR_FILENO) ? "tty" : "log";
  if (chosen != "tty" && chosen != "log" && chosen != "off")
    raise<UsageError>("progress mode '", chosen, "'",
                      from_env ? " (from the environment variable TPRELOAD_PROGRESS)" : "",
                      " is not auto, tty, log or off");
  if (chosen == "off") return options;
  auto printer = std::make_shared<ProgressPrinter>(stderr, chosen == "tty");
  options.progress = [printer](const ReloadProgress& p) { (*printer)(p); };
  return options;
}

}  // namespace tpreload
