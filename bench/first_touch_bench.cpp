// first_touch_bench FILE: what this machine charges for memory the first time.
// Prints the time to write one byte in every page of a buffer of FILE's size
// (the process's first touch), then to pread FILE into that buffer twice (the
// first read is the kernel's first write into those pages). The benchmarks warm
// their buffers by an untimed pass because the two reads differ here
// (docs/PERFORMANCE.md, "Readers").
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "file_bench_util.h"

int main(int argc, char** argv) {
  const int fd = bench::open_file_argument(argc, argv, "first_touch_bench", "FILE");
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size <= 0) {
    std::fprintf(stderr, "first_touch_bench: '%s' is empty or cannot be sized\n", argv[1]);
    return 1;
  }
  std::vector<char> scratch(16 << 20);
  auto read_into = [&](char* dst, bool advance) {  // the whole file, 16 MiB per call
    for (off_t at = 0; at < size;) {
      const ssize_t got =
          ::pread(fd, advance ? dst + at : dst, std::min<off_t>(size - at, 16 << 20), at);
      if (got <= 0) {
        std::fprintf(stderr, "first_touch_bench: pread of '%s' at %lld failed: %s\n", argv[1],
                     static_cast<long long>(at), got < 0 ? std::strerror(errno) : "end of file");
        std::exit(1);
      }
      at += got;
    }
  };
  read_into(scratch.data(), false);  // the file into the page cache
  auto start = std::chrono::steady_clock::now();
  char* buffer = static_cast<char*>(std::malloc(static_cast<std::size_t>(size)));
  for (off_t i = 0; i < size; i += 4096) buffer[i] = static_cast<char>(i >> 12);
  std::printf("first touch of %lld bytes (a byte per page): %.3f s\n", static_cast<long long>(size),
              bench::seconds_since(start));
  for (int pass = 1; pass <= 2; ++pass) {
    start = std::chrono::steady_clock::now();
    read_into(buffer, true);
    std::printf("pread of the file into it, pass %d: %.3f s\n", pass, bench::seconds_since(start));
  }
  std::free(buffer);
  ::close(fd);
  return 0;
}
