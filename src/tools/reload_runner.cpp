// reload_runner: build a tensor-parallel model on every rank of an MPI job, load
// it, then reload its weights in place (from --weights, or from --model again),
// and report what happened. `--demo` runs the whole story on a generated model.
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/core/quantization.h"
#include "tpreload/model/config.h"
#include "tpreload/model/model.h"
#include "tpreload/model/synthetic_model.h"
#include "tpreload/reference/forward.h"
#include "tpreload/reload/plan.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/reload/sharded_files.h"
#include "tpreload/runtime/data_plane.h"
#include "tpreload/runtime/launch_env.h"
#include "tpreload/runtime/program.h"
#include "tpreload/runtime/progress.h"

namespace {

using namespace tpreload;
namespace fs = std::filesystem;

struct RunnerOptions {
  std::string model_dir;
  std::string weights;
  bool kernel_format = false;
  bool sharded_source = false;
  int tp = 0;  // 0: chosen (tp_from_layout)
  std::string quantization;
  bool lora = false;
  bool expert_parallel = false;
  std::string distribution{distribution_name(ReloadOptions{}.distribution)};
  double bucket_mb = ReloadOptions{}.bucket_bytes / 1048576.0;
  int pipeline_depth = ReloadOptions{}.pipeline_depth;
  int reader_rank = 0;
  std::string readers{readers_name(ReloadOptions{}.readers)};
  int ranks_per_node = 0;
  bool rotate_broadcast_roots = false;
  bool zero_copy = false;
  bool atomic = false;
  bool require_complete = false;
  bool no_checksums = false;
  bool no_compare_replicas = false;
  int read_timeout_s = static_cast<int>(ReloadOptions{}.read_stall_timeout.count());
  int repeat = 1;
  std::string report;
  bool demo = false;
  std::string log_level = "info";
  bool quiet = false;
  std::string progress = "auto";
  int timeout_s = 300;
  std::string device = "cpu";
  std::string transport = "mpi";

  std::string describe() const {
    return tpreload::detail::concat(
        "model=", model_dir, " weights=", weights.empty() ? "(model)" : weights,
        " kernel_format=", kernel_format, " sharded_source=", sharded_source, " tp=", tp,
        " quantization=", quantization.empty() ? "none" : quantization, " lora=", lora,
        " expert_parallel=", expert_parallel, " distribution=", distribution,
        " bucket_mb=", bucket_mb, " pipeline_depth=", pipeline_depth, " reader_rank=", reader_rank,
        " readers=", readers, " ranks_per_node=", ranks_per_node,
        " rotate_broadcast_roots=", rotate_broadcast_roots, " zero_copy=", zero_copy,
        " atomic=", atomic, " require_complete=", require_complete, " checksums=", !no_checksums,
        " compare_replicas=", !no_compare_replicas, " read_timeout_s=", read_timeout_s,
        " repeat=", repeat, " report=", report, " demo=", demo, " timeout_s=", timeout_s,
        " device=", device, " transport=", transport);
  }
};

// A CLI11 check of a number, its refusal in words: "must be a number > 0, got
// 0" (CLI11's own ranges print the largest double as their bound). `positive`:
// more than 0, else at least 0; `max`: the largest allowed (0: none), and
// `unit_bytes` the bytes of one unit (a value under one byte is refused).
CLI::Validator number_check(bool positive, double max = 0, double unit_bytes = 0) {
  std::string rule = positive ? "> 0" : ">= 0";
  if (max > 0) rule += " and <= " + std::to_string(static_cast<long long>(max));
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        std::size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::out_of_range&) {
          return "must be a number " + rule + ", got " + text;
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || std::isnan(v))
          return "'" + text + "' is not a number";
        const bool below = positive ? !(v > 0) : !(v >= 0);
        if (below || (max > 0 && v > max)) return "must be a number " + rule + ", got " + text;
        if (unit_bytes > 0 && v * unit_bytes < 1) return text + " is less than one byte";
        return "";
      },
      "NUMBER " + rule);
}

