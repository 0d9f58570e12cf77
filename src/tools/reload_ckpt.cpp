// reload_ckpt: generate, inspect, convert and verify checkpoints.
//
//   reload_ckpt generate --config config.json --out DIR [--shards K] [--format F] [--seed S]
//   reload_ckpt inspect PATH
//   reload_ckpt convert IN OUT [--format F] [--shards K] [--gzip L] [--flat]
//   reload_ckpt verify PATH [--read-data]
//   reload_ckpt split IN OUT --ranks N [--by rows|cols|whole]
//
// Errors: one line on stderr, exit status 1 (2 for bad command-line usage).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/checkpoint/writers.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/core/quantization.h"
#include "tpreload/model/config.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/synthetic_model.h"
#include "tpreload/reload/sharded_files.h"

namespace {

using namespace tpreload;

// --gzip and --flat, shared by generate and convert.
struct Hdf5Args {
  int gzip = 0;
  bool flat = false;

  Hdf5WriteOptions options() const {
    Hdf5WriteOptions o;
    o.gzip_level = gzip;
    o.layout = flat ? Hdf5Layout::kFlat : Hdf5Layout::kNested;
    return o;
  }
};

void add_hdf5_options(CLI::App* cmd, Hdf5Args& a) {
  cmd->add_option("--gzip", a.gzip, "hdf5: gzip level 1-9 (chunked), 0 = contiguous")
      ->capture_default_str()
      ->check(CLI::Range(0, 9));
  cmd->add_flag("--flat", a.flat, "hdf5: datasets named by the dotted name at the root");
}

struct GenerateArgs {
  std::string config, out, format = "safetensors", dtype;
  int shards = 1;
  std::uint64_t seed = 0;
  double stddev = 0.02;
  bool with_inv_freq = false;
  std::vector<std::string> extras;
  Hdf5Args hdf5;
};

struct ConvertArgs {
  std::string in, out, format;
  int shards = 1;
  Hdf5Args hdf5;
};

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::uint64_t total_bytes(const std::vector<TensorInfo>& tensors) {
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.nbytes;
  return total;
}

// "NAME" (shape [hidden_size]) or "NAME:AxBxC".
TensorSpec parse_extra(const std::string& text, DType dtype, std::int64_t hidden) {
  const auto colon = text.find(':');
  TensorSpec spec{text.substr(0, colon), dtype, {hidden}};
  if (colon == std::string::npos) return spec;
  spec.shape.clear();
  std::stringstream dims(text.substr(colon + 1));
  for (std::string d; std::getline(dims, d, 'x');) {
    try {
      std::size_t used = 0;
      spec.shape.push_back(std::stoll(d, &used));
      if (used != d.size() || spec.shape.back() < 0) throw std::invalid_argument(d);
    } catch (const std::exception&) {
      raise<UsageError>("--extra '", text, "': shape must be like 4x8, got '", d, "'");
    }
  }
  return spec;
}

std::vector<TensorSpec> generate_specs(const ModelConfig& config, const GenerateArgs& a) {
  std::vector<TensorSpec> specs = checkpoint_specs(config);
  if (a.with_inv_freq)
    for (std::int64_t l = 0; l < config.num_hidden_layers; ++l)
      specs.push_back(
          {"model.layers." + std::to_string(l) + ".self_attn.rotary_emb.inv_freq",
           DType::kFloat32,
           // (one frequency per pair of the dimensions rotary turns)
           {static_cast<std::int64_t>(config.head_dim * config.partial_rotary_factor) / 2}});
  for (const auto& e : a.extras) specs.push_back(parse_extra(e, config.dtype, config.hidden_size));
  return specs;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out.flush()) raise<CheckpointError>("cannot write '", path, "'");
}

