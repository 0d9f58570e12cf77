// tpreload_gpu_check: the checks only a GPU proves, in one process, without MPI
// and without LibTorch (so it is carried to a GPU machine as built, in the
// bundle of scripts/gpu_check.sh). Parameters are allocated for the sharding
// rules with cudaMalloc (the device's allocator) and borrowed by the engine, as
// the Python module borrows a caller's tensors. At world size 1:
//  (a) a bfloat16 checkpoint into CUDA parameters over NCCL, over host staging,
//      and over NCCL with a node reader (DataTransport::split);
//  (b) a float32 checkpoint into bfloat16 parameters (the conversion kernel);
//  (c) int8 (the quantization kernel);
//  (d) an NCCL send/recv of the process to itself in one group, its bytes then
//      checksummed on the device (the CRC-32C kernel receivers verify with);
//  (e) the fingerprint pass (every parameter read back through pinned memory)
//      and the device CRC-32C digest of every parameter (replica comparison's);
//  (f) a block-scaled FP8 checkpoint (FP8 weights and float32 grids), a
//      per-tensor FP8 checkpoint (the requantization kernel), online FP8 (the
//      amax and quantization kernels) and online block FP8 from a float32
//      checkpoint (the rounding to bfloat16 and the tile kernel);
//  (g) sharded sources (row halves of every tensor) over the host transport
//      and over NCCL's grouped exchange (views through pinned memory);
// each compared with the same reload into host memory, pointers unchanged; and
// one bench row: the reload's GB/s against a plain pinned cudaMemcpy of the
// same bytes, in the same run, then the FP8 kernels' rates (GB/s of the bytes
// each reads and writes). Run by scripts/gpu_check.sh (docs/GPU.md).
//
//   tpreload_gpu_check [--dir DIR] [--scenario tiny] [--bench-scenario tinyllama] [--iters 3]
//   tpreload_gpu_check --probe
//
// Exit status 0 when every check passed, 1 on an error (no GPU, no NCCL), 2 when
// a check failed.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/cuda_device.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/comm/nccl_transport.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/borrowed.h"
#include "tpreload/model/scenarios.h"
#include "tpreload/model/synthetic_model.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/reload/sharded_files.h"
#include "tpreload/reload/sharded_source.h"

namespace {

using namespace tpreload;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir = "/tmp/tpreload-gpu-check";
  std::string scenario = "tiny";             // the correctness checks
  std::string bench_scenario = "tinyllama";  // the bench row ("" or "none": no bench row)
  int iters = 3;
  double bucket_mb = 16;
  bool probe_only = false;  // --probe: say whether a GPU and NCCL are usable, nothing else
};

const char* kHelp =
    "tpreload_gpu_check [--dir DIR] [--scenario NAME] [--bench-scenario NAME|none] [--iters N]\n"
    "                   [--bucket-mb M]\n"
    "Reloads generated checkpoints into CUDA parameters it allocates itself (no LibTorch, world\n"
    "size 1): bf16 over NCCL, over host staging and with a node reader; float32 into bf16; int8;\n"
    "a block-scaled FP8 checkpoint;\n"
    "an NCCL self send/recv checked by the device CRC-32C; the fingerprint pass; sharded sources\n"
    "over host and NCCL transports. Each result is\n"
    "compared by CRC with the same reload into host memory. Then one bench row: the reload's\n"
    "GB/s against a pinned cudaMemcpy of the same bytes.\n"
    "  --dir             where the checkpoints are generated (kept for the next run)\n"
    "  --scenario        model of the checks (default tiny)\n"
    "  --bench-scenario  model of the bench row (default tinyllama, 2.2 GB)\n"
    "  --probe           only say whether a GPU and NCCL are usable (exit 0) or not (exit 1)\n"
    "Exit status: 0 all passed, 1 an error (no GPU, no NCCL), 2 a check failed.\n";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) raise<UsageError>(a, " needs a value");
      return argv[++i];
    };
    if (a == "--dir")
      o.dir = value();
    else if (a == "--scenario")
      o.scenario = value();
    else if (a == "--bench-scenario")
      o.bench_scenario = value();
    else if (a == "--iters")
      o.iters = std::stoi(value());
    else if (a == "--bucket-mb")
      o.bucket_mb = std::stod(value());
    else if (a == "--probe")
      o.probe_only = true;
    else if (a == "--help" || a == "-h") {
      std::cout << kHelp;
      std::exit(0);
    } else
      raise<UsageError>("unknown argument '", a, "' (see --help)");
  }
  if (o.iters < 1) raise<UsageError>("--iters must be at least 1, got ", o.iters);
  if (!(o.bucket_mb > 0)) raise<UsageError>("--bucket-mb must be > 0, got ", o.bucket_mb);
  if (o.bench_scenario == "none") o.bench_scenario.clear();
  return o;
}