void add_options(CLI::App& app, RunnerOptions& o) {
  app.add_option("--model", o.model_dir,
                 "Hugging Face-style model directory: config.json (of a family tpreload knows: " +
                     model_family_names() +
                     ") plus safetensors (one file or sharded with "
                     "model.safetensors.index.json) or one HDF5 file");
  CLI::Option* weights =
      app.add_option("--weights", o.weights,
                     "Reload from this checkpoint directory or file (a kernel-format directory "
                     "with --kernel-format); default: --model again");
  app.add_flag("--kernel-format", o.kernel_format,
               "The weights given with --weights are kernel-format shards (made by `reload_ckpt "
               "shard`): copy them straight into the parameters")
      ->needs(weights);
  app.add_flag("--sharded-source", o.sharded_source,
               "The weights given with --weights are a split (made by `reload_ckpt split`): each "
               "rank reads its own file (a rank past the split's ranks holds nothing) and the "
               "ranks move what each needs point to point; no rank reads a whole checkpoint. "
               "Checkpoint format, --readers one, host memory")
      ->needs(weights)
      ->excludes("--kernel-format");
  app.add_option(
         "--tp", o.tp,
         "Tensor-parallel size; the world is replicas x tp, world rank w is tp rank w % tp of "
         "replica w / tp (0, the default: the ranks per node when the job spans several nodes "
         "with the same count on each, else the world size)")
      ->capture_default_str()
      ->check(number_check(false));
  app.add_option("--quantization", o.quantization, quantization_help())
      ->check(CLI::IsMember(quantization_choices()));
  app.add_flag("--lora", o.lora, "Wrap the linear layers with LoRA adapters (base_layer names)");
  app.add_flag(
      "--expert-parallel", o.expert_parallel,
      "Mixture-of-experts models (Qwen2-MoE, Qwen3-MoE, Mixtral, the Granite MoE lines): each "
      "tensor-parallel "
      "rank holds whole "
      "experts (vLLM's --enable-expert-parallel) instead of a slice of every expert");
  app.add_option("--distribution", o.distribution,
                 "broadcast: every rank gets whole tensors and takes its slice; scatter: the "
                 "reader cuts each rank's slice and sends only that")
      ->check(CLI::IsMember({"broadcast", "scatter"}))
      ->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "Bucket size in MiB (staging per buffer), up to 1 TiB")
      ->capture_default_str()
      ->check(number_check(true, 1048576, 1048576));
  app.add_option("--pipeline-depth", o.pipeline_depth,
                 "Buffers in flight per rank: 1 reads, moves and applies one bucket at a time; 2 "
                 "overlaps the read of the next bucket with the transfer and apply of the last "
                 "(three threads); 0 chooses per rank: 2 where the rank has two cores of its own "
                 "(its CPU affinity, and the host's cores over its ranks), else 1. A depth other "
                 "than 0 may differ between ranks; 0 is given on every rank or on none")
      ->capture_default_str()
      ->check(CLI::Range(0, 16));
  app.add_option("--reader-rank", o.reader_rank, "World rank that reads the checkpoint")
      ->capture_default_str()
      ->check(number_check(false));
  app.add_option("--readers", o.readers,
                 "Who reads the checkpoint. one: the reader rank reads it and sends each rank its "
                 "part (when only one host sees the files). node: one rank per node reads what "
                 "the ranks of its node need and sends it within the node (every node sees the "
                 "files; storage that throttles per client); a node that cannot open them is "
                 "served by another node's reader, and only its bytes cross nodes. all: "
                 "every rank opens the same path and reads only its own slices, nothing is sent "
                 "(every node sees the files; fastest with a warm page cache; buckets are laid "
                 "out as for scatter)")
      ->check(CLI::IsMember({"one", "node", "all"}))
      ->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "With --readers node: world ranks [k*N, (k+1)*N) form node k (default 0: the "
                 "ranks MPI says share memory)")
      ->capture_default_str()
      ->check(number_check(false));
  app.add_flag("--rotate-broadcast-roots", o.rotate_broadcast_roots,
               "With --readers node: the node readers take turns reading the broadcast buckets, "
               "each sending its turns to every rank of the job (each reads a share of the "
               "broadcast bytes, which then cross between nodes; for storage that throttles per "
               "client). Scatter buckets stay within their node");
  app.add_flag("--zero-copy", o.zero_copy,
               "Broadcast a bucket straight from the memory-mapped file when it is one run of "
               "it, instead of reading it into a send buffer (slower on a freshly opened "
               "checkpoint: see docs/PERFORMANCE.md)");
  app.add_flag("--atomic", o.atomic,
               "All or nothing: every rank receives its whole shard into a second copy of its "
               "parameters (host or device memory, as the parameters), and only when every rank "
               "has it are they overwritten; any failure before leaves every parameter as it was. "
               "Costs that copy's memory (refused, naming it, where it cannot be had)");
  app.add_flag("--require-complete", o.require_complete,
               "Refuse, before any write, a checkpoint that lacks a parameter some rank needs "
               "(default: reload what is there and report the rest, exit status 3)");
  app.add_flag("--no-checksums", o.no_checksums,
               "Do not verify the transferred bytes (by default the reader sends a CRC-32C of "
               "each rank's share of every scatter bucket and of every 64 KiB of a broadcast "
               "bucket, and each rank checks the bytes it will apply before applying any; a "
               "mismatch ends the reload with an error on every rank)");
  app.add_flag("--no-compare-replicas", o.no_compare_replicas,
               "With several replicas (world size > --tp), do not compare the replicas' "
               "parameters after each reload (by default ranks holding the same tp rank compare "
               "a CRC-32C of every parameter, and a difference is an error on every rank)");
  app.add_option("--read-timeout", o.read_timeout_s,
                 "Seconds a reading rank may take to read one bucket before the job is ended "
                 "(a hung file system)")
      ->capture_default_str()
      ->check(number_check(true));
  app.add_option("--repeat", o.repeat, "Reload this many times")
      ->capture_default_str()
      ->check(number_check(true));
  app.add_option("--report", o.report,
                 "Write a JSON report of the last reload here (see docs/REPORT.md)");
  app.add_flag("--demo", o.demo,
               "Generate a small Llama model and two checkpoint versions, serve logits from "
               "version 1, reload version 2 in place, and check the logits equal a fresh load");
  app.add_flag(
      "--quiet", o.quiet,
      "No progress and only warnings and errors in the log (as --log-level warn); the summary "
      "and report are still written");
  app.add_option(
         "--progress", o.progress,
         "Progress on the reader rank: tty (one line redrawn), log (a line every few "
         "seconds), off, or auto (launch/mpirun.sh passes whether its stderr is a terminal; "
         "else stderr of this process)")
      ->check(CLI::IsMember({"auto", "tty", "log", "off"}))
      ->capture_default_str();
  app.add_option("--log-level", o.log_level,
                 "trace, debug, info, warn, error or off (off: no log, but an error that ends "
                 "the run is still printed)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s,
                 "Seconds one collective may take before every rank stops with an error")
      ->capture_default_str()
      ->check(number_check(true));
  app.add_option("--device", o.device,
                 "Where the parameters live: cpu (host memory) or cuda (the GPU of each rank's "
                 "node-local rank, modulo the GPUs it sees)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option(
         "--transport", o.transport,
         "What moves the bucket bytes: mpi (host buffers; with --device cuda they are pinned "
         "and applied on the GPU) or nccl (device buffers; needs --device cuda)")
      ->check(CLI::IsMember({"mpi", "nccl"}))
      ->capture_default_str();
}

