// Internal helpers of the checkpoint layer: move-only owners of file descriptors,
// read-only memory mappings and temporary files, plus small path utilities.
// Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mapping_guard.h"
#include "tpreload/core/span.h"

namespace tpreload::detail {

// Owns one POSIX file descriptor; closes it on destruction.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Close now and report failure (throws CheckpointError naming `path`).
  void close(const std::string& path);

 private:
  int fd_ = -1;
};

// A whole file mapped read-only (PROT_READ, MAP_PRIVATE). Mapping costs no I/O:
// pages are read only when touched. Unmaps on destruction.
class MappedFile {
 public:
  // Throws CheckpointError naming `path` if it cannot be opened or mapped.
  static MappedFile open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  // Pages that faulted under the mapping (the file was cut short or its storage
  // failed after open) and read as zeros instead of ending the process.
  std::uint64_t faults() const { return guard_.faults(); }
  // CheckpointError naming the file when any page faulted or the file is now
  // shorter than when it was mapped (bytes past the new end of its last page
  // read as zeros without a fault).
  void check_intact() const;

 private:
  std::string path_;
  FileDescriptor fd_;
  MappingGuard guard_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// Read exactly `size` bytes at `offset` with pread. Throws CheckpointError naming
// `path` on a short read or an I/O error.
void pread_exact(int fd, void* dst, std::uint64_t size, std::uint64_t offset,
                 const std::string& path);

// The bytes from `offset` on, split in order over `parts` (preadv, IOV_MAX parts
// per call). Throws CheckpointError naming `path` on a failed or short read.
void preadv_exact(int fd, const std::vector<MutableBytes>& parts, std::uint64_t offset,
                  const std::string& path);

// Throws UsageError unless the sizes of `parts` add up to range.length.
void check_split(const std::string& tensor, ByteRange range,
                 const std::vector<MutableBytes>& parts);

// A file written under a temporary name in the target's directory and renamed onto
// the target by commit(). Destroying it uncommitted removes the temporary, so a
// failed write leaves nothing behind.
class AtomicFile {
 public:
  // Creates `<target>.tmp.XXXXXX`; throws CheckpointError on failure.
  explicit AtomicFile(std::string target);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  const std::string& temp_path() const { return temp_; }
  const std::string& target() const { return target_; }
  int fd() const { return fd_.get(); }

  // Append bytes; throws CheckpointError naming the target on failure.
  void write(const void* data, std::uint64_t size);
  // Close the descriptor (flushing to disk) without renaming; used by writers that
  // reopen the temporary through another library (HDF5).
  void close_fd();
  // fsync, close and rename onto the target. Throws CheckpointError on failure.
  void commit();

 private:
  std::string target_;
  std::string temp_;
  FileDescriptor fd_;
  bool committed_ = false;
};

// Filesystem helpers (throwing CheckpointError where noted).
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
bool is_regular_file(const std::string& path);
std::uint64_t file_size(const std::string& path);  // throws
std::string join_path(const std::string& dir, const std::string& name);
bool ends_with(const std::string& s, const std::string& suffix);
// Plain file names in `dir` ending in `suffix`, sorted. Throws if unreadable.
std::vector<std::string> list_files(const std::string& dir, const std::string& suffix);
// Create `dir` (and parents) if missing. Throws CheckpointError on failure.
void make_directories(const std::string& dir);
// Whole text file. Throws CheckpointError naming `path`.
std::string read_text_file(const std::string& path);

}  // namespace tpreload::detail
