// The reliability matrix of docs/RELIABILITY.md: bad input and faults, each a
// row that reloads version 2 over version 1 at every world size it runs at, in
// the default mode and in atomic mode. Each row asserts the error (its class,
// its text the same on every rank, what it must name) and the model afterwards:
// unchanged (refused before any write, and every failing row in atomic mode), or
// changed only in parameters the error names. The rows that end the job (a stalled
// reader, a rank that exits, a failed transfer) are DISABLED_ here and run by
// mpi_tests/CMakeLists.txt, which checks the job's end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <thread>

#include "../tests/support/faults.h"
#include "../tests/support/tiny_models.h"
#include "mpi_test_main.h"
#include "tpreload/checkpoint/kernel_format.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/model.h"
#include "tpreload/reload/reload.h"

namespace tpreload {
namespace {

TPRELOAD_TINY_MODEL_WORLD_SIZES();

using mpitest::same_on_every_rank;
using mpitest::SharedDir;
using mpitest::world;
using testing::FaultyCommunicator;
using testing::FaultySource;
using testing::FaultyTransport;
namespace fs = std::filesystem;

const char* const kLast = "model.layers.1.mlp.down_proj.weight";  // in the last layer

struct Versions {
  ModelConfig config = testdata::tiny_config("llama_gqa");
  std::map<std::string, at::Tensor> v1 = testdata::random_checkpoint(config, 901);
  std::map<std::string, at::Tensor> v2 = testdata::random_checkpoint(config, 902);
};

ModelOptions on_this_rank(int tp) {
  ModelOptions o;
  o.tp_size = tp;
  o.tp_rank = world().rank() % tp;
  return o;
}

// What happened to one reload, seen by this rank.
struct Outcome {
  std::string kind;  // "" (no error), "CheckpointError", "ValidationError", ...
  std::string error;
  ReloadResult result;
};

template <typename F>
Outcome run(F&& reload) {
  Outcome out;
  try {
    out.result = reload();
  } catch (const CheckpointError& e) {
    out = {"CheckpointError", e.what(), {}};
  } catch (const ValidationError& e) {
    out = {"ValidationError", e.what(), {}};
  } catch (const UsageError& e) {
    out = {"UsageError", e.what(), {}};
  } catch (const CommError& e) {
    out = {"CommError", e.what(), {}};
  } catch (const ModelError& e) {
    out = {"ModelError", e.what(), {}};
  }
  return out;
}

// Parameters of this rank whose bytes are not `want`'s shard.
std::vector<std::string> differing(const TensorParallelModel& m, const ModelConfig& config,
                                   const std::map<std::string, at::Tensor>& want, int tp) {
  std::vector<std::string> out;
  for (const auto& [name, t] : testdata::expected_shards(config, want, tp, world().rank() % tp))
    if (!testdata::same_bytes(m.parameter_for_reload(name), t)) out.push_back(name);
  return out;
}

enum class State {
  kUnchanged,     // every parameter still version 1
  kNamed,         // parameters that changed are named in the error
  kNamedChanged,  // the same, and some rank's parameters changed (earlier buckets applied)
  kAllNew,        // every parameter version 2 (no error)
  kAllNewButOne,  // every parameter version 2 except kLast, which is version 1
};

struct Row {
  std::string name;
  // Rank 0 writes what the row reloads from into `dir`; every rank returns the path.
  std::function<std::string(const std::string& dir, const Versions& v, int tp)> prepare;
  std::function<void(ReloadOptions&)> options = [](ReloadOptions&) {};
  std::string kind;      // the error class expected, "" for none
  std::string fragment;  // text the error must contain (may hold {dir})
  State state = State::kUnchanged;
  // Instead of reloading from the path: a source the row builds on the reader.
  std::function<std::unique_ptr<WeightSource>(const std::string& path)> wrap;
  // A config of this rank's own (a row where ranks differ).
  std::function<ModelConfig(const ModelConfig&)> config_of;
};

std::string write_checkpoint(const std::string& path, const std::map<std::string, at::Tensor>& t) {
  if (world().rank() == 0) write_safetensors(path, testdata::in_memory(t));
  return path;
}

std::string write_kernel(const std::string& dir, const ModelConfig& config,
                         const std::map<std::string, at::Tensor>& t, int tp) {
  if (world().rank() == 0) {
    auto source = testdata::memory_source(t);
    write_kernel_shards(config, *source, dir, {tp, "", false});
  }
  return dir;
}

void cut(const std::string& path, double fraction) {
  if (world().rank() != 0) return;
  const auto size = fs::file_size(path);
  fs::resize_file(path, static_cast<std::uintmax_t>(static_cast<double>(size) * fraction));
}

void write_bytes(const std::string& path, const std::string& bytes) {
  if (world().rank() == 0) std::ofstream(path, std::ios::binary) << bytes;
}

// A caller's source whose check of its mapped reads after the transfer throws
// something that is not a CheckpointError (it may throw anything). The reader
// thread's checks after each bucket pass: only the reload's own thread, the one
// that made the source, checks after the transfer.
class MappingCheckThrows final : public WeightSource {
 public:
  explicit MappingCheckThrows(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}
  std::string describe() const override { return inner_->describe(); }
  const std::vector<TensorInfo>& tensors() const override { return inner_->tensors(); }
  std::optional<ConstBytes> view(std::size_t i, ByteRange r) override { return inner_->view(i, r); }
  void read(std::size_t i, ByteRange r, MutableBytes dst) override { inner_->read(i, r, dst); }
  std::uint64_t bytes_read() const override { return inner_->bytes_read(); }
  const std::map<std::string, std::string>& metadata() const override { return inner_->metadata(); }
  void check_mapped_reads() const override {
    if (std::this_thread::get_id() == made_on_)
      throw std::runtime_error("the caller's mapping went away");
  }

