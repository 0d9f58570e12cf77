// tpreload_gpu_check: the checks only a GPU proves, in one process and without
// MPI (the engine does not link it): a reload of a generated checkpoint into
// CUDA parameters over NCCL at world size 1, over host staging (the path of
// `--device cuda --transport mpi`), and int8 on the device, each compared by
// CRC-32 with the same reload into host parameters; parameter pointers before
// and after; and one bench row against a plain pinned cudaMemcpy of the same
// bytes, measured in the same run. Run by scripts/gpu_check.sh (docs/GPU.md).
//
//   tpreload_gpu_check --dir /tmp/gpu-check [--scenario tinyllama] [--iters 3]
//
// Exit status 0 when every check passed, 1 on an error, 2 when a check failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/cuda_device.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/comm/nccl_transport.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/model.h"
#include "tpreload/model/scenarios.h"
#include "tpreload/model/synthetic_model.h"
#include "tpreload/reload/reload.h"

namespace {

using namespace tpreload;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir = "/tmp/tpreload-gpu-check";
  std::string scenario = "tinyllama";
  int iters = 3;
  double bucket_mb = 16;
};

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
    else if (a == "--iters")
      o.iters = std::stoi(value());
    else if (a == "--bucket-mb")
      o.bucket_mb = std::stod(value());
    else if (a == "--help" || a == "-h") {
      std::cout << "tpreload_gpu_check [--dir DIR] [--scenario tinyllama|tiny] [--iters N] "
                   "[--bucket-mb M]\n"
                   "Reloads a generated checkpoint into CUDA parameters (NCCL, world size 1; host "
                   "staging;\n"
                   "int8) and compares every parameter's CRC-32 with a host reload; prints one "
                   "bench row.\n";
      std::exit(0);
    } else
      raise<UsageError>("unknown argument '", a, "' (see --help)");
  }
  if (o.iters < 1) raise<UsageError>("--iters must be at least 1");
  return o;
}

std::string prepare_checkpoint(const Options& o, const ModelConfig& config) {
  const std::string dir = o.dir + "/" + o.scenario;
  if (!fs::exists(dir + "/config.json")) {
    GenerateOptions g;
    g.values.seed = 7;
    const auto start = Clock::now();
    generate_model_checkpoint(config, dir, g);
    std::cout << "generated " << dir << " in "
              << std::chrono::duration<double>(Clock::now() - start).count() << " s\n";
  }
  return dir;
}

std::vector<std::uint32_t> crcs(TensorParallelModel& model) {
  std::vector<std::uint32_t> out;
  for (ParamSlot s = 0; s < model.sink().size(); ++s) out.push_back(model.sink().crc32(s));
  return out;
}

std::vector<const void*> pointers(const TensorParallelModel& model) {
  std::vector<const void*> out;
  for (const auto& [name, t] : model.named_parameters()) out.push_back(t.data_ptr());
  return out;
}

struct Run {
  ReloadResult last;
  double seconds = 0;  // mean over iterations
};

// Reload `dir` into `model` `iters` times (after one warm-up), opening the
// checkpoint each time as a reload of a new checkpoint does.
Run reload(TensorParallelModel& model, Communicator& control, DataTransport& data,
           const std::string& dir, const ReloadOptions& ro, int iters) {
  ReloadWorkspace workspace;
  auto source = open_weight_source(dir);
  reload_weights(model, control, data, source.get(), ro, &workspace);
  Run run;
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    source = open_weight_source(dir);
    run.last = reload_weights(model, control, data, source.get(), ro, &workspace);
    run.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  run.seconds /= iters;
  return run;
}

// Host-to-device bandwidth of `bytes` from pinned memory, one cudaMemcpy-sized
// copy per 256 MiB, measured now (the bound for the reload's staging copies).
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
    if (i > 0)
      total += std::chrono::duration<double>(Clock::now() - start).count();  // i == 0: warm-up
  }
  return total / iters;
}

bool report(const char* what, bool ok) {
  std::cout << "  " << what << ": " << (ok ? "yes" : "NO") << "\n";
  return ok;
}

int count_equal(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b) {
  int n = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] == b[i];
  return n;
}