int run_generate(const GenerateArgs& a) {
  ModelConfig config = load_model_config(a.config);
  nlohmann::json config_json = nlohmann::json::parse(config.json);
  if (!a.dtype.empty()) {
    const auto dtype = dtype_from_name(a.dtype);
    if (!dtype) raise<UsageError>("--dtype '", a.dtype, "' is not a known dtype");
    config.dtype = *dtype;
    config_json["torch_dtype"] = std::string(dtype_name(*dtype));
    // (a model's dtype is a floating one: the config must still parse)
    parse_model_config(config_json.dump(), "--dtype " + a.dtype);
  }
  if (!(a.stddev >= 0)) raise<UsageError>("--std must be 0 or more, got ", a.stddev);
  GenerateOptions options;
  options.format = a.format;
  options.shards = a.shards;
  options.values = {a.seed, a.stddev, config.rope_theta};
  options.hdf5 = a.hdf5.options();
  const auto specs = generate_specs(config, a);
  const auto files = generate_checkpoint(a.out, specs, options);
  write_text(a.out + "/config.json", config_json.dump(2) + "\n");
  std::uint64_t bytes = 0;
  for (const auto& s : specs) {
    std::uint64_t n = dtype_size(s.dtype);
    for (const auto d : s.shape) n *= static_cast<std::uint64_t>(d);
    bytes += n;
  }
  const auto index = std::count(files.begin(), files.end(), "model.safetensors.index.json");
  std::cout << "generated " << specs.size() << " tensors (" << bytes << " bytes, "
            << dtype_name(config.dtype) << ", seed " << a.seed << ") in " << a.out << ": "
            << files.size() - index << (files.size() - index == 1 ? " file" : " files")
            << (index ? " + model.safetensors.index.json" : "") << " + config.json\n";
  return 0;
}

int run_inspect(const std::string& path) {
  const auto source = open_weight_source(path);
  const auto& tensors = source->tensors();
  std::cout << source->describe() << "\n";
  for (const auto& t : tensors) {
    std::cout << t.name << "\t" << dtype_name(t.dtype) << "\t" << shape_text(t.shape) << "\t"
              << t.nbytes;
    if (t.tp_rank >= 0) std::cout << "\trank " << t.tp_rank;
    std::cout << "\n";
  }
  for (const auto& [key, value] : source->metadata())
    std::cout << "metadata " << key << " = " << value << "\n";
  if (const auto kf = source->kernel_format())
    std::cout << "kernel format: tp_size " << kf->tp_size << ", dtype " << dtype_name(kf->dtype)
              << ", quantization " << (kf->quantization.empty() ? "none" : kf->quantization)
              << (kf->expert_parallel ? ", expert parallel" : "") << "\n";
  std::cout << "total: " << tensors.size() << " tensors, " << total_bytes(tensors) << " bytes\n";
  return 0;
}

std::string output_format(const ConvertArgs& a) {
  if (!a.format.empty()) return a.format;
  const std::string extension = std::filesystem::path(a.out).extension().string();
  if (extension == ".h5" || extension == ".hdf5") return "hdf5";
  if (extension == ".safetensors" || a.shards > 1) return "safetensors";
  raise<UsageError>("convert: cannot tell the output format of '", a.out,
                    "' (use .safetensors, .h5/.hdf5, --shards K for a directory, or --format)");
}

int run_convert(const ConvertArgs& a) {
  const auto source = open_weight_source(a.in);
  const auto specs = specs_of(*source);
  const FillFn fill = fill_from(*source);
  const std::string format = output_format(a);
  if (format == "hdf5" && a.shards > 1)
    raise<UsageError>("convert: --shards splits safetensors; an HDF5 output is one file");
  if (format == "hdf5") {
    write_hdf5(a.out, specs, fill, a.hdf5.options());
  } else if (format == "safetensors" && a.shards > 1) {
    write_safetensors_sharded(a.out, specs, fill, a.shards, source->metadata());
  } else if (format == "safetensors") {
    write_safetensors(a.out, specs, fill, source->metadata());
  } else {
    raise<UsageError>("convert: --format '", format, "' is not safetensors or hdf5");
  }
  std::cout << "converted " << specs.size() << " tensors (" << total_bytes(source->tensors())
            << " bytes) from " << a.in << " to " << a.out << " (" << format << ")\n";
  return 0;
}

// Read every tensor in bounded pieces; throws on the first failure.
void read_all(WeightSource& source) {
  constexpr std::uint64_t kPiece = 64ull << 20;
  std::vector<std::byte> buffer;
  for (std::size_t i = 0; i < source.tensors().size(); ++i) {
    const std::uint64_t n = source.tensors()[i].nbytes;
    for (std::uint64_t off = 0; off < n; off += kPiece) {
      const std::uint64_t len = std::min(kPiece, n - off);
      buffer.resize(len);
      source.read(i, {off, len}, MutableBytes(buffer.data(), len));
    }
  }
}