// A seeded checkpoint of `config` under `dir` (generated once), every tensor in
// `dtype` where given, else in the checkpoint's own dtypes.
std::string prepare_checkpoint(const std::string& dir, const ModelConfig& config,
                               std::optional<DType> dtype) {
  if (fs::exists(dir + "/config.json")) return dir;
  std::vector<TensorSpec> specs = checkpoint_specs(config);
  if (dtype)
    for (TensorSpec& s : specs) s.dtype = *dtype;
  GenerateOptions g;
  g.values.seed = 7;
  const auto start = Clock::now();
  generate_checkpoint(dir, specs, g);
  std::ofstream(dir + "/config.json") << model_config_to_json(config);
  std::cout << "generated " << dir << " in "
            << std::chrono::duration<double>(Clock::now() - start).count() << " s\n";
  return dir;
}

// One rank's parameters for the rules, allocated here: device memory of
// `device` (cudaMalloc), or host memory where it is null. Zeroed.
class Parameters {
 public:
  Parameters(const ModelConfig& config, const BorrowedOptions& options,
             const std::shared_ptr<Device>& device) {
    const ShardingRules rules(config, options.tp_size, options.quantization,
                              options.expert_parallel);
    auto stream = device ? device->make_stream() : nullptr;
    std::vector<BorrowedTensor> tensors;
    for (const ParamSpec& spec : rules.params()) {
      std::uint64_t elements = 1;
      for (std::int64_t d : spec.shape) elements *= static_cast<std::uint64_t>(d);
      const std::uint64_t bytes = elements * dtype_size(spec.dtype);
      Buffer& b = buffers_.emplace_back(device ? device->memory().allocate(bytes)
                                               : host_allocator().allocate(bytes));
      if (stream)
        stream->zero(b.data(), bytes);
      else if (bytes)
        std::memset(b.data(), 0, bytes);
      BorrowedTensor t;
      t.name = spec.name;
      t.data = b.data();
      t.shape = spec.shape;
      t.strides.assign(spec.shape.size(), 1);
      for (std::size_t d = spec.shape.size(); d-- > 1;)
        t.strides[d - 1] = t.strides[d] * spec.shape[d];
      t.dtype = spec.dtype;
      t.device = device ? "cuda:" + std::to_string(device->ordinal()) : "cpu";
      tensors.push_back(std::move(t));
    }
    if (stream) synchronize(*stream, std::chrono::minutes(1), "zeroing the parameters");
    target_ = std::make_unique<BorrowedTarget>(config, options, std::move(tensors));
    target_->attach(device);
  }
  BorrowedTarget& target() { return *target_; }
  std::vector<const void*> pointers() const {
    std::vector<const void*> out;
    for (const ReloadTarget::Stored& s : target_->stored_parameters())
      out.push_back(s.storage.data);
    return out;
  }
  // zlib CRC-32 (read back through pinned memory) and CRC-32C digest (the
  // device kernel) of every parameter, in slot order.
  std::vector<std::uint32_t> crcs() {
    std::vector<std::uint32_t> out;
    ParameterSink& sink = target_->sink();
    for (ParamSlot s = 0; s < sink.size(); ++s) out.push_back(sink.crc32(s));
    return out;
  }
  std::vector<std::uint32_t> digests() {
    std::vector<std::uint32_t> out;
    ParameterSink& sink = target_->sink();
    for (ParamSlot s = 0; s < sink.size(); ++s)
      out.push_back(sink.crc32c(sink.storage(s).data, sink.storage(s).bytes, "a parameter"));
    return out;
  }

 private:
  std::vector<Buffer> buffers_;  // (outlive the target, which points into them)
  std::unique_ptr<BorrowedTarget> target_;
};