// COLLECTIVE, before the first transfer: options that change what a rank does
// collectively (how many reloads, whether a report's fingerprints are gathered,
// the demo's extra steps, the planes) must be the same on every rank, or ranks
// would wait on collectives their peers never post. Those of one rank only
// (--weights, --read-timeout on the reader, logging, progress) may differ, and so
// may an explicit --pipeline-depth (the reload itself agrees on whether the
// depth is chosen per rank, the one case that changes its collectives).
void agree_on_options(const RunnerOptions& o, Communicator& world) {
  agree_on_values<UsageError>(
      world,
      {{"--repeat", o.repeat},
       {"--report (given or not)", !o.report.empty()},
       {"--demo", o.demo},
       {"--kernel-format", o.kernel_format},
       {"--tp", o.tp},
       {"--quantization", o.quantization},
       {"--lora", o.lora},
       {"--expert-parallel", o.expert_parallel},
       {"--distribution", o.distribution},
       {"--bucket-mb", fmt::format("{}", o.bucket_mb)},
       {"--reader-rank", o.reader_rank},
       {"--readers", o.readers},
       {"--ranks-per-node", o.ranks_per_node},
       {"--rotate-broadcast-roots", o.rotate_broadcast_roots},
       {"--zero-copy", o.zero_copy},
       {"--atomic", o.atomic},
       {"--require-complete", o.require_complete},
       {"--no-checksums", o.no_checksums},
       {"--no-compare-replicas", o.no_compare_replicas},
       {"--timeout", o.timeout_s},
       {"--device", o.device},
       {"--transport", o.transport}},
      " (every rank of the job must be started with the same options); nothing was loaded");
}

