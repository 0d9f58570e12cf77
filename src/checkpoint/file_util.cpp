#include "file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload::detail {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

}  // namespace

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0 && ::close(fd_) != 0)
    log().warn("close of file descriptor {} failed: {}", fd_, errno_text(errno));
}

void FileDescriptor::close(const std::string& path) {
  const int fd = release();
  if (fd >= 0 && ::close(fd) != 0)
    raise<CheckpointError>("close of '", path, "' failed: ", errno_text(errno));
}

MappedFile MappedFile::open(const std::string& path) {
  MappedFile m;
  m.path_ = path;
  // (O_NONBLOCK: opening a FIFO by that name must not wait for a writer)
  m.fd_ = FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (m.fd_.get() < 0) raise<CheckpointError>("cannot open '", path, "': ", errno_text(errno));
  struct stat st {};
  if (::fstat(m.fd_.get(), &st) != 0)
    raise<CheckpointError>("cannot stat '", path, "': ", errno_text(errno));
  if (!S_ISREG(st.st_mode)) raise<CheckpointError>("'", path, "' is not a regular file");
  m.size_ = static_cast<std::uint64_t>(st.st_size);
  if (m.size_ == 0) return m;  // mmap of 0 bytes is invalid; nothing to map
  void* addr = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, m.fd_.get(), 0);
  if (addr == MAP_FAILED)
    raise<CheckpointError>("cannot map '", path, "' (", m.size_, " bytes): ", errno_text(errno));
  m.data_ = static_cast<const std::byte*>(addr);
  m.guard_ = MappingGuard(m.data_, m.size_);
  return m;
}

void MappedFile::check_intact() const {
  const std::uint64_t n = faults();
  struct stat st {};
  const bool shrank = fd_.get() >= 0 && ::fstat(fd_.get(), &st) == 0 &&
                      static_cast<std::uint64_t>(st.st_size) < size_;
  if (n == 0 && !shrank) return;
  raise<CheckpointError>(
      "'", path_, "' no longer holds the ", size_, " bytes it had when opened",
      shrank ? concat(" (it has ", st.st_size, " now)") : std::string(),
      n ? concat(": ", n, " page(s) of its mapping could not be read") : std::string(),
      "; the file was truncated, replaced in place or its storage failed during the reload");
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::move(other.fd_)),
      guard_(std::move(other.guard_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    guard_ = MappingGuard();  // before the pages go
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    fd_ = std::move(other.fd_);
    guard_ = std::move(other.guard_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  guard_ = MappingGuard();  // before the pages go
  if (data_ != nullptr && ::munmap(const_cast<std::byte*>(data_), size_) != 0)
    log().warn("munmap of '{}' failed: {}", path_, errno_text(errno));
}

void pread_exact(int fd, void* dst, std::uint64_t size, std::uint64_t offset,
                 const std::string& path) {
  auto* out = static_cast<char*>(dst);
  std::uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      raise<CheckpointError>("read of ", size, " bytes at offset ", offset, " of '", path,
                             "' failed: ", errno_text(errno));
    if (n == 0)
      raise<CheckpointError>("read of ", size, " bytes at offset ", offset, " of '", path,
                             "' hit end of file after ", done, " bytes");
    done += static_cast<std::uint64_t>(n);
  }
}

constexpr std::size_t kMaxIov = 1024;  // Linux UIO_MAXIOV, POSIX IOV_MAX there
// Runs of parts averaging under kSmallPart bytes are read whole into a bounce
// buffer of kBounceBytes (it stays in L2) and copied out: the kernel's cost per
// iovec makes a preadv of 32-byte parts 2.2x slower than that (docs/PERFORMANCE.md,
// "Why it is fast").
constexpr std::size_t kBounceBytes = std::size_t{256} << 10;
constexpr std::size_t kSmallPart = 512;

namespace {

// preadv of `iov` (consumed) from `offset` on, kMaxIov per call, a short read continuing.
void preadv_all(int fd, std::vector<iovec>& iov, std::uint64_t offset, const std::string& path) {
  std::uint64_t total = 0;
  for (const iovec& v : iov) total += v.iov_len;
  const std::uint64_t start = offset;
  std::size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<std::size_t>(iov.size() - first, kMaxIov));
    const ssize_t n = ::preadv(fd, iov.data() + first, count, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      raise<CheckpointError>("read of ", total, " bytes (", iov.size(), " pieces) at offset ",
                             start, " of '", path, "' failed at offset ", offset, ": ",
                             errno_text(errno));
    if (n == 0)
      raise<CheckpointError>("read of ", total, " bytes at offset ", start, " of '", path,
                             "' hit end of file after ", offset - start, " bytes");
    offset += static_cast<std::uint64_t>(n);
    // Step past the pieces filled; a partly filled one continues where it stopped.
    auto left = static_cast<std::size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  iov.clear();
}

}  // namespace

void preadv_exact(int fd, const std::vector<MutableBytes>& parts, std::uint64_t offset,
                  const std::string& path) {
  thread_local std::vector<iovec> iov;  // kept: a reload makes thousands of these reads
  thread_local std::vector<std::byte> bounce;
  iov.clear();
  std::uint64_t pending = offset;  // where the parts in `iov` start in the file
  std::size_t i = 0;
  while (i < parts.size()) {
    // The next group: parts up to kBounceBytes in all (a larger part alone).
    std::size_t j = i, count = 0;
    std::uint64_t bytes = 0;
    for (; j < parts.size() && (j == i || bytes + parts[j].size <= kBounceBytes); ++j) {
      bytes += parts[j].size;
      count += parts[j].size > 0;
    }
    if (count > 1 && bytes < count * kSmallPart) {  // many small parts: one read, copies
      preadv_all(fd, iov, pending, path);           // (the direct parts before them)
      if (bounce.size() < kBounceBytes) bounce.resize(kBounceBytes);
      pread_exact(fd, bounce.data(), bytes, offset, path);
      const std::byte* from = bounce.data();
      for (std::size_t k = i; k < j; ++k) {
        if (parts[k].size > 0) std::memcpy(parts[k].data, from, parts[k].size);
        from += parts[k].size;
      }
      pending = offset + bytes;
    } else {
      for (std::size_t k = i; k < j; ++k)
        if (parts[k].size > 0) iov.push_back({parts[k].data, parts[k].size});
    }
    offset += bytes;
    i = j;
  }
  preadv_all(fd, iov, pending, path);
}

void check_split(const std::string& tensor, ByteRange range,
                 const std::vector<MutableBytes>& parts) {
  std::uint64_t total = 0;
  for (const MutableBytes& part : parts) total += part.size;
  if (total != range.length)
    raise<UsageError>("tensor '", tensor, "': split read of ", range.length,
                      " bytes into parts of ", total, " bytes");
}

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)) {
  std::string pattern = target_ + ".tmp.XXXXXX";
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0)
    raise<CheckpointError>("cannot create a temporary file for '", target_,
                           "': ", errno_text(errno));
  fd_ = FileDescriptor(fd);
  temp_ = pattern;
  if (::fchmod(fd, 0644) != 0)  // mkstemp makes 0600; checkpoints are shared read-only
    log().warn("cannot set the mode of '{}': {}", temp_, errno_text(errno));
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : target_(std::move(other.target_)),
      temp_(std::move(other.temp_)),
      fd_(std::move(other.fd_)),
      committed_(std::exchange(other.committed_, true)) {}