struct Run {
  ReloadResult last;
  double seconds = 0;  // mean over the timed iterations
};

// Reload `dir` into `target` once, then `iters` timed times, opening the
// checkpoint each time as a reload of a new checkpoint does.
Run reload(ReloadTarget& target, Communicator& control, DataTransport& data, const std::string& dir,
           const ReloadOptions& ro, int iters) {
  ReloadWorkspace workspace;
  auto source = open_weight_source(dir);
  Run run;
  run.last = reload_weights(target, control, data, source.get(), ro, &workspace);
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    source = open_weight_source(dir);
    run.last = reload_weights(target, control, data, source.get(), ro, &workspace);
    run.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  run.seconds /= std::max(iters, 1);
  return run;
}

// Host-to-device seconds for `bytes` from pinned memory, 256 MiB per copy
// (the bound of the reload's staging copies), measured now.
double pinned_copy_seconds(Device& device, std::uint64_t bytes, int iters) {
  const std::uint64_t chunk = std::min<std::uint64_t>(bytes, std::uint64_t{256} << 20);
  Buffer host = device.pinned_memory().allocate(chunk);
  Buffer dev = device.memory().allocate(bytes);
  std::memset(host.data(), 1, chunk);  // warm the pages
  auto stream = device.make_stream();
  double total = 0;
  for (int i = 0; i <= iters; ++i) {
    const auto start = Clock::now();
    for (std::uint64_t at = 0; at < bytes; at += chunk)
      stream->copy(dev.data() + at, host.data(), std::min(chunk, bytes - at),
                   CopyKind::kHostToDevice);
    synchronize(*stream, std::chrono::minutes(2), "pinned copy bound");
    if (i > 0) total += std::chrono::duration<double>(Clock::now() - start).count();
  }
  return total / iters;
}

bool report(const std::string& what, bool ok) {
  std::cout << "  " << what << ": " << (ok ? "yes" : "NO") << "\n";
  return ok;
}

std::size_t count_equal(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] == b[i];
  return n;
}

// Whole 128 x 128 blocks of every projection (head_dim 128, intermediate 1024).
const char* kFp8Model = R"({"architectures":["LlamaForCausalLM"],"hidden_size":512,
  "intermediate_size":1024,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":128,"vocab_size":1024,"torch_dtype":"bfloat16","quantization_config":{
  "quant_method":"fp8","activation_scheme":"dynamic","weight_block_size":[128,128]}})";

// The same model as a per-tensor FP8 checkpoint with static activations: the
// layers are requantized on the device (DeviceStream::requantize_fp8).
const char* kFp8TensorModel = R"({"architectures":["LlamaForCausalLM"],"hidden_size":512,
  "intermediate_size":1024,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
  "head_dim":128,"vocab_size":1024,"torch_dtype":"bfloat16","quantization_config":{
  "quant_method":"fp8","activation_scheme":"static"}})";

struct Planes {
  std::unique_ptr<Communicator> control = make_local_communicator();
  std::unique_ptr<DataTransport> host = make_communicator_transport(*control);
  std::shared_ptr<Device> device;
  std::unique_ptr<DataTransport> nccl;
};

