// What the standalone file benchmarks (first_touch_bench, read_parts_bench)
// share: a clock and their one argument, a file opened for reading.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bench {

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The file named by the only argument, opened read-only; exits with status 2
// (usage: `program` `usage`) or 1 (it cannot be opened) otherwise.
inline int open_file_argument(int argc, char** argv, const char* program, const char* usage) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s %s\n", program, usage);
    std::exit(2);
  }
  const int fd = ::open(argv[1], O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "%s: cannot open '%s': %s\n", program, argv[1], std::strerror(errno));
    std::exit(1);
  }
  return fd;
}

}  // namespace bench