AtomicFile::~AtomicFile() {
  if (committed_ || temp_.empty()) return;
  fd_ = FileDescriptor();
  if (::unlink(temp_.c_str()) != 0 && errno != ENOENT)
    log().warn("cannot remove temporary file '{}': {}", temp_, errno_text(errno));
}

void AtomicFile::write(const void* data, std::uint64_t size) {
  const auto* in = static_cast<const char*>(data);
  std::uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_.get(), in + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      raise<CheckpointError>("write of ", size, " bytes to '", target_,
                             "' failed: ", errno_text(errno));
    done += static_cast<std::uint64_t>(n);
  }
}

void AtomicFile::close_fd() {
  if (fd_.get() >= 0 && ::fsync(fd_.get()) != 0)
    raise<CheckpointError>("fsync of '", target_, "' failed: ", errno_text(errno));
  fd_.close(temp_);
}

void AtomicFile::commit() {
  if (fd_.get() < 0) {  // written through another library: reopen to fsync
    fd_ = FileDescriptor(::open(temp_.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd_.get() < 0) raise<CheckpointError>("cannot reopen '", temp_, "': ", errno_text(errno));
  }
  close_fd();
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    raise<CheckpointError>("cannot rename '", temp_, "' to '", target_, "': ", errno_text(errno));
  committed_ = true;
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    raise<CheckpointError>("cannot stat '", path, "': ", errno_text(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> list_files(const std::string& dir, const std::string& suffix) {
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), &::closedir);
  if (!handle) raise<CheckpointError>("cannot list directory '", dir, "': ", errno_text(errno));
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(handle.get())) {
    const std::string name = entry->d_name;
    if (ends_with(name, suffix) && is_regular_file(join_path(dir, name))) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void make_directories(const std::string& dir) {
  if (dir.empty() || is_directory(dir)) return;
  const auto slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_directories(dir.substr(0, slash));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    raise<CheckpointError>("cannot create directory '", dir, "': ", errno_text(errno));
}

std::string read_text_file(const std::string& path) {
  const std::uint64_t size = file_size(path);
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) raise<CheckpointError>("cannot open '", path, "': ", errno_text(errno));
  std::string text(size, '\0');
  pread_exact(fd.get(), text.data(), size, 0, path);
  return text;
}

}  // namespace tpreload::detail
