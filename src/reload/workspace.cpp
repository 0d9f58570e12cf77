#include "tpreload/reload/workspace.h"

#include "pipeline.h"

namespace tpreload {

ReloadWorkspace::ReloadWorkspace() = default;
ReloadWorkspace::~ReloadWorkspace() = default;
ReloadWorkspace::ReloadWorkspace(ReloadWorkspace&&) noexcept = default;
ReloadWorkspace& ReloadWorkspace::operator=(ReloadWorkspace&&) noexcept = default;

void ReloadWorkspace::release() {
  buffers_.clear();
  plan_.reset();
  nodes_.reset();
}

void ReloadWorkspace::abandon_buffers() {
  for (Kept& k : buffers_) k.buffer.release();
  buffers_.clear();
}

std::uint64_t ReloadWorkspace::cached_plan_key() const {
  return plan_ ? plan_->key : 0;
}

std::shared_ptr<const KnownListing> ReloadWorkspace::known_listing() const {
  return plan_ ? plan_->known : nullptr;
}

void ReloadWorkspace::keep_known_listing(std::shared_ptr<const KnownListing> known) {
  if (plan_) plan_->known = std::move(known);
}

void ReloadWorkspace::keep_plan(std::unique_ptr<detail::CachedPlan> plan) {
  plan_ = std::move(plan);
}

void ReloadWorkspace::keep_node_planes(std::unique_ptr<detail::NodePlanes> planes) {
  nodes_ = std::move(planes);
}

std::uint64_t ReloadWorkspace::bytes(MemoryKind kind) const {
  std::uint64_t total = 0;
  for (const Kept& k : buffers_)
    if (k.buffer.kind() == kind) total += k.buffer.size();
  return total;
}

std::uint64_t ReloadWorkspace::bytes() const {
  std::uint64_t total = 0;
  for (const Kept& k : buffers_) total += k.buffer.size();
  return total;
}

std::byte* ReloadWorkspace::buffer(std::size_t index, std::uint64_t size, Allocator& allocator) {
  if (buffers_.size() <= index) buffers_.resize(index + 1);
  Kept& k = buffers_[index];
  if (k.buffer.size() < size || (k.buffer && k.from != &allocator)) {
    k.buffer.reset();  // free before allocating: never hold both
    k.buffer = allocator.allocate(size);
    k.from = &allocator;
  }
  return k.buffer.data();
}

}  // namespace tpreload
