// read_parts_bench FILE: what a part of a split read costs. For parts of 32 bytes
// to 16 KiB, reads the first 64 MiB of FILE (from the page cache: run it twice)
// cut into consecutive parts that land in four separate regions, as a
// row-parallel piece's windows land in four ranks' regions, two ways: a preadv
// with an iovec per part (1,024 per call), and a pread of 256 KiB at a time
// into a buffer that stays in cache, copied out part by part. Prints the best
// of five passes of each. The kernel's cost per iovec is why narrow windows are
// read as full rows and cut in memory (docs/PERFORMANCE.md, "Why it is fast").
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "file_bench_util.h"

int main(int argc, char** argv) {
  const int fd = bench::open_file_argument(argc, argv, "read_parts_bench", "FILE (64 MiB or more)");
  const std::size_t total = std::size_t{64} << 20;
  if (::lseek(fd, 0, SEEK_END) < static_cast<off_t>(total)) {
    std::fprintf(stderr, "read_parts_bench: '%s' is shorter than 64 MiB\n", argv[1]);
    return 1;
  }
  std::vector<char> dst(total), bounce(std::size_t{256} << 10);
  std::memset(dst.data(), 1, dst.size());  // warm, as a live model's memory is
  bool short_read = false;
  std::printf("%8s %14s %10s %14s %10s\n", "part", "preadv(ms)", "GB/s", "pread+copy(ms)", "GB/s");
  for (std::size_t part : {32, 64, 128, 256, 512, 1024, 2048, 4096, 16384}) {
    const std::size_t n = total / part;
    std::vector<iovec> iov(n);
    // Part k into region k % 4, after the region's earlier parts.
    for (std::size_t k = 0; k < n; ++k)
      iov[k] = {dst.data() + (k % 4) * (total / 4) + (k / 4) * part, part};
    double direct = 1e9, bounced = 1e9;
    for (int pass = 0; pass < 5; ++pass) {
      auto start = std::chrono::steady_clock::now();
      for (std::size_t first = 0; first < n; first += 1024) {
        const int count = static_cast<int>(std::min<std::size_t>(1024, n - first));
        short_read |= ::preadv(fd, iov.data() + first, count, static_cast<off_t>(first * part)) !=
                      static_cast<ssize_t>(count * part);
      }
      direct = std::min(direct, bench::seconds_since(start));
      start = std::chrono::steady_clock::now();
      const std::size_t per = bounce.size() / part;
      for (std::size_t first = 0; first < n; first += per) {
        const std::size_t count = std::min(per, n - first);
        short_read |= ::pread(fd, bounce.data(), count * part, static_cast<off_t>(first * part)) !=
                      static_cast<ssize_t>(count * part);
        for (std::size_t k = 0; k < count; ++k)
          std::memcpy(iov[first + k].iov_base, bounce.data() + k * part, part);
      }
      bounced = std::min(bounced, bench::seconds_since(start));
    }
    std::printf("%8zu %14.1f %10.2f %14.1f %10.2f\n", part, direct * 1e3, total / direct / 1e9,
                bounced * 1e3, total / bounced / 1e9);
  }
  ::close(fd);
  if (short_read) {
    std::fprintf(stderr, "read_parts_bench: a read came back short\n");
    return 1;
  }
  return 0;
}
