#include "tpreload/model/kernel_shards.h"

#include <ATen/ATen.h>

#include <cstring>
#include <memory>

#include "tpreload/checkpoint/kernel_format.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/model.h"

namespace tpreload {
namespace {

// Loads rank r's model on first use and keeps it while the writer fills rank r.
class RankModels {
 public:
  RankModels(const ModelConfig& config, WeightSource& source, const ShardOptions& options)
      : config_(config), source_(source), options_(options) {}

  const TensorParallelModel& at_rank(int rank) {
    if (model_ && model_->options().tp_rank == rank) return *model_;
    ModelOptions o;
    o.tp_size = options_.tp_size;
    o.tp_rank = rank;
    o.quantization = options_.quantization;
    o.expert_parallel = options_.expert_parallel;
    model_.reset();  // one rank in memory at a time
    model_ = std::make_unique<TensorParallelModel>(config_, o);
    std::set<std::string> skipped;
    const auto loaded = model_->load_weights(source_, &skipped);
    for (const auto& name : model_->expected_names(WeightFormat::kCheckpoint))
      if (!loaded.count(name))
        raise<ValidationError>("cannot shard '", source_.describe(), "': parameter '", name,
                               "' of tp rank ", rank, " was not loaded (a tensor is missing)");
    log().info("sharded tp rank {} of {} ({} source tensors skipped)", rank, options_.tp_size,
               skipped.size());
    return *model_;
  }

 private:
  const ModelConfig& config_;
  WeightSource& source_;
  const ShardOptions& options_;
  std::unique_ptr<TensorParallelModel> model_;
};

}  // namespace

void write_kernel_shards(const ModelConfig& config, WeightSource& source,
                         const std::string& out_dir, const ShardOptions& options) {
  const ShardingRules rules(config, options.tp_size, options.quantization, options.expert_parallel);
  std::vector<TensorSpec> specs;
  for (const ParamSpec& p : rules.params()) specs.push_back({p.name, p.dtype, p.shape});
  const std::vector<std::vector<TensorSpec>> per_rank(options.tp_size, specs);
  RankModels models(config, source, options);
  const KernelFormatInfo info{options.tp_size, config.dtype, options.quantization, config.json,
                              options.expert_parallel};
  write_kernel_format(out_dir, info, per_rank, [&](int rank, std::size_t index, MutableBytes dst) {
    const at::Tensor t = models.at_rank(rank).parameter_for_reload(specs[index].name).contiguous();
    const ConstBytes bytes = tensor_bytes(t);
    if (bytes.size != dst.size)
      raise<ModelError>("parameter '", specs[index].name, "' holds ", bytes.size,
                        " bytes, the shard expects ", dst.size);
    std::memcpy(dst.data, bytes.data, bytes.size);
  });
}

}  // namespace tpreload
