// Internal: helpers shared by the writers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpreload/checkpoint/writers.h"

namespace tpreload::detail {

// Byte size of each spec; throws UsageError for an empty, reserved or duplicate
// name or a negative/overflowing shape. `path` names the output in errors.
std::vector<std::uint64_t> checked_specs(const std::vector<TensorSpec>& tensors,
                                         const std::string& path);

std::vector<TensorSpec> specs_from_memory(const std::vector<InMemoryTensor>& tensors);

// Copies each in-memory tensor's bytes (UsageError if their size is wrong). The
// returned callback refers to `tensors`, which must outlive it.
FillFn fill_from_memory(const std::vector<InMemoryTensor>& tensors);

}  // namespace tpreload::detail