int run_verify(const std::string& path, bool read_data) {
  const auto source = open_weight_source(path);
  if (read_data) read_all(*source);
  std::cout << "OK: " << source->describe() << ", " << total_bytes(source->tensors()) << " bytes"
            << (read_data ? ", all data read" : "") << "\n";
  return 0;
}

CLI::App* add_generate(CLI::App& app, GenerateArgs& a) {
  auto* cmd = app.add_subcommand(
      "generate",
      "Write a Hugging Face-style checkpoint (the tensor names and shapes of any supported "
      "family: " +
          model_family_names() +
          ") for a config.json, with seeded random values: N(0, std) weights, 1 + noise for "
          "norm weights. Also writes config.json into the output directory (with --dtype "
          "applied).");
  cmd->add_option("--config", a.config, "config.json file (or a directory holding one)")
      ->required();
  cmd->add_option("--out", a.out, "Output directory (created if missing)")->required();
  cmd->add_option("--shards", a.shards, "safetensors files to split into (HF index when > 1)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--format", a.format, "safetensors or hdf5")
      ->capture_default_str()
      ->check(CLI::IsMember({"safetensors", "hdf5"}));
  cmd->add_option("--seed", a.seed, "Random seed (same seed, same values)")->capture_default_str();
  cmd->add_option("--dtype", a.dtype, "Override torch_dtype: float32, float16 or bfloat16");
  cmd->add_option("--std", a.stddev, "Standard deviation of the weights")->capture_default_str();
  cmd->add_option("--extra", a.extras,
                  "Extra tensor NAME or NAME:AxB (repeatable; default shape [hidden_size]), e.g. "
                  "for checkpoint names that match no parameter");
  cmd->add_flag("--with-inv-freq", a.with_inv_freq,
                "Add model.layers.N.self_attn.rotary_emb.inv_freq (float32) as old HF "
                "checkpoints have");
  add_hdf5_options(cmd, a.hdf5);
  return cmd;
}

CLI::App* add_convert(CLI::App& app, ConvertArgs& a) {
  auto* cmd = app.add_subcommand(
      "convert",
      "Convert a checkpoint between safetensors and HDF5. The output format follows OUT's "
      "extension (.safetensors, .h5, .hdf5) unless --format is given; with --shards K > 1 "
      "OUT is a directory of HF safetensors shards plus model.safetensors.index.json.");
  cmd->add_option("IN", a.in, "Input checkpoint (file or directory)")->required();
  cmd->add_option("OUT", a.out, "Output file or directory")->required();
  cmd->add_option("--format", a.format, "safetensors or hdf5")
      ->check(CLI::IsMember({"safetensors", "hdf5"}));
  cmd->add_option("--shards", a.shards, "safetensors shards")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_hdf5_options(cmd, a.hdf5);
  return cmd;
}

struct ShardArgs {
  std::string in, out, config;
  int tp = 1;
  std::string quantization;
  bool expert_parallel = false;
};

CLI::App* add_shard(CLI::App& app, ShardArgs& a) {
  auto* cmd = app.add_subcommand(
      "shard",
      "Write kernel-format shards (kernel_format.json plus rank-0000r-of-0000N.safetensors) "
      "for a tensor-parallel size: each rank's parameters as the model's own weight loaders "
      "and post-load processing make them, so a kernel-format reload of the output gives the "
      "same bytes as a checkpoint-format reload of IN.");
  cmd->add_option("IN", a.in, "Checkpoint (file or directory)")->required();
  cmd->add_option("OUT", a.out, "Output directory (created if missing)")->required();
  cmd->add_option("--config", a.config, "config.json (default: IN's directory)");
  cmd->add_option("--tp", a.tp, "Tensor-parallel size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--quantization", a.quantization, quantization_help())
      ->check(CLI::IsMember(quantization_choices()));
  cmd->add_flag("--expert-parallel", a.expert_parallel,
                "Mixture-of-experts models: whole experts per rank (vLLM's expert parallelism) "
                "instead of every expert split by tp");
  return cmd;
}

int run_shard(const ShardArgs& a) {
  if (!std::filesystem::exists(a.in))
    raise<UsageError>("shard: checkpoint '", a.in, "' does not exist");
  std::string config_path = a.config;
  if (config_path.empty())
    config_path = std::filesystem::is_directory(a.in)
                      ? a.in
                      : std::filesystem::path(a.in).parent_path().string();
  if (config_path.empty()) config_path = ".";  // IN is a file in the working directory
  const ModelConfig config = load_model_config(config_path);
  const auto source = open_weight_source(a.in);
  write_kernel_shards(config, *source, a.out, {a.tp, a.quantization, a.expert_parallel});
  std::cout << "wrote kernel-format shards for tp " << a.tp
            << (a.quantization.empty() ? "" : " (" + a.quantization + ")")
            << (a.expert_parallel ? " with expert parallelism" : "") << " to " << a.out << "\n";
  return 0;
}

