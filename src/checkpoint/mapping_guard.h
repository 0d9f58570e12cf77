// Reads through a file mapping that the file no longer backs (the file was cut
// short, or its storage failed, after it was mapped) raise SIGBUS, which would
// kill the process in the middle of a collective. While a mapping is registered
// here, a SIGBUS inside it maps a page of zeros over the faulting page (so the
// read completes) and counts the fault; the owner asks faults() after its reads
// and turns a count into a CheckpointError naming the file. A SIGBUS anywhere
// else goes to the handler that was there before (a crash stays a crash).
// Internal to the checkpoint layer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tpreload::detail {

class MappingGuard {
 public:
  MappingGuard() = default;
  // Registers [data, data + size); the first registration of the process installs
  // the SIGBUS handler (the previous one is kept and called for faults outside
  // registered mappings; install MPI's and others' before the first mapping, as
  // the programs do by initialising MPI first).
  MappingGuard(const std::byte* data, std::uint64_t size);
  MappingGuard(MappingGuard&& other) noexcept;
  MappingGuard& operator=(MappingGuard&& other) noexcept;
  MappingGuard(const MappingGuard&) = delete;
  MappingGuard& operator=(const MappingGuard&) = delete;
  ~MappingGuard();

  // Pages of the mapping that faulted and now read as zeros.
  std::uint64_t faults() const;

  // Mappings that can be registered at once (a registration beyond them is
  // refused with CheckpointError).
  static constexpr int kSlots = 4096;

 private:
  void release() noexcept;
  int slot_ = -1;
};

}  // namespace tpreload::detail