ReloadOptions reload_options(const RunnerOptions& o, bool kernel) {
  ReloadOptions r;
  r.format = kernel ? WeightFormat::kKernel : WeightFormat::kCheckpoint;
  r.distribution = o.distribution == "scatter" ? Distribution::kScatter : Distribution::kBroadcast;
  r.bucket_bytes = static_cast<std::uint64_t>(o.bucket_mb * 1024 * 1024);
  r.pipeline_depth = o.pipeline_depth;
  r.reader_rank = o.reader_rank;
  r.readers = parse_readers(o.readers).value_or(Readers::kOne);  // (checked by CLI11)
  r.ranks_per_node = o.ranks_per_node;
  r.rotate_broadcast_roots = o.rotate_broadcast_roots;
  r.zero_copy = o.zero_copy;
  r.atomic = o.atomic;
  r.require_complete = o.require_complete;
  r.checksums = !o.no_checksums;
  r.compare_replicas = !o.no_compare_replicas;
  r.read_stall_timeout = std::chrono::seconds(o.read_timeout_s);
  // Progress on the reader rank: redrawn on a terminal, a log line every few
  // seconds otherwise.
  return o.quiet ? r : with_progress(r, o.progress);
}

// --tp's default from the launcher's variables (the ranks per node over several
// nodes), said once in the log; the world size where they say nothing usable.
// COLLECTIVE (one allreduce): each rank sees only its own node's count, so on
// nodes with different counts the ranks would choose differently; they agree
// on the world size then.
int tp_from_layout(Communicator& world) {
  LaunchLayout layout = layout_from_environment();
  if (layout.world_size != world.size()) {  // not launched as the variables say (a singleton run)
    layout = LaunchLayout{};
    layout.world_size = world.size();
    layout.world_rank = world.rank();
  }
  std::string why;
  int tp = default_tp_size(layout, &why);
  std::vector<std::int64_t> range{tp, -tp};  // [the largest, minus the smallest]
  allreduce_ints(world, range, IntOp::kMax);
  if (range[0] != -range[1]) {
    why = tpreload::detail::concat(
        "--tp not given: tp ", world.size(),
        " (the world size: the launcher's variables give the nodes different "
        "numbers of ranks, which would make tp ",
        -range[1], " on some ranks and ", range[0], " on others)");
    tp = world.size();
  }
  static bool said = false;
  if (world.rank() == 0 && !said) log().info("{}", why);
  said = true;
  log().debug("{}", describe_layout(layout, tp));
  return tp;
}

ModelOptions model_options(const RunnerOptions& o, Communicator& world, const DataPlane& plane) {
  ModelOptions m;
  m.device = plane.device;
  m.tp_size = o.tp > 0 ? o.tp : tp_from_layout(world);
  // Every rank has the same tp (agreed options or layout); agreed all the same,
  // so that the job ends cleanly on every rank instead of aborting.
  std::optional<std::string> problem;
  if (world.size() % m.tp_size != 0)
    problem = tpreload::detail::concat("--tp ", m.tp_size, " does not divide the world size ",
                                       world.size());
  agree_on_problem<UsageError>(world, problem, "choosing the tp size");
  m.tp_rank = world.rank() % m.tp_size;
  m.quantization = o.quantization;
  m.lora = o.lora;
  m.expert_parallel = o.expert_parallel;
  return m;
}