struct SplitArgs {
  std::string in, out, by = "rows";
  int ranks = 0;
};

CLI::App* add_split(CLI::App& app, SplitArgs& a) {
  auto* cmd = app.add_subcommand(
      "split",
      "Split a checkpoint among N source ranks, as a trainer holds it: one "
      "rank-0000r.safetensors per rank with that rank's boxes (their full shapes and offsets in "
      "its metadata) plus manifest.json. `reload_runner --weights OUT --sharded-source` then "
      "has each rank read its own file and the ranks move what each needs point to point.");
  cmd->add_option("IN", a.in, "Checkpoint (file or directory), checkpoint format")->required();
  cmd->add_option("OUT", a.out, "Output directory (created if missing)")->required();
  cmd->add_option("--ranks", a.ranks, "Source ranks (files)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--by", a.by,
                  "rows: near-equal slices of each tensor's first dimension (FSDP); cols: of its "
                  "second (1-D tensors by rows); whole: tensor i whole on rank i mod N")
      ->capture_default_str()
      ->check(CLI::IsMember({"rows", "cols", "whole"}));
  return cmd;
}

int run_split(const SplitArgs& a) {
  const auto source = open_weight_source(a.in);
  const auto files = write_split_source(a.out, *source, a.ranks, *parse_split_by(a.by));
  std::cout << "split " << source->tensors().size() << " tensors ("
            << total_bytes(source->tensors()) << " bytes) of " << a.in << " by " << a.by
            << " among " << a.ranks << " ranks into " << a.out << ": " << files.size() - 1
            << (files.size() == 2 ? " file" : " files") << " + manifest.json\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "reload_ckpt: generate, inspect, convert, verify and shard checkpoints "
      "(safetensors single or sharded, HDF5, kernel-format shards)."};
  app.require_subcommand(1);
  GenerateArgs generate;
  ConvertArgs convert;
  std::string path;
  bool read_data = false;
  auto* generate_cmd = add_generate(app, generate);
  auto* convert_cmd = add_convert(app, convert);
  ShardArgs shard;
  auto* shard_cmd = add_shard(app, shard);
  SplitArgs split;
  auto* split_cmd = add_split(app, split);
  auto* inspect = app.add_subcommand(
      "inspect", "List every tensor (name, dtype, shape, bytes, rank), the metadata and totals.");
  inspect->add_option("PATH", path, "Checkpoint file or directory")->required();
  auto* verify = app.add_subcommand(
      "verify",
      "Validate a checkpoint's structure (headers, offsets, index, types). Prints one "
      "OK line and exits 0, or prints the error and exits 1.");
  verify->add_option("PATH", path, "Checkpoint file or directory")->required();
  verify->add_flag("--read-data", read_data, "Also read every byte of every tensor");
  // (CLI11 says only "A subcommand is required" for one it does not know)
  if (argc > 1 && argv[1][0] != '-') {
    const std::string first = argv[1];
    bool known = false;
    std::string names;  // "generate, convert, shard, inspect, verify"
    const CLI::App& subcommands = app;
    for (const CLI::App* sub : subcommands.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->get_name() == first;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "reload_ckpt: unknown subcommand '" << first << "' (" << names
                << "; --help says what each does)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
    tpreload::init_logging(0, 1, "info");
    if (generate_cmd->parsed()) return run_generate(generate);
    if (convert_cmd->parsed()) return run_convert(convert);
    if (shard_cmd->parsed()) return run_shard(shard);
    if (split_cmd->parsed()) return run_split(split);
    if (inspect->parsed()) return run_inspect(path);
    if (verify->parsed()) return run_verify(path, read_data);
    return 0;
  } catch (const CLI::ParseError& e) {  // (CLI11's own codes are 100 and up)
    const int printed = app.exit(e);
    return printed == 0 ? 0 : 2;
  } catch (const tpreload::Error& e) {
    std::cerr << "reload_ckpt: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "reload_ckpt: unexpected error: " << e.what() << "\n";
    return 1;
  }
}
