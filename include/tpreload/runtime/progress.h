// A reload's progress for people: on a terminal one line redrawn in place
// ("reload: 1.20 / 2.20 GB (55%), 3.1 GB/s, 0.3 s left"), otherwise a log line
// every few seconds and one at the end, so that a long reload is never silent
// and a log file is not flooded.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "tpreload/reload/reload.h"

namespace tpreload {

class ProgressPrinter {
 public:
  // `terminal`: redraw on `out` (stderr when it is a terminal); otherwise log
  // through log() at info level, every `interval` and at the end.
  ProgressPrinter(std::FILE* out, bool terminal,
                  std::chrono::milliseconds interval = std::chrono::seconds(5));
  void operator()(const ReloadProgress& p);

  // "1.20 / 2.20 GB (55%), 3.1 GB/s, 0.3 s left" (or "..., done in 0.7 s").
  static std::string line(const ReloadProgress& p);

 private:
  std::FILE* out_;
  bool terminal_;
  std::chrono::milliseconds interval_;
  double last_ = -1;  // seconds of the last line written
};

// A ProgressPrinter on stderr. `mode`: "tty" (redraw), "log" (log lines), "off",
// or "auto": $TPRELOAD_PROGRESS when set (launch/mpirun.sh sets it from its own
// stderr: under mpirun a rank's stderr is a pipe even when the user's is a
// terminal), else whether stderr is a terminal. UsageError for another mode.
ReloadOptions with_progress(ReloadOptions options, const std::string& mode = "auto");

}  // namespace tpreload
