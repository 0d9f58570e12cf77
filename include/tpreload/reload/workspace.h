// What a reload keeps for the next one (ReloadWorkspace). No torch here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tpreload/comm/memory.h"

namespace tpreload {

class KnownListing;

namespace detail {
struct CachedPlan;
struct NodePlanes;
}  // namespace detail

// What a reload keeps for the next one:
//  - staging buffers, in the memory space each role needs (pageable or pinned
//    host, device), so that a reload does not pay for fresh pages (first-touch
//    faults made a 10 MB bucket 10x slower than the transport): at most
//    pipeline depth x (send + receive, plus a pinned read buffer when the
//    transport moves device memory, plus a device apply buffer when the
//    parameters are on a device and the transport is not) buckets;
//  - the last plan: the tensor list, the buckets, the preflight verdict and every
//    bucket's resolved writes. The next reload reuses it when every rank holds a
//    plan for the same listing (a 64-bit hash of the reader's serialized metadata,
//    the model layout and the options), which spares a checkpoint of 20,000 small
//    tensors its per-reload metadata exchange, planning and preflight;
//  - with Readers::kNode, the communicator and data transport of this rank's node.
// release() frees all of them. Not thread-safe: one reload at a time per workspace.
class ReloadWorkspace {
 public:
  ReloadWorkspace();
  ~ReloadWorkspace();
  ReloadWorkspace(ReloadWorkspace&&) noexcept;
  ReloadWorkspace& operator=(ReloadWorkspace&&) noexcept;

  // Staging bytes held, in one memory space or in all.
  std::uint64_t bytes(MemoryKind kind) const;
  std::uint64_t bytes() const;
  void release();
  // Forget the staging buffers without freeing them (they leak): for buffers
  // that device work which never finished may still read or write.
  void abandon_buffers();

  // A buffer of at least `size` bytes for staging role `index`, from `allocator`.
  // Kept while it is large enough and came from that allocator (the same memory
  // space of the same device: a model moved to another GPU gets buffers there);
  // otherwise freed first, then allocated again (never both at once). Throws as
  // the allocator does.
  std::byte* buffer(std::size_t index, std::uint64_t size, Allocator& allocator);

  // The plan kept by the last reload (null when none); replaced by keep_plan().
  // Its key (0 when none) names the listing, model and options it was made for.
  const detail::CachedPlan* cached_plan() const { return plan_.get(); }
  std::uint64_t cached_plan_key() const;
  void keep_plan(std::unique_ptr<detail::CachedPlan> plan);
  // On a rank that opened the source: the kept plan's source listing, for the
  // next open of the same files to take instead of parsing them
  // (open_weight_source(path, workspace.known_listing())); null when none.
  // The plan keeps it, with the files' raw headers, as long as it is kept.
  std::shared_ptr<const KnownListing> known_listing() const;
  // Makes `known` the kept plan's source listing: one that lists exactly as the
  // plan's metadata (a newer open of files whose bytes changed but not their
  // listing). Nothing without a kept plan.
  void keep_known_listing(std::shared_ptr<const KnownListing> known);

  // Readers::kNode: the node's control and data planes (null when none).
  detail::NodePlanes* node_planes() const { return nodes_.get(); }
  void keep_node_planes(std::unique_ptr<detail::NodePlanes> planes);

 private:
  struct Kept {
    Buffer buffer;
    const Allocator* from = nullptr;
  };
  std::vector<Kept> buffers_;
  std::unique_ptr<detail::CachedPlan> plan_;
  std::unique_ptr<detail::NodePlanes> nodes_;
};

}  // namespace tpreload