// One checkpoint into host parameters, then into CUDA parameters over each path:
// every parameter's CRC-32 and CRC-32C digest equal, every parameter loaded,
// pointers unchanged.
bool check_reloads(Planes& p, const ModelConfig& config, const std::string& dir,
                   const std::string& label, const std::string& quantization,
                   const ReloadOptions& ro) {
  BorrowedOptions bo;
  bo.quantization = quantization;
  Parameters host(config, bo, nullptr);
  const Run cpu = reload(host.target(), *p.control, *p.host, dir, ro, 0);
  const auto want = host.crcs();
  const auto want_digests = host.digests();
  std::cout << "\n[" << label << "] host reload: " << want.size() << " parameters\n";
  bool ok = report("the host reload loaded every expected parameter", cpu.last.complete());
  const std::pair<DataTransport*, Readers> paths[] = {
      {p.nccl.get(), Readers::kOne}, {p.host.get(), Readers::kOne}, {p.nccl.get(), Readers::kNode}};
  for (const auto& [data, readers] : paths) {
    Parameters gpu(config, bo, p.device);  // fresh per path: zeros, not the last path's bytes
    const auto before = gpu.pointers();
    ReloadOptions po = ro;
    po.readers = readers;
    po.ranks_per_node = 1;
    const Run run = reload(gpu.target(), *p.control, *data, dir, po, 1);
    const auto got = gpu.crcs();
    const auto digests = gpu.digests();
    std::cout << "cuda parameters over " << data->backend() << ", readers " << readers_name(readers)
              << ": " << run.seconds << " s, staging host " << run.last.staging.host << " pinned "
              << run.last.staging.pinned << " device " << run.last.staging.device << " bytes\n";
    ok &= report("every expected parameter loaded", run.last.complete());
    ok &= report("CRC-32 (fingerprint pass) of all " + std::to_string(want.size()) +
                     " parameters equal the host reload's (" +
                     std::to_string(count_equal(want, got)) + " equal)",
                 want == got);
    ok &= report("device CRC-32C digests equal the host's (" +
                     std::to_string(count_equal(want_digests, digests)) + " equal)",
                 want_digests == digests);
    ok &= report("parameter pointers unchanged", gpu.pointers() == before);
  }
  return ok;
}

// Sharded sources into CUDA parameters: the checkpoint held as row halves
// (two boxes a tensor, as two FSDP ranks' slices would be) by this one rank,
// over the host transport and over NCCL's grouped send/recv (nothing leaves
// the rank: each view is assembled in pinned memory and copied to the
// device); every parameter's CRC-32 equal to the host reload's.
bool check_sharded(Planes& p, const ModelConfig& config, const std::string& dir,
                   const ReloadOptions& ro) {
  std::cout << "\n[sharded sources] row halves of every tensor into CUDA parameters\n";
  BorrowedOptions bo;
  Parameters host(config, bo, nullptr);
  reload(host.target(), *p.control, *p.host, dir, ro, 0);
  const auto want = host.crcs();
  auto source = open_weight_source(dir);
  std::vector<HeldTensor> held = read_split(*source, SplitBy::kRows, 0, 2);
  for (HeldTensor& h : read_split(*source, SplitBy::kRows, 1, 2)) held.push_back(std::move(h));
  const ShardedSource mine(std::move(held));
  bool ok = true;
  for (DataTransport* data : {p.host.get(), p.nccl.get()}) {
    Parameters gpu(config, bo, p.device);
    const auto before = gpu.pointers();
    const ReloadResult r = reload_weights(gpu.target(), *p.control, *data, mine, ro);
    const auto got = gpu.crcs();
    std::cout << "over " << data->backend() << ": staging pinned " << r.staging.pinned
              << ", device " << r.staging.device << " bytes\n";
    ok &= report("every expected parameter loaded", r.complete());
    ok &= report("CRC-32 of all " + std::to_string(want.size()) +
                     " parameters equal the host reload's (" +
                     std::to_string(count_equal(want, got)) + " equal)",
                 want == got);
    ok &= report("parameter pointers unchanged", gpu.pointers() == before);
  }
  return ok;
}

// (d): 64 MiB and an odd tail through NCCL's send/recv path to itself; the bytes
// received checked by the device CRC-32C kernel against the host's CRC-32C.
bool check_self_send_recv(Planes& p) {
  std::cout << "\n[nccl send/recv] a self send/recv in one group\n";
  bool ok = true;
  for (const std::uint64_t bytes : {std::uint64_t{64} << 20, std::uint64_t{12345}}) {
    Buffer host = p.device->pinned_memory().allocate(bytes);
    for (std::uint64_t i = 0; i < bytes; ++i)
      host.data()[i] = static_cast<std::byte>((i * 2654435761u) >> 24);
    Buffer src = p.device->memory().allocate(bytes), dst = p.device->memory().allocate(bytes);
    auto stream = p.device->make_stream();
    stream->zero(dst.data(), bytes);
    stream->copy(src.data(), host.data(), bytes, CopyKind::kHostToDevice);
    synchronize(*stream, std::chrono::minutes(1), "staging the send/recv bytes");
    const auto start = Clock::now();
    nccl_self_send_recv(p.device, src.data(), dst.data(), bytes, std::chrono::minutes(1));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    Buffer raw = p.device->pinned_memory().allocate(crc32c_blocks(bytes) * sizeof(std::uint32_t));
    auto* blocks = reinterpret_cast<std::uint32_t*>(raw.data());
    stream->crc32c_blocks(dst.data(), bytes, blocks);
    synchronize(*stream, std::chrono::minutes(1), "checksumming the received bytes");
    const std::uint32_t got = crc32c_from_blocks(blocks, bytes);
    const std::uint32_t want = crc32c(host.data(), bytes);
    ok &= report(std::to_string(bytes) + " bytes received equal those sent (device CRC-32C " +
                     std::to_string(got) + ", host " + std::to_string(want) + "; " +
                     std::to_string(seconds) + " s)",
                 got == want);
  }
  return ok;
}