 private:
  std::unique_ptr<WeightSource> inner_;
  std::thread::id made_on_ = std::this_thread::get_id();
};

// A row whose ranks hold configs that differ in a setting only a forward pass
// reads (`config_of`): no byte a reload writes depends on it, so the ranks do
// not compare it (the serving engine agrees on its own settings) and the
// reload completes.
Row forward_setting_differs(std::string name,
                            std::function<ModelConfig(const ModelConfig&)> config_of) {
  Row row;
  row.name = std::move(name);
  row.prepare = [](const std::string& d, const Versions& v, int) {
    return write_checkpoint(d + "/m.safetensors", v.v2);
  };
  row.state = State::kAllNew;
  row.config_of = std::move(config_of);
  return row;
}

// A row whose last rank's config is `base` then `edit` of the shared one, the
// other ranks' `base` of it alone.
Row last_rank_differs(
    std::string name, std::function<void(ModelConfig&)> edit,
    std::function<void(ModelConfig&)> base = [](ModelConfig&) {}) {
  return forward_setting_differs(std::move(name), [edit, base](const ModelConfig& c) {
    ModelConfig mine = c;
    base(mine);
    if (world().rank() == world().size() - 1) edit(mine);
    return mine;
  });
}

std::vector<Row> rows() {
  auto kernel = [](ReloadOptions& o) { o.format = WeightFormat::kKernel; };
  return {
      {"missing tensor (default: reported, the rest reloaded)",
       [](const std::string& d, const Versions& v, int) {
         auto t = v.v2;
         t.erase(kLast);
         return write_checkpoint(d + "/m.safetensors", t);
       },
       [](ReloadOptions&) {}, "", "", State::kAllNewButOne},
      {"missing tensor with require_complete",
       [](const std::string& d, const Versions& v, int) {
         auto t = v.v2;
         t.erase(kLast);
         return write_checkpoint(d + "/m.safetensors", t);
       },
       [](ReloadOptions& o) { o.require_complete = true; }, "ValidationError", kLast},
      {"extra tensor (skipped and reported)",
       [](const std::string& d, const Versions& v, int) {
         auto t = v.v2;
         t["model.layers.9.mlp.extra.weight"] = at::ones({4}, at::kBFloat16);
         return write_checkpoint(d + "/m.safetensors", t);
       },
       [](ReloadOptions&) {}, "", "", State::kAllNew},
      {"wrong shape in the last layer",
       [](const std::string& d, const Versions& v, int) {
         auto t = v.v2;
         t[kLast] = t[kLast].t().contiguous();
         return write_checkpoint(d + "/m.safetensors", t);
       },
       [](ReloadOptions&) {}, "ValidationError", kLast},
      {"wrong dtype",
       [](const std::string& d, const Versions& v, int) {
         auto t = v.v2;
         t[kLast] = t[kLast].to(at::kInt);
         return write_checkpoint(d + "/m.safetensors", t);
       },
       [](ReloadOptions&) {}, "ValidationError", kLast},
      {"truncated file at open",
       [](const std::string& d, const Versions& v, int) {
         const std::string p = write_checkpoint(d + "/m.safetensors", v.v2);
         cut(p, 0.5);
         return p;
       },
       [](ReloadOptions&) {}, "CheckpointError", "{dir}/m.safetensors"},
      {"rank files swapped",
       [](const std::string& d, const Versions& v, int tp) {
         const std::string k = write_kernel(d + "/k", v.config, v.v2, tp);
         if (world().rank() == 0) {
           const std::string a = k + "/" + kernel_format_shard_name(0, tp),
                             b = k + "/" + kernel_format_shard_name(1, tp);
           fs::rename(a, k + "/tmp");
           fs::rename(b, a);
           fs::rename(k + "/tmp", b);
         }
         return k;
       },
       kernel, "CheckpointError", "holds tp rank '1' of tp size"},
      {"kernel shards for another tp size",
       [](const std::string& d, const Versions& v, int tp) {
         return write_kernel(d + "/k", v.config, v.v2, tp == 1 ? 2 : tp / 2);
       },
       kernel, "ValidationError", "was made for tp "},
      {"kernel shards for another config",
       [](const std::string& d, const Versions& v, int tp) {
         ModelConfig other = v.config;  // (a family of Llama's layout: the same shards)
         other.architecture = "MistralForCausalLM";
         other.json = model_config_to_json(other);
         return write_kernel(d + "/k", other, v.v2, tp);
       },
       kernel, "ValidationError", "was made for another model"},
      {"missing rank file",
       [](const std::string& d, const Versions& v, int tp) {
         const std::string k = write_kernel(d + "/k", v.config, v.v2, tp);
         if (world().rank() == 0) fs::remove(k + "/" + kernel_format_shard_name(tp - 1, tp));
         return k;
       },
       kernel, "CheckpointError", "is missing"},
      {"empty checkpoint (nothing to load: reported)",
       [](const std::string& d, const Versions&, int) {
         return write_checkpoint(d + "/m.safetensors", {});
       },
       [](ReloadOptions&) {}, "", "", State::kUnchanged},
      {"empty header",
       [](const std::string& d, const Versions&, int) {
         write_bytes(d + "/m.safetensors", std::string(8, '\0'));
         return d + "/m.safetensors";
       },
       [](ReloadOptions&) {}, "CheckpointError", "{dir}/m.safetensors"},
      {"a path that does not exist",
       [](const std::string& d, const Versions&, int) { return d + "/nowhere"; },
       [](ReloadOptions&) {}, "CheckpointError", "{dir}/nowhere"},
      {"a file that is not HDF5",
       [](const std::string& d, const Versions&, int) {
         write_bytes(d + "/m.h5", "this is not an HDF5 file at all");
         return d + "/m.h5";
       },
       [](ReloadOptions&) {}, "CheckpointError", "{dir}/m.h5"},
      {"a truncated HDF5 file",
       [](const std::string& d, const Versions& v, int) {
         if (world().rank() == 0) {
           const auto t = testdata::in_memory(v.v2);
           std::vector<TensorSpec> specs;
           for (const auto& x : t) specs.push_back({x.name, x.dtype, x.shape});
           write_hdf5(d + "/m.h5", specs, [&](std::size_t i, MutableBytes dst) {
             std::memcpy(dst.data, t[i].bytes.data, dst.size);
           });
         }
         cut(d + "/m.h5", 0.6);
         return d + "/m.h5";
       },
       [](ReloadOptions&) {}, "CheckpointError", "{dir}/m.h5", State::kNamed},
      {"reader I/O error half-way",
       [](const std::string& d, const Versions& v, int) {
         return write_checkpoint(d + "/m.safetensors", v.v2);
       },
       [](ReloadOptions& o) { o.bucket_bytes = 4096; }, "CheckpointError",
       "injected I/O error after", State::kNamedChanged,
       [](const std::string& path) {
         auto inner = open_weight_source(path);
         std::uint64_t total = 0;
         for (const auto& t : inner->tensors()) total += t.nbytes;
         return std::unique_ptr<WeightSource>(std::make_unique<FaultySource>(
             std::move(inner), total / 2, FaultySource::Fault::kFail));
       }},
      {"a caller's source failing its mapped-reads check with any exception",
       [](const std::string& d, const Versions& v, int) {
         return write_checkpoint(d + "/m.safetensors", v.v2);
       },
       [](ReloadOptions&) {}, "CheckpointError", "reading the checkpoint failed on rank 0/",
       State::kNamedChanged,
       [](const std::string& path) {
         return std::unique_ptr<WeightSource>(
             std::make_unique<MappingCheckThrows>(open_weight_source(path)));
       }},
      last_rank_differs("a config whose rope_theta differs between ranks",
                        [](ModelConfig& c) { c.rope_theta = 500000.0; }),
      forward_setting_differs(
          "a config whose rope scaling differs between ranks",
          [](const ModelConfig& c) {
            // The last rank's low_freq_factor is 2, the others' 1.
            const bool last = world().rank() == world().size() - 1;
            std::string text = c.json;
            text.insert(text.rfind('}'),
                        std::string(R"(,"rope_scaling":{"rope_type":"llama3","factor":8.0,)") +
                            R"("low_freq_factor":)" + (last ? "2.0" : "1.0") +
                            R"(,"high_freq_factor":4.0,"original_max_position_embeddings":64})");
            return parse_model_config(text, "config.json");
          }),
      last_rank_differs("a config whose partial_rotary_factor differs between ranks",
                        [](ModelConfig& c) { c.partial_rotary_factor = 0.5; }),
      last_rank_differs("a config whose MLP activation differs between ranks",
                        [](ModelConfig& c) { c.activation = Activation::kGelu; }),
      last_rank_differs(
          "a config whose sliding layers differ between ranks",
          [](ModelConfig& c) { c.sliding_layers = {1}; },
          [](ModelConfig& c) {
            c.sliding_window = 4;
            c.sliding_layers = {0};
          }),
      last_rank_differs(
          "a config whose sliding layers' rotary base differs between ranks",
          [](ModelConfig& c) { c.sliding_rope_theta = 20000.0; },
          [](ModelConfig& c) {
            c.sliding_window = 4;
            c.sliding_layers = {0};
            c.sliding_rope_theta = 10000.0;
          }),
      last_rank_differs(
          "a config whose sliding layers' rope scaling differs between ranks",
          [](ModelConfig& c) {
            c.sliding_rope_scaling.type = "linear";
            c.sliding_rope_scaling.factor = 2;
            c.sliding_rope_scaling.json = R"({"factor":2.0,"rope_type":"linear"})";
          },
          [](ModelConfig& c) {
            c.sliding_window = 4;
            c.sliding_layers = {0};
            c.sliding_rope_theta = 10000.0;
          }),
      last_rank_differs("a config whose embedding multiplier differs between ranks (Granite)",
                        [](ModelConfig& c) { c.embedding_multiplier = 12; }),
      last_rank_differs("a config whose attention multiplier differs between ranks (Granite)",
                        [](ModelConfig& c) { c.attention_multiplier = 0.25; }),
      last_rank_differs("a config whose residual multiplier differs between ranks (Granite)",
                        [](ModelConfig& c) { c.residual_multiplier = 0.5; }),
      last_rank_differs("a config whose logits scaling differs between ranks (Granite)",
                        [](ModelConfig& c) { c.logits_scaling = 8; }),
  };
}

void run_row(const Row& row, bool atomic) {
  const Versions v;
  const int tp = world().size();
  SharedDir dir;
  const std::string path = row.prepare(dir.path(), v, tp);
  world().barrier();
  const ModelConfig config = row.config_of ? row.config_of(v.config) : v.config;
  TensorParallelModel model(config, on_this_rank(tp));
  model.load_weights(*testdata::memory_source(v.v1));  // locally: no collective before the row's
  ReloadOptions o;
  row.options(o);
  o.atomic = atomic;
  const std::string what = row.name + (atomic ? " [atomic]" : "");
  ReloadableModel served(model, {"(v1 in memory)", "", ""});
  std::vector<std::string> possibly_mixed;  // what the callbacks were told after a failure
  served.on_reloaded([&](const ReloadResult& r) {
    if (!r.error.empty()) possibly_mixed = r.possibly_mixed;
  });
  Outcome out;
  if (row.wrap) {
    std::unique_ptr<WeightSource> source;
    if (world().rank() == 0) source = row.wrap(path);
    out = run([&] { return served.reload_from(world(), o, source.get()); });
  } else {
    out = run([&] { return served.reload(world(), o, path); });
  }
  EXPECT_EQ(out.kind, row.kind) << what << ": " << out.error;
  EXPECT_TRUE(same_on_every_rank(out.kind + out.error)) << what << ": " << out.error;
  std::string fragment = row.fragment;
  if (const auto at = fragment.find("{dir}"); at != std::string::npos)
    fragment.replace(at, 5, dir.path());
  if (!row.kind.empty()) {
    EXPECT_NE(out.error.find(fragment), std::string::npos)
        << what << ": the error does not name '" << fragment << "': " << out.error;
  }
  const auto not_v1 = differing(model, v.config, v.v1, tp);
  const auto not_v2 = differing(model, v.config, v.v2, tp);
  const State state = atomic && !row.kind.empty() ? State::kUnchanged : row.state;
  switch (state) {
    case State::kUnchanged:
      EXPECT_TRUE(not_v1.empty()) << what << ": '" << not_v1.front() << "' changed";
      break;
    case State::kNamedChanged: {
      // The buckets before the failure were applied: a failure that stopped
      // the reload before any write would pass kNamed with nothing to check.
      std::int64_t changed = not_v1.empty() ? 0 : 1;
      world().allreduce_ints(&changed, 1, IntOp::kMax);
      EXPECT_EQ(changed, 1) << what << ": no rank's parameters changed before the failure";
    }
      [[fallthrough]];
    case State::kNamed:
      // The error says how many may be mixed and names the first; the callbacks
      // get this rank's whole list.
      if (!not_v1.empty()) {
        EXPECT_NE(out.error.find(" may hold a mix of old and new weights: "), std::string::npos)
            << what << ": " << out.error;
      }
      for (const auto& name : not_v1)
        EXPECT_EQ(std::count(possibly_mixed.begin(), possibly_mixed.end(), name), 1)
            << what << ": '" << name << "' changed but is not among the possibly mixed";
      break;
    case State::kAllNew:
      EXPECT_TRUE(not_v2.empty()) << what << ": '" << not_v2.front() << "' is not version 2";
      EXPECT_TRUE(out.result.complete()) << what;
      break;
    case State::kAllNewButOne:
      EXPECT_EQ(not_v2, std::vector<std::string>{kLast}) << what;
      EXPECT_EQ(std::count(not_v1.begin(), not_v1.end(), kLast), 0) << what << ": kept version 1";
      EXPECT_EQ(out.result.not_loaded_on_all_ranks, std::vector<std::string>{kLast}) << what;
      break;
  }
  if (row.name.rfind("empty checkpoint", 0) == 0) {
    EXPECT_EQ(out.result.loaded.size(), 0u) << what << ": nothing should have loaded";
  }
}

class Matrix : public ::testing::TestWithParam<int> {};

TEST_P(Matrix, RowHoldsInDefaultAndAtomicMode) {
  const Row row = rows().at(static_cast<std::size_t>(GetParam()));
  for (bool atomic : {false, true}) run_row(row, atomic);
}

INSTANTIATE_TEST_SUITE_P(Reliability, Matrix, ::testing::Range(0, static_cast<int>(rows().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           const std::string text =
                               rows().at(static_cast<std::size_t>(info.param)).name;
                           std::string name;
                           for (char c : text)
                             name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return std::to_string(info.param) + "_" + name.substr(0, 40);
                         });

// ---- rows that end the job: run by mpi_tests/CMakeLists.txt, which checks how ----

// The reader stalls in the middle of the checkpoint: it ends the job after
// read_stall_timeout, saying which bucket made no progress.
// The model, and on rank 0 the checkpoint's source that stalls for `stall`
// once `after_bytes` have been read.
struct StallingReader {
  StallingReader(std::uint64_t after_bytes, std::chrono::seconds stall) {
    const std::string path = write_checkpoint(dir.path() + "/m.safetensors", v.v2);
    world().barrier();
    if (world().rank() == 0)
      source = std::make_unique<FaultySource>(open_weight_source(path), after_bytes,
                                              FaultySource::Fault::kStall, stall);
  }
  const Versions v;
  SharedDir dir;
  TensorParallelModel model{v.config, on_this_rank(world().size())};
  std::unique_ptr<WeightSource> source;
};

TEST(ReliabilityJobEnds, DISABLED_AStalledReader) {
  StallingReader job(20000, std::chrono::seconds(60));
  ReloadOptions o;
  o.bucket_bytes = 4096;
  o.read_stall_timeout = std::chrono::seconds(2);
  reload_weights(job.model, world(), job.source.get(), o);
  ADD_FAILURE() << "the stalled reload returned";
}

// The reader stalls in its second bucket while the first bucket's transfer
// fails on the reader rank (pipeline depth 2: the reader reads ahead). The
// error unwinds into joining the reader thread, which the stalled read keeps:
// that wait has the same deadline, and the job ends naming the bucket, instead
// of waiting for the read (300 s) with every peer waiting too.
TEST(ReliabilityJobEnds, DISABLED_AStalledReaderWhileTheTransferFails) {
  ReloadOptions o;
  o.bucket_bytes = 4096;
  o.distribution = Distribution::kBroadcast;  // buckets of read bytes, no replicas
  o.pipeline_depth = 2;
  o.read_stall_timeout = std::chrono::seconds(2);
  // The first bucket reads at most 4096 bytes, the first two more: the read
  // that stalls is the second bucket's.
  StallingReader job(o.bucket_bytes, std::chrono::seconds(300));
  std::unique_ptr<DataTransport> data = make_communicator_transport(world());
  if (world().rank() == 0)
    data = std::make_unique<FaultyTransport>(std::move(data), 1, FaultyTransport::Fault::kStall,
                                             std::chrono::seconds(1));
  try {
    reload_weights(job.model, world(), *data, job.source.get(), o);
  } catch (const CommError& e) {
    log().critical("rank {}/{}: {}; aborting the job", world().rank(), world().size(), e.what());
    log().flush();
    mpitest::mpi_world().abort(1);
  }
  ADD_FAILURE() << "the reload returned";
}

// The last rank exits at its third transfer: the others end within the
// collective timeout, naming the operation, or mpirun ends the job naming the rank.
TEST(ReliabilityJobEnds, DISABLED_ARankThatExitsMidTransfer) {
  const Versions v;
  TensorParallelModel model(v.config, on_this_rank(world().size()));
  auto source = testdata::memory_source(v.v2);
  std::unique_ptr<DataTransport> data = make_communicator_transport(world());
  if (world().rank() == world().size() - 1)
    data = std::make_unique<FaultyTransport>(std::move(data), 3, FaultyTransport::Fault::kExit);
  ReloadOptions o;
  o.bucket_bytes = 4096;
  reload_weights(model, world(), *data, world().rank() == 0 ? source.get() : nullptr, o);
  ADD_FAILURE() << "the reload returned";
}

// A transfer fails on the last rank: that rank's error is its own (not agreed),
// so, as the programs do, it ends the job with the message.
TEST(ReliabilityJobEnds, DISABLED_AFailedTransfer) {
  const Versions v;
  TensorParallelModel model(v.config, on_this_rank(world().size()));
  auto source = testdata::memory_source(v.v2);
  std::unique_ptr<DataTransport> data = make_communicator_transport(world());
  if (world().rank() == world().size() - 1)
    data = std::make_unique<FaultyTransport>(std::move(data), 2, FaultyTransport::Fault::kFail);
  ReloadOptions o;
  o.bucket_bytes = 4096;
  try {
    reload_weights(model, world(), *data, world().rank() == 0 ? source.get() : nullptr, o);
  } catch (const CommError& e) {
    log().critical("rank {}/{}: {}; aborting the job", world().rank(), world().size(), e.what());
    log().flush();
    mpitest::mpi_world().abort(1);
  }
  ADD_FAILURE() << "the reload returned";
}

// The control plane fails on the last rank at its 6th collective (inside the
// reload's agreement, plan or status broadcasts): that rank's error is its own,
// not agreed, and it ends the job naming the collective, as the programs do.
TEST(ReliabilityJobEnds, DISABLED_AFailedControlCollective) {
  const Versions v;
  TensorParallelModel model(v.config, on_this_rank(world().size()));
  auto source = testdata::memory_source(v.v2);
  FaultyCommunicator control(world(), world().rank() == world().size() - 1 ? 6 : 0,
                             FaultyCommunicator::Fault::kFail);
  auto data = make_communicator_transport(world());
  try {
    reload_weights(model, control, *data, world().rank() == 0 ? source.get() : nullptr,
                   ReloadOptions{});
  } catch (const CommError& e) {
    EXPECT_EQ(dynamic_cast<const AgreedError*>(&e), nullptr) << "a one-rank fault was agreed";
    log().critical("{}; aborting the job", e.what());
    log().flush();
    world().abort(1);
  }
  ADD_FAILURE() << "the reload returned";
}

// The same collective never joined: the peers' collective deadline ends the job.
TEST(ReliabilityJobEnds, DISABLED_AStalledControlCollective) {
  const Versions v;
  TensorParallelModel model(v.config, on_this_rank(world().size()));
  auto source = testdata::memory_source(v.v2);
  FaultyCommunicator control(world(), world().rank() == world().size() - 1 ? 6 : 0,
                             FaultyCommunicator::Fault::kStall);
  auto data = make_communicator_transport(world());
  reload_weights(model, control, *data, world().rank() == 0 ? source.get() : nullptr,
                 ReloadOptions{});
  ADD_FAILURE() << "the reload returned";
}

}  // namespace
}  // namespace tpreload
