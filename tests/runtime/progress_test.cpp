// The progress line's figures (computed here from the bytes and seconds given)
// and how often a terminal is redrawn. Log mode and the programs' own output under
// a pseudo-terminal and a pipe are tested end to end (mpi_tests/progress.sh).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tpreload/core/error.h"
#include "tpreload/runtime/progress.h"

namespace tpreload {
namespace {

ReloadProgress at(std::uint64_t done, std::uint64_t total, double seconds, bool finished = false) {
  ReloadProgress p;
  p.bytes_done = done;
  p.bytes_total = total;
  p.seconds = seconds;
  p.finished = finished;
  return p;
}

TEST(Progress, LineSaysBytesRateAndTimeLeft) {
  // 1.2 GB of 2.2 GB in 0.4 s: 3 GB/s, 1.0 GB left at that rate is 0.33 s.
  EXPECT_EQ(ProgressPrinter::line(at(1'200'000'000, 2'200'000'000, 0.4)),
            "1.20 / 2.20 GB (54%), 3.00 GB/s, 0.3 s left");
  EXPECT_EQ(ProgressPrinter::line(at(2'200'000'000, 2'200'000'000, 1.1, true)),
            "2.20 / 2.20 GB (100%), 2.00 GB/s, done in 1.10 s");
  EXPECT_EQ(ProgressPrinter::line(at(0, 0, 0, true)),
            "0.00 / 0.00 GB (100%), 0.00 GB/s, done in 0.00 s");
}

struct Captured {
  char* text = nullptr;
  std::size_t size = 0;
  std::FILE* file = open_memstream(&text, &size);
  std::string str() {
    std::fflush(file);
    return std::string(text, size);
  }
  ~Captured() {
    std::fclose(file);
    std::free(text);
  }
};

TEST(Progress, ATerminalIsRedrawnInPlaceAtMostTenTimesASecond) {
  Captured out;
  ProgressPrinter print(out.file, true);
  print(at(100'000'000, 400'000'000, 0.00));        // drawn: the first
  print(at(200'000'000, 400'000'000, 0.05));        // skipped: 50 ms later
  print(at(300'000'000, 400'000'000, 0.15));        // drawn
  print(at(400'000'000, 400'000'000, 0.16, true));  // the end is always drawn, with a newline
  const std::string text = out.str();
  EXPECT_EQ(text,
            "\r\033[Kreload: 0.10 / 0.40 GB (25%), 0.00 GB/s, 0.0 s left"
            "\r\033[Kreload: 0.30 / 0.40 GB (75%), 2.00 GB/s, 0.1 s left"
            "\r\033[Kreload: 0.40 / 0.40 GB (100%), 2.50 GB/s, done in 0.16 s\n");
  // A second reload starts afresh: its first line is drawn at once.
  print(at(100'000'000, 400'000'000, 0.01));
  EXPECT_NE(out.str().find("0.10 / 0.40 GB (25%), 10.00 GB/s"), std::string::npos);
}

TEST(Progress, UnknownModeIsRefused) {
  EXPECT_THROW(with_progress(ReloadOptions{}, "loud"), UsageError);
  EXPECT_FALSE(with_progress(ReloadOptions{}, "off").progress);
  EXPECT_TRUE(with_progress(ReloadOptions{}, "log").progress);
}

}  // namespace
}  // namespace tpreload