// Options that change nothing in the combination given, said once (rank 0).
void warn_ignored(const RunnerOptions& o) {
  if (o.readers == "all" && o.distribution == "broadcast")
    log().warn(
        "--distribution broadcast is ignored with --readers all: nothing is sent, and "
        "every rank reads its own slices as scatter lays them out");
  if (o.readers == "all" && o.zero_copy)
    log().warn(
        "--zero-copy is ignored with --readers all: it broadcasts from the mapped file, "
        "and nothing is broadcast");
  if (o.demo && (!o.model_dir.empty() || !o.weights.empty()))
    log().warn("--model and --weights are ignored with --demo, which generates its own model");
}

// COLLECTIVE. The model, built alike on every rank; a layout it cannot take
// (heads or sizes --tp does not divide, expert parallelism without experts) is
// the same error on every rank, which then all end cleanly, naming the tp sizes
// of this world that the model would take.
std::unique_ptr<TensorParallelModel> build_model(const ModelConfig& config, const ModelOptions& m,
                                                 Communicator& world) {
  std::unique_ptr<TensorParallelModel> model;
  std::optional<std::string> problem;
  try {
    model = std::make_unique<TensorParallelModel>(config, m);
  } catch (const std::exception& e) {
    problem = e.what();
    bool layout = false;  // (not, say, memory the parameters could not get)
    try {
      ShardingRules(config, m.tp_size, m.quantization, m.expert_parallel);
    } catch (const std::exception&) {
      layout = true;
    }
    std::vector<int> fitting;
    for (int tp = 1; layout && tp <= world.size(); ++tp) {
      if (world.size() % tp != 0 || tp == m.tp_size) continue;
      try {
        ShardingRules(config, tp, m.quantization, m.expert_parallel);
        fitting.push_back(tp);
      } catch (const std::exception&) {
      }
    }
    std::string listed;  // "1, 2 or 4"
    for (std::size_t i = 0; i < fitting.size(); ++i)
      listed += (i == 0                    ? ""
                 : i + 1 == fitting.size() ? " or "
                                           : ", ") +
                std::to_string(fitting[i]);
    if (!fitting.empty())
      *problem += tpreload::detail::concat(" (with ", world.size(), " ranks, --tp ", listed,
                                           " would fit this model)");
  }
  agree_on_problem<ModelError>(world, problem, "building the model");
  return model;
}