// The reload's GB/s over NCCL against a pinned cudaMemcpy of the same bytes.
void bench_row(Planes& p, const Options& o, const ReloadOptions& ro) {
  const ModelConfig config = scenario_config(o.bench_scenario);
  const std::string dir = prepare_checkpoint(o.dir + "/" + o.bench_scenario, config, config.dtype);
  Parameters gpu(config, BorrowedOptions{}, p.device);
  const Run run = reload(gpu.target(), *p.control, *p.nccl, dir, ro, o.iters);
  const double bytes = static_cast<double>(run.last.bytes_transferred);
  const double bound = pinned_copy_seconds(*p.device, run.last.bytes_transferred, o.iters);
  std::cout << "\nbench: scenario " << o.bench_scenario << ", " << run.last.bytes_transferred
            << " bytes, bucket " << o.bucket_mb << " MiB, reload " << run.seconds << " s ("
            << bytes / run.seconds / 1e9 << " GB/s, file to device), pinned cudaMemcpy of the "
            << "same bytes " << bound << " s (" << bytes / bound / 1e9 << " GB/s), ratio "
            << run.seconds / bound << "\n";
}

// The FP8 kernels' rates: 256 Mi bfloat16 values (normal, as weights are) into
// codes per tensor (the amax pass, then the codes) and per 128 x 128 block,
// and the per-tensor requantization of as many codes in place; each in GB/s
// of the bytes it must read and write once (3 per value; 2 per code).
void fp8_kernel_rates(Device& device, int iters) {
  const std::uint64_t n = std::uint64_t{1} << 28, chunk = std::uint64_t{1} << 24;
  const std::int64_t cols = 8192, rows = static_cast<std::int64_t>(n) / cols;
  Buffer x = device.memory().allocate(n * 2);
  Buffer codes = device.memory().allocate(n);
  Buffer grid = device.memory().allocate(static_cast<std::uint64_t>((rows / 128) * (cols / 128)) *
                                         sizeof(float));
  Buffer host = device.pinned_memory().allocate(chunk * 2);
  auto* values = reinterpret_cast<std::uint16_t*>(host.data());
  std::uint32_t seed = 1;
  for (std::uint64_t i = 0; i < chunk; ++i) {  // (an exponent near 1, any sign and mantissa)
    seed = seed * 1664525u + 1013904223u;
    values[i] = static_cast<std::uint16_t>(0x3C00u | ((seed >> 16) & 0x83FFu));
  }
  // (two staged scales for the requantization, from the first to the larger)
  Buffer staged = device.pinned_memory().allocate(2 * sizeof(float));
  const float scales[2] = {0.5f, 0.75f};
  std::memcpy(staged.data(), scales, sizeof scales);
  auto stream = device.make_stream();
  for (std::uint64_t at = 0; at < n * 2; at += chunk * 2)
    stream->copy(x.data() + at, host.data(), chunk * 2, CopyKind::kHostToDevice);
  synchronize(*stream, std::chrono::minutes(1), "filling the FP8 kernels' input");
  auto seconds = [&](const auto& enqueue) {
    double total = 0;
    for (int i = 0; i <= iters; ++i) {
      const auto start = Clock::now();
      enqueue();
      synchronize(*stream, std::chrono::minutes(1), "timing an FP8 kernel");
      if (i > 0) total += std::chrono::duration<double>(Clock::now() - start).count();
    }
    return total / iters;
  };
  auto* g = reinterpret_cast<float*>(grid.data());
  auto* c = reinterpret_cast<std::uint8_t*>(codes.data());
  const double tensor = seconds([&] { stream->quantize_fp8(x.data(), DType::kBFloat16, n, c, g); });
  const double block = seconds(
      [&] { stream->quantize_fp8_block(x.data(), DType::kBFloat16, rows, cols, 128, c, g); });
  stream->copy(grid.data(), staged.data(), 2 * sizeof(float), CopyKind::kHostToDevice);
  const double requantize = seconds([&] { stream->requantize_fp8(c, n, g, 0, 0, 2, nullptr); });
  const double gb = static_cast<double>(n) / 1e9;
  std::cout << "fp8 kernels: 256 Mi bfloat16 values, per tensor " << 3 * gb / tensor
            << " GB/s, per block " << 3 * gb / block << " GB/s; requantization of as many codes "
            << 2 * gb / requantize << " GB/s\n";
}

