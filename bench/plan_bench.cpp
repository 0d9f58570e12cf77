// plan_bench: what planning a reload of a model at its real size costs, without
// its weights: the config read, the sharding rules built, the checkpoint's
// listing laid out (names, shapes, dtypes and offsets in 5 GB files, as a
// reader rank lists it), the plan made and one rank's writes resolved, each
// timed, with the process's peak resident memory after each. Built in:
// Kimi-K2's config.json as released (61 layers, 384 experts of 2048 over a
// hidden size of 7168, block FP8), at tp 8 with expert parallelism; or
// --config PATH. Prints one line per step and exits 1 when the plan and the
// resolved writes do not cover every tensor the listing holds.
//   build/bench/plan_bench [--config PATH] [--tp 8] [--no-ep] [--bucket-mib 512]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tpreload/model/config.h"
#include "tpreload/model/sharding.h"
#include "tpreload/model/synthetic_model.h"
#include "tpreload/reload/plan.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* kKimiK2 = R"({"architectures":["DeepseekV3ForCausalLM"],"attention_bias":false,
  "first_k_dense_replace":1,"hidden_act":"silu","hidden_size":7168,"intermediate_size":18432,
  "kv_lora_rank":512,"model_type":"kimi_k2","moe_intermediate_size":2048,"moe_layer_freq":1,
  "n_group":1,"n_routed_experts":384,"n_shared_experts":1,"norm_topk_prob":true,
  "num_attention_heads":64,"num_experts_per_tok":8,"num_hidden_layers":61,
  "num_key_value_heads":64,"num_nextn_predict_layers":0,"q_lora_rank":1536,
  "qk_nope_head_dim":128,"qk_rope_head_dim":64,"quantization_config":{
  "activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8",
  "weight_block_size":[128,128]},"rms_norm_eps":1e-06,"rope_scaling":{"beta_fast":1.0,
  "beta_slow":1.0,"factor":32.0,"mscale":1.0,"mscale_all_dim":1.0,
  "original_max_position_embeddings":4096,"type":"yarn"},"rope_theta":50000.0,
  "routed_scaling_factor":2.827,"scoring_func":"sigmoid","tie_word_embeddings":false,
  "topk_group":1,"topk_method":"noaux_tc","torch_dtype":"bfloat16","v_head_dim":128,
  "vocab_size":163840})";

double mib_peak() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // (KiB on Linux)
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void step(const char* what, Clock::time_point start, const std::string& detail) {
  std::printf("%-22s %8.3f s  peak RSS %8.1f MiB  %s\n", what, seconds_since(start), mib_peak(),
              detail.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tpreload;
  std::string config_path;
  int tp = 8;
  bool ep = true;
  std::uint64_t bucket_mib = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (a == "--tp" && i + 1 < argc) {
      tp = std::atoi(argv[++i]);
    } else if (a == "--no-ep") {
      ep = false;
    } else if (a == "--bucket-mib" && i + 1 < argc) {
      bucket_mib = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: plan_bench [--config PATH] [--tp N] [--no-ep] [--bucket-mib N]\n");
      return 2;
    }
  }
  std::printf("%-22s %8.1f MiB peak RSS before\n", "start", mib_peak());
  auto t = Clock::now();
  const ModelConfig config = config_path.empty() ? parse_model_config(kKimiK2, "Kimi-K2 (built in)")
                                                 : load_model_config(config_path);
  step("config", t, config.architecture);
  t = Clock::now();
  const ShardingRules rules(config, tp, "", ep && config.num_experts > 0);
  step("sharding rules", t,
       std::to_string(rules.params().size()) + " parameters per rank at tp " + std::to_string(tp) +
           (rules.expert_parallel() ? ", experts whole" : ""));
  t = Clock::now();
  SourceMetadata listing;
  listing.description = "a listing of 5 GB files (no weights)";
  std::uint64_t offset = 0, total = 0;
  int file = 1;
  for (const TensorSpec& spec : checkpoint_specs(config)) {
    TensorInfo info;
    info.name = spec.name;
    info.dtype = spec.dtype;
    info.shape = spec.shape;
    info.nbytes = dtype_size(spec.dtype);
    for (std::int64_t d : spec.shape) info.nbytes *= static_cast<std::uint64_t>(d);
    if (offset + info.nbytes > (std::uint64_t{5} << 30)) {
      ++file;
      offset = 0;
    }
    info.file = "model-" + std::to_string(file) + ".safetensors";
    info.file_offset = offset;
    offset += info.nbytes;
    total += info.nbytes;
    listing.tensors.push_back(std::move(info));
  }
  step("listing", t,
       std::to_string(listing.tensors.size()) + " tensors, " + std::to_string(total >> 30) +
           " GiB in " + std::to_string(file) + " files");
  PlanOptions options;
  options.world_size = tp;
  options.tp_size = tp;
  options.bucket_bytes = bucket_mib << 20;
  t = Clock::now();
  const Plan plan = make_plan(listing, rules, options);
  step("plan", t,
       std::to_string(plan.buckets.size()) + " buckets of " + std::to_string(bucket_mib) + " MiB");
  t = Clock::now();
  const std::vector<BucketApply> applies = resolve_applies(plan, listing, rules, options, 0);
  std::size_t writes = 0;
  for (const BucketApply& a : applies) writes += a.writes.size();
  step("rank 0's writes", t, std::to_string(writes) + " row writes");
  std::size_t planned = 0;
  for (const PlannedTensor& p : plan.tensors) planned += p.rejected ? 0 : 1;
  if (planned != listing.tensors.size() || writes == 0) {
    std::fprintf(stderr, "plan_bench: %zu of %zu tensors planned, %zu writes\n", planned,
                 listing.tensors.size(), writes);
    return 1;
  }
  return 0;
}