// This rank's objection to options that do not go together or that the
// environment sets wrong (the demo's too): --ranks-per-node without node
// readers, a bad TPRELOAD_PROGRESS.
std::optional<std::string> option_problem(const RunnerOptions& o) {
  if (o.ranks_per_node > 0 && o.readers != "node")
    return tpreload::detail::concat(
        "--ranks-per-node makes the nodes of --readers node; with "
        "--readers ",
        o.readers, " it would be ignored");
  if (!o.quiet) try {
      with_progress(ReloadOptions{}, o.progress);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  return std::nullopt;
}

// COLLECTIVE, before the model is loaded: option_problem(), and what would
// otherwise fail only after the load (minutes, for a large model): --model
// naming a file, --weights missing on the reader rank of --readers one (the
// only rank that opens it), a --report path rank 0 cannot create. The same
// error on every rank.
void check_paths(const RunnerOptions& o, Communicator& world) {
  std::optional<std::string> problem = option_problem(o);
  std::error_code ec;
  if (!problem && fs::is_regular_file(o.model_dir, ec))
    problem = tpreload::detail::concat(
        "--model takes the model's directory (config.json and "
        "the weights), not a file: '",
        o.model_dir, "'");
  // (with --readers node or all the reload itself says which ranks cannot read,
  // and who could serve them)
  const bool reader = world.rank() == o.reader_rank && o.readers == "one" && !o.sharded_source;
  if (!problem && !o.weights.empty() && reader && !fs::exists(o.weights, ec))
    problem =
        tpreload::detail::concat("--weights '", o.weights, "' does not exist on the reader rank");
  if (!problem && !o.report.empty() && world.rank() == 0) {
    // (opened to append, so that nothing is cut; a file this made is removed)
    const bool existed = fs::exists(fs::symlink_status(o.report, ec));  // (a link, even dangling)
    std::ofstream out(o.report, std::ios::app);
    if (!out.is_open())
      problem = tpreload::detail::concat("cannot write the report to '", o.report,
                                         "': ", std::strerror(errno));
    out.close();
    if (!existed) fs::remove(o.report, ec);
  }
  agree_on_problem<UsageError>(world, problem, "checking the options (nothing was loaded)");
}

// COLLECTIVE, before the initial load: --weights against the model, where the
// reader rank can open it (a kernel-format source for another layout or model,
// or a source of the other format than --kernel-format says), so that the
// mistake is not found only after the initial load. A source that does not
// open is left to the reload, which says why.
void check_weights(const RunnerOptions& o, const TensorParallelModel& model, Communicator& world) {
  std::optional<std::string> problem;
  if (!o.weights.empty() && world.rank() == o.reader_rank && !o.sharded_source) {
    std::unique_ptr<WeightSource> source;
    try {
      source = open_weight_source(o.weights);
    } catch (const std::exception&) {
    }
    if (source) try {
        check_source_format({source->describe(), {}, source->kernel_format()}, model.rules(),
                            o.kernel_format ? WeightFormat::kKernel : WeightFormat::kCheckpoint);
      } catch (const std::exception& e) {
        problem = e.what();
      }
  }
  agree_on_problem<ValidationError>(world, problem, "checking --weights before the initial load");
}

// COLLECTIVE. Rank 0 writes the report; a report it cannot write is the same
// error on every rank (which then all end cleanly).
void write_report(const RunnerOptions& o, const ReloadResult& r, TensorParallelModel& model,
                  Communicator& world) {
  const auto fingerprints = gather_fingerprints(model, world, ReloadOptions{}.device_timeout);
  std::optional<std::string> problem;
  if (world.rank() == 0) try {
      std::ofstream out(o.report);
      if (!out.is_open())
        raise<UsageError>("cannot write the report to '", o.report, "': ", std::strerror(errno));
      out << report_json(r, {world.size(), model.options().tp_size, world.backend()}, fingerprints)
          << "\n";
      out.close();
      if (!out) raise<UsageError>("cannot write the report to '", o.report, "' (writing failed)");
    } catch (const std::exception& e) {
      problem = e.what();
    }
  agree_on_problem<UsageError>(world, problem, "writing the report");
  if (world.rank() == 0) log().info("wrote report {}", o.report);
}

int run_reloads(const RunnerOptions& o, Communicator& world, const DataPlane& plane) {
  agree_on_problem<UsageError>(
      world,
      o.model_dir.empty() ? std::optional<std::string>("--model DIR is required (or use --demo)")
                          : std::nullopt,
      "reading the options");
  check_paths(o, world);
  // Every rank reads the config (from its own file system): a problem on any
  // rank is the same error on every rank, which then all end cleanly.
  ModelConfig config;
  std::optional<std::string> problem;
  try {
    config = load_model_config(o.model_dir);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problem<ModelError>(world, problem, "reading the model config");
  const std::unique_ptr<TensorParallelModel> built =
      build_model(config, model_options(o, world, plane), world);
  TensorParallelModel& model = *built;
  check_weights(o, model, world);
  ReloadableModel served(model, {o.model_dir, "", ""}, plane.transport.get());
  ReloadResult failed;  // what the callbacks were told when a reload failed
  served.on_reloaded([&](const ReloadResult& r) {
    if (!r.error.empty()) failed = r;
  });
  log().info("loading {} ({} layers, tp {}) from {} into {}", config.architecture,
             config.num_hidden_layers, model.options().tp_size, o.model_dir, plane.describe());
  ReloadResult initial, last;
  ReloadOptions attempted = reload_options(o, false);  // the reload a failure stopped
  std::string phase = "the initial load from --model " + o.model_dir,
              attempted_source = o.model_dir;
  try {
    initial = served.reload(world, attempted);
    if (world.rank() == 0) std::cout << "initial load:\n" << summary_text(initial);
    last = initial;
    for (int i = 0; i < o.repeat; ++i) {
      attempted = reload_options(o, o.kernel_format);
      attempted_source = o.weights.empty() ? o.model_dir : o.weights;
      phase =
          tpreload::detail::concat("reload ", i + 1, " of ", o.repeat, " from ",
                                   o.weights.empty() ? "--model " : "--weights ", attempted_source);
      if (o.sharded_source) {
        // Each rank's own file, opened for every reload (a trainer writes a new one).
        std::unique_ptr<ShardedSource> held;
        std::optional<std::string> unreadable;
        try {
          held = open_split_source(o.weights, world.rank());
        } catch (const std::exception& e) {
          unreadable = e.what();
        }
        agree_on_problem<CheckpointError>(world, unreadable,
                                          "opening the sharded source (nothing was reloaded)");
        last = served.reload_from(world, attempted, *held);
      } else {
        last = served.reload(world, attempted, o.weights);
      }
      if (world.rank() == 0)
        std::cout << "reload " << i + 1 << " of " << o.repeat << ":\n" << summary_text(last);
    }
  } catch (const std::exception& e) {
    // An error every rank raised alike leaves every rank alive and in step: the
    // report says what happened and what the parameters hold now. (Any other
    // error ends the job; there is no one left to write it.)
    if (world.rank() == 0) log().error("{} failed:", phase);
    if (!o.report.empty() && dynamic_cast<const AgreedError*>(&e)) {
      ReloadResult report = result_for(attempted);
      report.error = e.what();
      report.source = failed.source.empty() ? attempted_source : failed.source;
      report.parameter_memory = model.sink().device() ? model.sink().device()->describe() : "host";
      report.possibly_mixed = names_on_some_rank(
          world, model.rules(),
          failed.error.empty() ? std::vector<std::string>{} : failed.possibly_mixed);
      write_report(o, report, model, world);
    }
    throw;
  }
  if (!o.report.empty()) write_report(o, last, model, world);
  return initial.complete() && last.complete() ? 0 : 3;
}

// ------------------------------------------------------------------ the demo

std::string shared_temp_dir(Communicator& world) {
  std::string name(512, '\0');
  if (world.rank() == 0) {
    std::string tmpl = (fs::temp_directory_path() / "tpreload-demo-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      raise<UsageError>("cannot create a temporary directory in ", fs::temp_directory_path());
    name = tmpl;
    name.resize(512, '\0');
  }
  world.broadcast(MutableBytes(name.data(), name.size()), 0);
  return name.c_str();
}

ModelConfig demo_config() {
  return parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16"})",
                            "demo config");
}

void write_demo_checkpoints(const ModelConfig& config, const std::string& dir) {
  for (int version : {1, 2}) {
    GenerateOptions g;
    g.shards = version == 1 ? 2 : 1;
    g.values.seed = static_cast<std::uint64_t>(version);
    generate_model_checkpoint(config, dir + "/v" + std::to_string(version), g);
  }
}

// "-0.0318 0.0030 ..." : the first few logits of the first token.
std::string head(const at::Tensor& logits) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(4);
  for (std::int64_t i = 0; i < 6; ++i) out << (i ? " " : "") << logits[0][i].item<float>();
  return out.str() + " ...";
}

int run_demo(const RunnerOptions& o, Communicator& world, const DataPlane& plane) {
  agree_on_problem<UsageError>(world, option_problem(o),
                               "checking the options (nothing was loaded)");
  const std::string dir = shared_temp_dir(world);
  struct RemoveOnReturn {  // (also when the demo fails)
    const std::string& dir;
    bool owner;
    ~RemoveOnReturn() {
      std::error_code ignored;
      if (owner) fs::remove_all(dir, ignored);
    }
  } remove{dir, world.rank() == 0};
  const ModelConfig config = demo_config();
  if (world.rank() == 0) write_demo_checkpoints(config, dir);
  world.barrier();
  const ModelOptions mo = model_options(o, world, plane);
  auto tp_group = world.split(world.rank() / mo.tp_size, world.rank());
  const std::vector<std::int64_t> tokens = {1, 15, 299, 640, 999, 42, 7, 512};
  log().info("demo: {} ranks, tp {}, model {} in {}", world.size(), mo.tp_size, config.architecture,
             dir);

  const std::unique_ptr<TensorParallelModel> built = build_model(config, mo, world);
  TensorParallelModel& model = *built;
  ReloadableModel served(model, {dir + "/v1", "", ""}, plane.transport.get());
  served.reload(world, reload_options(o, false));
  const at::Tensor before = reference_forward(model, tokens, *tp_group);
  const void* storage =
      model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.weight").data_ptr();

  const ReloadResult r = served.reload(world, reload_options(o, false), dir + "/v2");
  const at::Tensor after = reference_forward(model, tokens, *tp_group);
  TensorParallelModel fresh(config, mo);
  ReloadableModel fresh_served(fresh, {dir + "/v2", "", ""}, plane.transport.get());
  fresh_served.reload(world, reload_options(o, false));
  const at::Tensor expected = reference_forward(fresh, tokens, *tp_group);

  const bool in_place =
      storage == model.parameter_for_reload("model.layers.0.self_attn.qkv_proj.weight").data_ptr();
  const bool changed = !at::equal(before, after);
  const bool exact = at::equal(after, expected);
  if (world.rank() == 0) {
    std::cout << summary_text(r) << "demo: logits of version 1, first token:   " << head(before)
              << "\n"
              << "demo: logits after the in-place reload:    " << head(after) << "\n"
              << "demo: logits of a fresh load of version 2: " << head(expected) << "\n"
              << "demo: logits changed: " << (changed ? "yes" : "NO")
              << "; equal to a fresh load of version 2, bit for bit: " << (exact ? "yes" : "NO")
              << "; parameters stayed in place: " << (in_place ? "yes" : "NO") << "\n";
  }
  if (!o.report.empty()) write_report(o, r, model, world);
  world.barrier();  // (every rank is done with the files before rank 0 removes them)
  return changed && exact && in_place && r.complete() ? 0 : 4;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "reload_runner: reload the weights of a live tensor-parallel model in place, on every rank "
      "of an MPI job.\n\nThe reader rank reads the checkpoint and broadcasts or scatters it in "
      "buckets; every rank copies its shard into the existing parameter storage; an allreduce "
      "checks that every expected weight arrived. Exit status: 0 when every expected parameter "
      "loaded on every rank, 3 when some did not (they are listed), 1 on errors, 2 when the "
      "command line does not parse (an unknown option, a value out of range); usage errors found "
      "once the ranks have started (no --model, a --tp that does not divide the world, options "
      "that do not go together, ranks started with different options) are errors, 1 on every "
      "rank; with --demo, 4 when the demo's own check fails.\n\nExamples:\n"
      "  launch/mpirun.sh 4 reload_runner --demo\n"
      "  launch/mpirun.sh 8 reload_runner --model /models/llama --tp 4 --weights /ckpt/step-200\n"
      "  launch/mpirun.sh 4 reload_runner --model /models/llama --weights /ckpt/kernel-tp4 "
      "--kernel-format\n"
      "  launch/mpirun.sh 8 reload_runner --model /models/llama --device cuda --transport nccl\n"
      "(launch/mpirun.sh: mpirun with the settings this needs, root included; plain "
      "`mpirun -np N reload_runner ...` works as well)\n"};
  RunnerOptions options;
  add_options(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // (CLI11's own codes are 100 and up)
    const int printed = app.exit(e);
    return printed == 0 ? 0 : 2;
  }
  CommOptions comm_options;
  comm_options.timeout = std::chrono::seconds(options.timeout_s);
  if (options.quiet && options.log_level == "info") options.log_level = "warn";
  const bool retained = retain_freed_memory();  // the runner reloads again and again
  return run_mpi_program(
      &argc, &argv, options.log_level, comm_options, [&](MpiCommunicator& world) {
        if (world.rank() == 0) {
          log().info("reload_runner options: {}", options.describe());
          warn_ignored(options);
        }
        log().debug("keeping freed memory for the next reload (up to {} MiB): {}",
                    kRetainedFreeBytes >> 20, retained ? "yes" : "not on this C library");
        agree_on_options(options, world);
        const DataPlane plane =
            open_data_plane(world, {options.device, options.transport, comm_options});
        return options.demo ? run_demo(options, world, plane) : run_reloads(options, world, plane);
      });
}
