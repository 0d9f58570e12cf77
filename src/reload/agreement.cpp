// What every rank of a reload must agree on before its first transfer, and the
// collective that checks it (agreement.h).
#include "agreement.h"

#include <string>
#include <string_view>
#include <vector>

#include "tpreload/comm/agreement.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/comm/memory.h"
#include "tpreload/core/dtype.h"
#include "tpreload/core/error.h"
#include "tpreload/core/fnv.h"
#include "tpreload/model/config.h"
#include "tpreload/model/sharding.h"
#include "tpreload/model/target.h"

namespace tpreload::detail {
namespace {

// How a parameter is split, as an error shows it.
const char* shard_kind_text(ShardKind kind) {
  switch (kind) {
    case ShardKind::kReplicated:
      return "replicated";
    case ShardKind::kColumn:
      return "column-parallel";
    case ShardKind::kRow:
      return "row-parallel";
    case ShardKind::kVocab:
      return "vocab-parallel";
    case ShardKind::kExpertGateUp:
      return "experts' gate/up";
    case ShardKind::kExpertDown:
      return "experts' down";
    case ShardKind::kHeads:
      return "split by heads";
  }
  return "?";
}

// What must be identical on every rank, each part hashed on its own so that a
// disagreement can be named: the fields of the model's config that shape the
// weights (config_fields; those only a forward pass reads change no byte a
// reload writes, and are the serving engine's to agree on), the
// rest of the parameter layout (quantization, LoRA, expert parallelism, and per
// parameter its shape, dtype, kind, layer and stacked shards), the data plane,
// whose transfers every rank must post alike, and every option that changes
// the plan or the sequence of collectives.
std::vector<AgreedValue> agreement_parts(const ReloadTarget& model, const ReloadOptions& o,
                                         const DataTransport& data) {
  std::vector<AgreedValue> parts;
  for (const ConfigField& f : config_fields(model.rules().config()))
    if (f.weights) parts.emplace_back("the model config's " + f.name, f.value);
  const ShardingRules& rules = model.rules();
  parts.insert(
      parts.end(),
      {{"the quantization", rules.quantization().empty() ? std::string_view("none")
                                                         : std::string_view(rules.quantization())},
       {"LoRA", model.lora()},
       {"expert parallelism", rules.expert_parallel()},
       {"whether the family's derived parameters are held", rules.holds_derived()}});
  std::uint64_t layout = kFnvOffsetBasis;
  for (const ParamSpec& p : rules.params()) {
    layout = fnv1a_word(layout, p.name);
    for (auto d : p.shape) layout = fnv1a_word(layout, static_cast<std::uint64_t>(d));
    layout = fnv1a_word(fnv1a_word(fnv1a_word(layout, static_cast<std::uint64_t>(p.dtype)),
                                   static_cast<std::uint64_t>(p.kind)),
                        static_cast<std::uint64_t>(p.layer));
    layout = fnv1a_word(layout, static_cast<std::uint64_t>(p.shards));
  }
  // (each parameter's text, built only where the hashes differ, holds all of it)
  parts.push_back(AgreedValue::opaque_hash(
      "the model's parameters (names, shapes, dtypes, splits, layers, shards)", layout,
      [&rules] {
        std::vector<std::string> items;
        for (const ParamSpec& p : rules.params())
          items.push_back(detail::concat(
              p.name, " ", shape_string(p.shape), " ", dtype_name(p.dtype), ", ",
              shard_kind_text(p.kind), ", ",
              p.layer < 0 ? std::string("outside the layers") : detail::concat("layer ", p.layer),
              ", ", p.shards, p.shards == 1 ? " shard" : " shards"));
        return items;
      },
      "parameter"));
  parts.insert(parts.end(),
               {{"the tp size", model.rules().tp_size()},
                {"the data plane (transport, memory space)",
                 data.backend() + ", " + std::string(memory_kind_name(data.memory()))},
                {"the format", format_name(o.format)},
                {"the distribution", distribution_name(o.distribution)},
                {"the bucket size", o.bucket_bytes},
                {"the scattered replicated bytes", o.scatter_replicated_bytes},
                {"the reader rank", o.reader_rank},
                {"the readers", readers_name(o.readers)},
                {"the ranks per node", o.ranks_per_node},
                {"the broadcast roots (rotated or not)", o.rotate_broadcast_roots},
                {"zero-copy", o.zero_copy},
                {"atomic", o.atomic},
                {"require-complete", o.require_complete},
                {"checksums", o.checksums},
                // (explicit depths may differ: only the automatic choice is collective)
                {"whether the pipeline depth is chosen per rank", o.pipeline_depth == 0},
                {"compare-replicas", o.compare_replicas},
                {"the serving ranks", o.serving_ranks}});
  return parts;
}

}  // namespace

std::int64_t check_ranks_agree(Communicator& world, const ReloadTarget& model,
                               const ReloadOptions& options, const DataTransport& data) {
  const auto parts = agreement_parts(model, options, data);
  agree_on_values<UsageError>(world, parts,
                              " (every rank must pass the same); nothing was reloaded");
  std::uint64_t all = kFnvOffsetBasis;
  for (const AgreedValue& part : parts) all = fnv1a_word(all, part.value);
  return static_cast<std::int64_t>(all >> 1);
}

}  // namespace tpreload::detail