int run_checks(const Options& o) {
  const CudaProbe probe = probe_cuda();
  std::cout << "probe: driver " << (probe.driver ? "yes" : "no") << " (version "
            << probe.driver_version << "), devices " << probe.devices
            << (probe.problem.empty() ? "" : ", " + probe.problem) << "\n";
  if (!probe.problem.empty()) raise<UsageError>(probe.problem);
  const NcclLibraryInfo nccl = load_nccl();
  std::cout << "probe: NCCL " << nccl.version << " from " << nccl.path << "\n";
  if (o.probe_only) return 0;

  Planes p;
  p.device = open_cuda_device(0);
  std::cout << "device: " << p.device->describe() << "\n";
  p.nccl = make_nccl_transport(*p.control, p.device);

  const ModelConfig config = scenario_config(o.scenario);
  const std::string base = o.dir + "/" + o.scenario;
  const std::string bf16 = prepare_checkpoint(base + "-bf16", config, DType::kBFloat16);
  const std::string f32 = prepare_checkpoint(base + "-f32", config, DType::kFloat32);
  ReloadOptions ro;
  ro.bucket_bytes = static_cast<std::uint64_t>(o.bucket_mb * 1048576);
  ReloadOptions small = ro;  // many buckets: slots reused, events polled while pending
  small.bucket_bytes = std::uint64_t{1} << 20;

  bool ok = check_reloads(p, config, bf16, "bf16, 1 MiB buckets", "", small);
  ok &= check_reloads(p, config, f32, "float32 checkpoint into bf16", "", small);
  ok &= check_reloads(p, config, bf16, "int8", "int8", small);
  // A block-scaled FP8 checkpoint: FP8 weights and float32 scale grids as bytes.
  const ModelConfig fp8_config = parse_model_config(kFp8Model, "the GPU check's FP8 model");
  const std::string fp8 = prepare_checkpoint(o.dir + "/fp8-block", fp8_config, std::nullopt);
  ok &= check_reloads(p, fp8_config, fp8, "FP8 block checkpoint", "", small);
  // Per-tensor FP8 (requantized per layer) and online FP8 (quantized per
  // layer): the device's FP8 kernels against the host's bytes.
  const ModelConfig tensor_config =
      parse_model_config(kFp8TensorModel, "the GPU check's per-tensor FP8 model");
  const std::string tensor = prepare_checkpoint(o.dir + "/fp8-tensor", tensor_config, std::nullopt);
  ok &= check_reloads(p, tensor_config, tensor, "FP8 per-tensor checkpoint", "", small);
  ok &= check_reloads(p, config, bf16, "online FP8", "fp8", small);
  ok &= check_reloads(p, config, f32, "online FP8 blocks, float32 checkpoint", "fp8-block", small);
  ok &= check_self_send_recv(p);
  ok &= check_sharded(p, config, bf16, small);
  if (!o.bench_scenario.empty()) {
    bench_row(p, o, ro);
    fp8_kernel_rates(*p.device, o.iters);
  }
  std::cout << "\ngpu check: " << (ok ? "all checks passed" : "SOME CHECKS FAILED") << "\n";
  return ok ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const char* level = std::getenv("TPRELOAD_LOG_LEVEL");
    init_logging(0, 1, level ? level : "warn");
    return run_checks(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "tpreload_gpu_check: " << e.what() << "\n";
    return 1;
  }
}