int run_checks(const Options& o) {
  const CudaProbe probe = probe_cuda();
  std::cout << "probe: driver " << (probe.driver ? "yes" : "no") << " (version "
            << probe.driver_version << "), devices " << probe.devices
            << (probe.problem.empty() ? "" : ", " + probe.problem) << "\n";
  if (!probe.problem.empty()) raise<UsageError>(probe.problem);
  const NcclLibraryInfo nccl = load_nccl();
  std::cout << "probe: NCCL " << nccl.version << " from " << nccl.path << "\n";

  const ModelConfig config = scenario_config(o.scenario);
  const std::string dir = prepare_checkpoint(o, config);
  auto control = make_local_communicator();
  auto host_data = make_communicator_transport(*control);
  std::shared_ptr<Device> device = open_cuda_device(0);
  std::cout << "device: " << device->describe() << "\n";
  auto nccl_data = make_nccl_transport(*control, device);

  ReloadOptions ro;
  ro.bucket_bytes = static_cast<std::uint64_t>(o.bucket_mb * 1048576);
  bool ok = true;
  for (const std::string quant : {"", "int8"}) {
    ModelOptions host_options;
    host_options.quantization = quant;
    TensorParallelModel host(config, host_options);
    const Run cpu = reload(host, *control, *host_data, dir, ro, 1);
    const auto want = crcs(host);

    ModelOptions cuda_options = host_options;
    cuda_options.device = device;
    std::cout << "\n[" << (quant.empty() ? "bf16" : "int8") << "] host reload " << cpu.seconds
              << " s\n";
    // NCCL, host transport, and NCCL with a reader per node (the node's own NCCL
    // communicator, joined over its control plane: DataTransport::split).
    const std::pair<DataTransport*, Readers> paths[] = {{nccl_data.get(), Readers::kOne},
                                                        {host_data.get(), Readers::kOne},
                                                        {nccl_data.get(), Readers::kNode}};
    for (const auto& [data, readers] : paths) {
      TensorParallelModel gpu(
          config, cuda_options);  // a fresh model per path: zeros, not the last run's bytes
      const auto before = pointers(gpu);
      ReloadOptions path_options = ro;
      path_options.readers = readers;
      path_options.ranks_per_node = 1;
      const Run run = reload(gpu, *control, *data, dir, path_options, o.iters);
      const auto got = crcs(gpu);
      std::cout << "cuda parameters over " << data->backend() << ", readers "
                << readers_name(readers) << ": " << run.seconds << " s, "
                << run.last.bytes_transferred / run.seconds / 1e9 << " GB/s, staging host "
                << run.last.staging.host << " pinned " << run.last.staging.pinned << " device "
                << run.last.staging.device << " bytes\n";
      ok &= report("every expected parameter loaded", run.last.complete());
      ok &= report(("CRC-32 of all " + std::to_string(want.size()) +
                    " parameters equal the host reload's (" +
                    std::to_string(count_equal(want, got)) + " equal)")
                       .c_str(),
                   want == got);
      ok &= report("parameter pointers unchanged", pointers(gpu) == before);
      if (quant.empty() && data == nccl_data.get() && readers == Readers::kOne) {
        const double bound = pinned_copy_seconds(*device, run.last.bytes_transferred, o.iters);
        std::cout << "bench: scenario " << o.scenario << ", " << run.last.bytes_transferred
                  << " bytes, reload " << run.seconds << " s ("
                  << run.last.bytes_transferred / run.seconds / 1e9
                  << " GB/s end to end, file to device), pinned cudaMemcpy of the same bytes "
                  << bound << " s (" << run.last.bytes_transferred / bound / 1e9 << " GB/s), ratio "
                  << run.seconds / bound << "\n";
      }
    }
  }
  std::cout << "\ngpu check: " << (ok ? "all checks passed" : "SOME CHECKS FAILED") << "\n";
  return ok ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    init_logging(0, 1,
                 std::getenv("TPRELOAD_LOG_LEVEL") ? std::getenv("TPRELOAD_LOG_LEVEL") : "warn");
    return run_checks(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "tpreload_gpu_check: " << e.what() << "\n";
    return 1;
  }
}
