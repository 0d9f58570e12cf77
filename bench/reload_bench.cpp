// reload_bench: the in-place reload against the bound of the same job, in the
// style of nccl-tests. Per row: warm-up, N timed iterations (barrier-started,
// times reduced with max over ranks), bytes, algbw and busbw, peak staging per
// rank, reader copies per byte delivered, the share of the reload spent on the
// transferred bytes' CRC-32Cs (crc%), with --checksum-cost what they cost (the
// time of the same reloads without them, alternating), a wrong-bytes count (every iteration
// is verified: the bytes of parameters whose CRC-32C differs from a local load's), and the bound
// measured in the same run: the same bytes read from the same source and moved with the same
// collectives and bucket sizes into destination buffers, with no model logic. Each timed reload
// opens the checkpoint, as reloading a new checkpoint does (--keep-open reuses one).
//
//   launch/mpirun.sh 4 build/bench/reload_bench --scenario tinyllama --dir /tmp/tpreload-bench
#include <CLI/CLI.hpp>

#include <ATen/ATen.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "../src/reload/pipeline.h"    // (the kept plan's exchanges, for the sharded bound)
#include "../src/reload/stream.h"      // (a stream's segment size)
#include "../tests/support/streams.h"  // (a stream that counts what the reader holds of it)
#include "tpreload/checkpoint/synthetic.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/core/quantization.h"
#include "tpreload/model/kernel_shards.h"
#include "tpreload/model/model.h"
#include "tpreload/model/scenarios.h"
#include "tpreload/model/synthetic_model.h"
#include "tpreload/reload/plan.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/sharded_files.h"
#include "tpreload/runtime/program.h"

namespace {

using namespace tpreload;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string scenario = "tiny";
  std::string dir = "/tmp/tpreload-bench";
  int tp = 0;
  std::vector<std::string> formats = {"checkpoint", "kernel"};
  std::vector<std::string> quantizations = {"none"};
  std::vector<std::string> distributions = {"broadcast", "scatter"};
  // one: the reader rank reads and sends; node: a reader per node sends within
  // it; all: every rank reads its own slices.
  std::vector<std::string> readers = {"one"};
  int ranks_per_node = 0;               // readers node: world ranks per node (0: MPI's nodes)
  bool rotate_broadcast_roots = false;  // readers node: the readers take broadcast buckets in turn
  bool baseline = false;                // also time every rank reading the whole checkpoint
  bool cold = false;  // drop the checkpoint from the page cache before each timed read
  std::vector<double> bucket_mb = {ReloadOptions{}.bucket_bytes / 1048576.0};
  int pipeline_depth = ReloadOptions{}.pipeline_depth;
  std::uint64_t scatter_replicated_bytes = ReloadOptions{}.scatter_replicated_bytes;
  int warmup = 1;
  int iters = 3;
  bool keep_open = false;
  bool parse_every_open = false;
  bool zero_copy = false;
  bool no_checksums = false;
  bool checksum_cost = false;  // also time each reload without checksums, alternating
  bool expert_parallel = false;
  bool retain_freed_memory = false;  // as reload_runner does (retain_freed_memory())
  bool retained = false;             // ... and glibc took the settings
};

double max_over_ranks(Communicator& world, double seconds) {
  std::int64_t us = static_cast<std::int64_t>(seconds * 1e6);
  world.allreduce_ints(&us, 1, IntOp::kMax);
  return us / 1e6;
}

// Drops the files under `path` from the page cache (posix_fadvise DONTNEED), so
// that the next read comes from the disk. Every rank on a node may call it.
void drop_from_page_cache(const std::string& path) {
  auto drop = [](const fs::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      raise<CheckpointError>("cannot open '", file.string(),
                             "' to drop it from the cache: ", std::strerror(errno));
    if (::fdatasync(fd) != 0)
      raise<CheckpointError>("fdatasync of '", file.string(), "' failed: ", std::strerror(errno));
    const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (rc != 0)
      raise<CheckpointError>("posix_fadvise(DONTNEED) failed on '", file.string(),
                             "': ", std::strerror(rc));
  };
  if (fs::is_regular_file(path)) return drop(path);
  for (const auto& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file()) drop(e.path());
}

// Rank 0 generates the checkpoint (and kernel shards) once; reruns reuse them
// while their config.json is the scenario's (one a scenario of that name had
// before is generated again).
std::string prepare_checkpoint(const BenchOptions& o, const ModelConfig& config,
                               Communicator& world) {
  const std::string dir = o.dir + "/" + o.scenario;
  if (world.rank() == 0 && fs::exists(dir + "/config.json") &&
      !config_differences(load_model_config(dir + "/config.json"), config).empty()) {
    log().info("{}: its config.json is not the scenario's; generating it again", dir);
    fs::remove_all(dir);
  }
  if (world.rank() == 0 && !fs::exists(dir + "/config.json")) {
    GenerateOptions g;
    g.values.seed = 1;
    log().info("generating {} checkpoint in {}", o.scenario, dir);
    generate_model_checkpoint(config, dir, g);
  }
  world.barrier();
  return dir;
}

std::string prepare_kernel_shards(const std::string& dir, const ModelConfig& config, int tp,
                                  const std::string& quantization, bool expert_parallel,
                                  Communicator& world) {
  const std::string out = dir + "/kernel-tp" + std::to_string(tp) +
                          (quantization.empty() ? "" : "-" + quantization) +
                          (expert_parallel ? "-ep" : "");
  if (world.rank() == 0 && !fs::exists(out + "/kernel_format.json")) {
    auto source = open_weight_source(dir);
    log().info("writing kernel-format shards {}", out);
    write_kernel_shards(config, *source, out, {tp, quantization, expert_parallel});
  }
  world.barrier();
  return out;
}

// `bytes` read from the pieces' tensors of bucket `b` into `into`, each read
// starting at its piece's first row (then from the tensors' starts again when
// the bucket holds more than its pieces' rows from there).
void read_raw(const Plan& plan, const SourceMetadata& md, WeightSource& source, const Bucket& b,
              std::uint64_t bytes, std::byte* into) {
  std::uint64_t at = 0;
  for (std::size_t k = 0; at < bytes; ++k) {
    const Piece& p = b.pieces[k % b.pieces.size()];
    const TensorInfo& info = md.tensors[plan.tensors[p.planned].index];
    const std::uint64_t row = info.shape.empty() ? info.nbytes : info.nbytes / info.shape[0];
    const std::uint64_t start = k < b.pieces.size() ? std::min(info.nbytes, p.row_begin * row) : 0;
    const std::uint64_t n = std::min(bytes - at, info.nbytes - start);
    source.read(plan.tensors[p.planned].index, {start, n}, MutableBytes(into + at, n));
    at += n;
  }
}

// Every rank reading: this rank's slices of one bucket, each write's source rows
// read where the file has them, into `into` one after the other: contiguous rows
// as requests of one read_many (the source merges those that follow each other
// in a file into one preadv, as the reload's direct path does), a row-parallel
// window's rows with one split read of their span (a preadv for safetensors),
// the bytes between windows into `gap`. Returns the bytes placed.
std::uint64_t read_own_slices(const BucketApply& a, const ShardingRules& rules,
                              WeightSource& source, std::byte* into, std::vector<std::byte>& gap,
                              std::vector<MutableBytes>& parts, std::vector<ReadRequest>& reads) {
  std::uint64_t at = 0;
  reads.clear();
  for (std::size_t i = 0; i < a.writes.size(); ++i) {
    const RowWrite& w = a.writes[i];
    if (w.rows <= 0) continue;
    const std::uint64_t width = write_source_row_bytes(w, rules.params().at(w.slot));
    const auto rows = static_cast<std::uint64_t>(w.rows);
    const std::size_t tensor = a.sources.at(i).tensor;
    if (w.src_pitch <= width) {
      reads.push_back(
          {tensor, {w.src_offset, rows * width}, MutableBytes(into + at, rows * width)});
      at += rows * width;
      continue;
    }
    gap.resize(w.src_pitch - width);
    parts.clear();
    for (std::uint64_t r = 0; r < rows; ++r, at += width) {
      parts.emplace_back(into + at, width);
      if (r + 1 < rows) parts.emplace_back(gap.data(), gap.size());
    }
    source.read_split(tensor, {w.src_offset, (rows - 1) * w.src_pitch + width}, parts);
  }
  source.read_many(reads);
  return at;
}

// The bound: per bucket of the same plan, the reader reads the bucket's bytes from
// the source into a buffer and moves them with the same collective into
// destination buffers. No slicing, no model. With every rank reading (`own`:
// its direct applies), each rank reads its own slices of each bucket
// (read_own_slices: merged reads of contiguous rows, a split read of each
// window's rows, as the file lays them out), one
// after the other into one buffer as large as all of them (the bytes land in
// memory the size of its parameters, as the reload's do), and nothing moves.
double measure_bound(const Plan& plan, const SourceMetadata& md, WeightSource* source,
                     Communicator& world, int reader, const std::vector<BucketApply>* own,
                     const ShardingRules& rules, const std::function<void()>& before_clock) {
  const bool all = own != nullptr;
  std::uint64_t largest = 0, own_bytes = 0;
  for (const Bucket& b : plan.buckets) largest = std::max(largest, b.bytes);
  std::vector<std::byte> gap;
  std::vector<MutableBytes> parts;
  std::vector<ReadRequest> reads;
  if (all) {  // the buffer's size: a pass's bytes, counted without reading
    for (const BucketApply& a : *own)
      for (const RowWrite& w : a.writes) {
        own_bytes += static_cast<std::uint64_t>(std::max<std::int64_t>(0, w.rows)) *
                     write_source_row_bytes(w, rules.params().at(w.slot));
      }
  }
  std::vector<std::byte> send(world.rank() == reader && !all ? largest : 0),
      recv(all ? own_bytes : largest);
  auto pass = [&] {
    std::uint64_t at = 0;
    for (std::size_t k = 0; k < plan.buckets.size(); ++k) {
      const Bucket& b = plan.buckets[k];
      if (all) {
        at += read_own_slices((*own)[k], rules, *source, recv.data() + at, gap, parts, reads);
        continue;
      }
      if (world.rank() == reader) read_raw(plan, md, *source, b, b.bytes, send.data());
      if (b.scatter)
        world.scatterv(ConstBytes(send.data(), send.size()), b.ranges,
                       MutableBytes(recv.data(), b.ranges[world.rank()].length), reader);
      else
        world.broadcast(MutableBytes(world.rank() == reader ? send.data() : recv.data(), b.bytes),
                        reader);
    }
  };
  // Warm, as a live model's memory is: by one untimed pass, since here the
  // kernel's first write into a user page (a read landing there) costs more
  // than the process's own first touch (docs/PERFORMANCE.md, "Component figures":
  // first_touch_bench).
  pass();
  before_clock();  // (--cold: the files leave the page cache again)
  world.barrier();
  const auto start = Clock::now();
  pass();
  return max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
}

// A parameter's bytes and their CRC-32C.
std::pair<std::uint64_t, std::uint32_t> bytes_and_crc(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto n = static_cast<std::uint64_t>(c.numel() * c.element_size());
  return {n, crc32c(c.data_ptr(), n)};
}

// The bytes of the parameters of `model` whose CRC-32C differs from `reference`'s.
std::int64_t wrong_bytes(const TensorParallelModel& model,
                         const std::map<std::string, std::uint32_t>& reference) {
  std::int64_t wrong = 0;
  for (const auto& [name, want] : reference) {
    const auto [n, crc] = bytes_and_crc(model.named_parameters().at(name));
    if (crc != want) wrong += static_cast<std::int64_t>(n);
  }
  return wrong;
}

void scramble(TensorParallelModel& model) {
  for (const auto& [name, t] : model.named_parameters())
    std::memset(t.data_ptr(), 0x5A, t.numel() * t.element_size());
}

struct Row {
  std::string format, quantization, distribution;
  double bucket_mb;
  // one, node, all, "whole" (every rank loads the whole checkpoint), or
  // "sharded" (every rank holds a row slice of every tensor, as a trainer's
  // FSDP ranks do, and the ranks move what each needs point to point).
  std::string readers = "one";
  // sharded: the bytes the busiest rank and the average rank sent.
  double sent_max = 0, sent_mean = 0;
  // stream: the most bytes of the stream the reader held at once, of all of it.
  std::uint64_t held_most = 0, held_total = 0, largest_tensor = 0;
  double seconds = 0, bound = 0;
  double checksum = 0;  // of `seconds`: computing and verifying CRC-32Cs (max over ranks)
  // --checksum-cost: each iteration's reload with checksums and the one without
  // (empty without the option).
  std::vector<double> checked = {}, unchecked = {};
  std::uint64_t bytes = 0, staging = 0, copied = 0;
  std::int64_t wrong = 0;
  // Pipeline depth, the deepest rank's (chosen per rank by default); 0, printed
  // "-", where no rank ran a pipeline (--readers all into host memory).
  std::int64_t depth = 0;
  // crc%: the share of the reload in CRC-32C; crcCost%: the reload's time with
  // checksums less without, as a share of it: the median of the iterations'
  // differences over the median time with them (one slow reload of either kind
  // moves a mean of differences by its whole delay; a median, by little).
  double crc_percent() const { return 100 * checksum / seconds; }
  bool cost_measured() const { return !unchecked.empty(); }
  double crc_cost_percent() const {
    std::vector<double> differences;
    for (std::size_t i = 0; i < checked.size(); ++i)
      differences.push_back(checked[i] - unchecked.at(i));
    return 100 * median(differences) / median(checked);
  }
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
};

// This rank's model of the row, and its reference: the CRC-32C of each of its
// parameters loaded locally from the same files, no transport (a copy of them
// would double the memory a real-width scenario needs).
struct RankModel {
  TensorParallelModel model;
  std::map<std::string, std::uint32_t> reference;

  RankModel(const BenchOptions& o, const ModelConfig& config, const std::string& quant,
            const std::string& path, Communicator& world)
      : model(config, options(o, quant, world)) {
    auto local = open_weight_source(path);
    model.load_weights(*local);
    for (const auto& [name, t] : model.named_parameters())
      reference[name] = bytes_and_crc(t).second;
  }
  static ModelOptions options(const BenchOptions& o, const std::string& quant,
                              Communicator& world) {
    ModelOptions mo;
    mo.tp_size = o.tp > 0 ? o.tp : world.size();
    mo.tp_rank = world.rank() % mo.tp_size;
    mo.quantization = quant;
    mo.expert_parallel = o.expert_parallel;
    return mo;
  }
  // Bytes that differ from the reference on any rank (collective).
  std::int64_t wrong(Communicator& world) const {
    std::int64_t n = wrong_bytes(model, reference);
    world.allreduce_ints(&n, 1, IntOp::kSum);
    return n;
  }
};

// Before a timed read with --cold: the files leave the page cache. The cache is
// per node: one rank of each node drops them, the others wait.
void cool(const BenchOptions& o, const std::string& path, Communicator& world) {
  if (!o.cold) return;
  if (world.node_leader() == world.rank()) drop_from_page_cache(path);
  world.barrier();
}

Row run_row(const BenchOptions& o, const ModelConfig& config, const std::string& ckpt_dir, Row row,
            Communicator& world) {
  const int tp = o.tp > 0 ? o.tp : world.size();
  const std::string quant = row.quantization == "none" ? "" : row.quantization;
  const bool kernel = row.format == "kernel";
  const std::string path =
      kernel ? prepare_kernel_shards(ckpt_dir, config, tp, quant, o.expert_parallel, world)
             : ckpt_dir;
  RankModel rank_model(o, config, quant, path, world);
  TensorParallelModel& model = rank_model.model;
  if (row.readers == "all") row.distribution = "scatter";  // its one layout (and the bound's)
  ReloadOptions ro;
  ro.format = kernel ? WeightFormat::kKernel : WeightFormat::kCheckpoint;
  ro.distribution =
      row.distribution == "scatter" ? Distribution::kScatter : Distribution::kBroadcast;
  ro.bucket_bytes = static_cast<std::uint64_t>(row.bucket_mb * 1024 * 1024);
  ro.pipeline_depth = o.pipeline_depth;
  ro.scatter_replicated_bytes = o.scatter_replicated_bytes;
  ro.zero_copy = o.zero_copy;
  ro.checksums = !o.no_checksums;
  ro.readers = parse_readers(row.readers).value_or(Readers::kOne);
  ro.ranks_per_node = ro.readers == Readers::kNode ? o.ranks_per_node : 0;
  ro.rotate_broadcast_roots = o.rotate_broadcast_roots && ro.readers == Readers::kNode;
  const bool all = ro.readers == Readers::kAll;
  const bool reads = opens_source(ro, world.rank());
  auto source = reads ? open_weight_source(path) : nullptr;
  // As a serving engine keeps it (ReloadableModel does). A kept plan is keyed by
  // every option, checksums included: the reloads without checksums of
  // --checksum-cost keep theirs in a workspace of their own, or each reload
  // would plan again.
  ReloadWorkspace workspace, unchecked_workspace;
  // --checksum-cost: each iteration also reloads without checksums (every rank
  // reading sends nothing and sums nothing), warmed alike.
  const bool cost = o.checksum_cost && !o.no_checksums && !all;
  for (int i = 0; i < o.warmup; ++i) {
    reload_weights(model, world, source.get(), ro, &workspace);
    if (!cost) continue;
    ReloadOptions unchecked = ro;
    unchecked.checksums = false;
    reload_weights(model, world, source.get(), unchecked, &unchecked_workspace);
  }
  // One timed reload (max over ranks), its bytes verified.
  auto timed = [&](bool checksums) {
    scramble(model);
    cool(o, path, world);
    ro.checksums = checksums;
    ReloadWorkspace& kept = checksums == !o.no_checksums ? workspace : unchecked_workspace;
    world.barrier();  // every rank starts the clock together, as the bound's do
    const auto start = Clock::now();
    if (!o.keep_open && reads)
      source = open_weight_source(path, o.parse_every_open ? nullptr : kept.known_listing());
    const ReloadResult r = reload_weights(model, world, source.get(), ro, &kept);
    const double seconds =
        max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
    row.wrong += rank_model.wrong(world);
    return std::make_pair(seconds, r);
  };
  // The reloads without checksums go first on odd iterations and second on even
  // ones, so that drift in the machine's speed falls on both alike (evenly with
  // an even --iters).
  for (int i = 0; i < o.iters; ++i) {
    if (cost && i % 2) row.unchecked.push_back(timed(false).first);
    const auto [seconds, r] = timed(!o.no_checksums);
    if (cost && i % 2 == 0) row.unchecked.push_back(timed(false).first);
    if (cost) row.checked.push_back(seconds);
    row.seconds += seconds;
    // Every rank reading: the bytes of its parameters (what it must place; not
    // total_bytes(), which pads each parameter to 256 bytes for a second copy).
    if (all) {
      row.bytes = 0;
      for (ParamSlot s = 0; s < model.sink().size(); ++s)
        row.bytes += model.sink().storage(s).bytes;
    } else {
      row.bytes = r.bytes_transferred;
    }
    row.checksum += r.seconds.checksum;
    row.staging = std::max(row.staging, r.peak_staging_bytes);
    row.depth = r.pipeline_depth;
    row.copied = r.bytes_copied_on_reader;
  }
  world.allreduce_ints(&row.depth, 1, IntOp::kMax);
  row.seconds /= o.iters;
  row.checksum /= o.iters;
  // The bound: the same plan's buckets, raw, of the source as the reload lists it
  // (Phi-3: stacked tensors as the parts the loaders take).
  std::unique_ptr<WeightSource> view;
  if (source && !kernel) view = loader_view(*source, config);
  WeightSource* listed = view ? view.get() : source.get();
  SourceMetadata md;
  std::vector<std::uint8_t> payload;
  if (world.rank() == 0)
    payload = serialize_metadata(listed->describe(), listed->tensors(), listed->kernel_format());
  std::int64_t size = payload.size();
  world.broadcast(MutableBytes(&size, 8), 0);
  payload.resize(size);
  world.broadcast(MutableBytes(payload.data(), payload.size()), 0);
  md = parse_metadata(payload);
  const PlanOptions plan_options{
      ro.format, ro.distribution, ro.bucket_bytes, world.size(), tp, ro.scatter_replicated_bytes};
  const Plan plan = make_plan(md, model.rules(), plan_options);
  std::vector<BucketApply> own;  // every rank reading: its slices, as the direct path reads them
  if (all) own = resolve_direct_applies(plan, md, model.rules(), plan_options, world.rank());
  // A reader per node: the one reader's bound scaled by the share of its bytes
  // the busiest node reader reads (1 / nodes when the tp group spans the nodes;
  // all of it for broadcast buckets, or nodes that each hold a whole tp group;
  // with rotated roots, its turns of the broadcast buckets).
  double share = 1;
  if (ro.readers == Readers::kNode) {
    std::vector<std::int64_t> node(world.size(), 0);
    node[world.rank()] = node_of(world, ro);
    allreduce_ints(world, node, IntOp::kSum);
    std::vector<int> leaders;  // every node's first rank, ascending: the turns' order
    for (int w = 0; w < world.size(); ++w)
      if (node[w] == w) leaders.push_back(w);
    auto reads = [&](auto in_node) {  // bytes a reader of these ranks reads
      std::uint64_t n = 0;
      std::size_t turn = 0;
      for (const Bucket& b : plan.buckets) {
        if (!b.scatter) {
          const int root = leaders[turn++ % leaders.size()];
          if (!ro.rotate_broadcast_roots || in_node(root)) n += b.bytes;
          continue;
        }
        std::vector<bool> seen(tp, false);  // a replica's region is its tp rank's
        for (int w = 0; w < world.size(); ++w)
          if (in_node(w) && !seen[w % tp]) {
            seen[w % tp] = true;
            n += b.ranges[w].length;
          }
      }
      return n;
    };
    std::uint64_t busiest = 0;
    for (int w = 0; w < world.size(); ++w)
      if (node[w] == w) busiest = std::max(busiest, reads([&](int v) { return node[v] == w; }));
    std::uint64_t one = 0;  // what the one reader's bound reads: every region, replicas too
    for (const Bucket& b : plan.buckets) one += b.bytes;
    share = one ? double(busiest) / one : 1.0;
  }
  for (int i = 0; i < o.iters; ++i)
    row.bound += share * measure_bound(plan, md, listed, world, 0, all ? &own : nullptr,
                                       model.rules(), [&] { cool(o, path, world); });
  row.bound /= o.iters;
  return row;
}

// Sharded sources: every rank holds rows [r * n / world, ...) of every tensor
// (read from the checkpoint once, untimed, as a trainer holds its shards) and
// the reload moves what each rank needs point to point over MPI's data
// transport. Its bound: the same exchanges (the kept plan's per-bucket byte
// counts) between raw buffers, no packing, no model.
Row run_sharded_row(const BenchOptions& o, const ModelConfig& config, const std::string& ckpt_dir,
                    Row row, MpiCommunicator& world) {
  const std::string quant = row.quantization == "none" ? "" : row.quantization;
  RankModel rank_model(o, config, quant, ckpt_dir, world);
  TensorParallelModel& model = rank_model.model;
  row.distribution = "scatter";
  std::vector<HeldTensor> held;
  {
    auto source = open_weight_source(ckpt_dir);
    held = read_split(*source, SplitBy::kRows, world.rank(), world.size());
  }
  const ShardedSource mine(std::move(held));
  const auto data = world.make_data_transport();
  ReloadOptions ro;
  ro.bucket_bytes = static_cast<std::uint64_t>(row.bucket_mb * 1024 * 1024);
  ro.checksums = !o.no_checksums;
  ReloadWorkspace workspace;
  for (int i = 0; i < o.warmup; ++i) reload_weights(model, world, *data, mine, ro, &workspace);
  for (int i = 0; i < o.iters; ++i) {
    scramble(model);
    world.barrier();
    const auto start = Clock::now();
    const ReloadResult r = reload_weights(model, world, *data, mine, ro, &workspace);
    row.seconds +=
        max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
    row.wrong += rank_model.wrong(world);
    row.bytes = r.bytes_transferred;
    row.checksum += r.seconds.checksum;
    row.staging = std::max(row.staging, r.peak_staging_bytes);
    row.depth = r.pipeline_depth;
    std::uint64_t sum = 0;
    for (std::uint64_t b : r.bytes_sent_by_rank) sum += b;
    row.sent_max = static_cast<double>(r.bytes_transferred);
    row.sent_mean = static_cast<double>(sum) / world.size();
  }
  row.seconds /= o.iters;
  row.checksum /= o.iters;
  // The bound: each bucket's exchange, raw.
  const tpreload::detail::CachedPlan& plan = *workspace.cached_plan();
  const auto n = static_cast<std::size_t>(world.size()),
             me = static_cast<std::size_t>(world.rank());
  std::vector<std::vector<std::uint64_t>> counts;
  std::uint64_t most_out = 0, most_in = 0;
  for (const TransferPlan& x : plan.exchanges) {
    auto& c = counts.emplace_back(n * n, 0);
    for (const TransferPlan::Transfer& t : x.transfers)
      if (t.from != t.to)
        c[static_cast<std::size_t>(t.from) * n + static_cast<std::size_t>(t.to)] += t.bytes;
    std::uint64_t out = 0, in = 0;
    for (std::size_t r = 0; r < n; ++r) out += c[me * n + r], in += c[r * n + me];
    most_out = std::max(most_out, out);
    most_in = std::max(most_in, in);
  }
  std::vector<std::byte> send(most_out, std::byte{1}), recv(most_in, std::byte{0});  // (warm)
  for (int i = 0; i < o.iters; ++i) {
    world.barrier();
    const auto start = Clock::now();
    for (const auto& c : counts) {
      std::uint64_t out = 0, in = 0;
      for (std::size_t r = 0; r < n; ++r) out += c[me * n + r], in += c[r * n + me];
      data->exchange(ConstBytes(send.data(), out), MutableBytes(recv.data(), in), c)->wait();
    }
    row.bound += max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
  }
  row.bound /= o.iters;
  return row;
}

// Weight streams: the reader rank holds every tensor of the checkpoint in
// memory (read once, untimed, as a trainer's gathered tensors) and hands them
// over as a stream, taken a segment (bucket x depth) at a time. Its bound: the
// same tensors as one in-memory source, which the reader holds whole for the
// whole reload (what the stream spares).
Row run_stream_row(const BenchOptions& o, const ModelConfig& config, const std::string& ckpt_dir,
                   Row row, Communicator& world) {
  const std::string quant = row.quantization == "none" ? "" : row.quantization;
  RankModel rank_model(o, config, quant, ckpt_dir, world);
  TensorParallelModel& model = rank_model.model;
  std::vector<InMemoryTensor> tensors;  // (the reader's)
  if (world.rank() == 0) {
    auto source = open_weight_source(ckpt_dir);
    for (std::size_t i = 0; i < source->tensors().size(); ++i) {
      const TensorInfo& t = source->tensors()[i];
      auto bytes = std::make_shared<std::vector<std::byte>>(t.nbytes);
      source->read(i, {0, t.nbytes}, MutableBytes(bytes->data(), bytes->size()));
      tensors.push_back(
          {t.name, t.dtype, t.shape, ConstBytes(bytes->data(), bytes->size()), bytes});
      row.held_total += t.nbytes;
      row.largest_tensor = std::max(row.largest_tensor, t.nbytes);
    }
  }
  ReloadOptions ro;
  ro.distribution =
      row.distribution == "scatter" ? Distribution::kScatter : Distribution::kBroadcast;
  ro.bucket_bytes = static_cast<std::uint64_t>(row.bucket_mb * 1024 * 1024);
  ro.pipeline_depth = o.pipeline_depth;
  ro.checksums = !o.no_checksums;
  ReloadWorkspace workspace;
  // Seconds of `reload` (collective), the most over the ranks.
  auto timed = [&](const std::function<ReloadResult()>& reload) {
    scramble(model);
    world.barrier();
    const auto start = Clock::now();
    const ReloadResult r = reload();
    const double seconds =
        max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
    row.wrong += rank_model.wrong(world);
    return std::make_pair(seconds, r);
  };
  auto streamed = [&] {
    auto counts = std::make_shared<testing::StreamCounts>();
    auto stream = world.rank() == 0 ? testing::counting_stream(tensors, counts) : nullptr;
    ReloadResult r = reload_from_stream(model, world, stream.get(), ro, &workspace);
    row.held_most = std::max(row.held_most, counts->most);
    return r;
  };
  for (int i = 0; i < o.warmup; ++i) streamed();
  for (int i = 0; i < o.iters; ++i) {
    const auto [seconds, r] = timed(streamed);
    row.seconds += seconds;
    row.bytes = r.bytes_transferred;
    row.checksum += r.seconds.checksum;
    row.staging = std::max(row.staging, r.peak_staging_bytes);
    row.copied = r.bytes_copied_on_reader;
    row.depth = r.pipeline_depth;
  }
  row.seconds /= o.iters;
  row.checksum /= o.iters;
  auto whole = [&] {
    auto source = world.rank() == 0 ? make_in_memory_source(tensors) : nullptr;
    return reload_weights(model, world, source.get(), ro, &workspace);
  };
  whole();  // (its plan made, untimed)
  for (int i = 0; i < o.iters; ++i) row.bound += timed(whole).first;
  row.bound /= o.iters;
  return row;
}

// What users run today when each worker loads from disk (vLLM's default): every
// rank opens the whole checkpoint and loads it through the weight loaders,
// keeping its slices. Its bound: every rank reading every byte of the files.
Row run_whole_row(const BenchOptions& o, const ModelConfig& config, const std::string& ckpt_dir,
                  Row row, Communicator& world) {
  RankModel rank_model(o, config, "", ckpt_dir, world);
  TensorParallelModel& model = rank_model.model;
  for (int i = 0; i < o.iters; ++i) {
    scramble(model);
    cool(o, ckpt_dir, world);
    const auto start = Clock::now();
    auto source = open_weight_source(ckpt_dir);
    model.load_weights(*source);
    row.seconds +=
        max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
    row.bytes = source->bytes_read();
    row.wrong += rank_model.wrong(world);
  }
  row.seconds /= o.iters;
  auto source = open_weight_source(ckpt_dir);
  std::size_t largest = 0;
  for (std::size_t t = 0; t < source->tensors().size(); ++t)
    if (source->tensors()[t].nbytes > source->tensors()[largest].nbytes) largest = t;
  const std::uint64_t most = source->tensors().empty() ? 0 : source->tensors()[largest].nbytes;
  std::vector<std::byte> buffer(most);
  // Warm before the clock starts, by a read landing in every page (see measure_bound).
  if (most) source->read(largest, {0, most}, MutableBytes(buffer.data(), most));
  for (int i = 0; i < o.iters; ++i) {
    cool(o, ckpt_dir, world);
    const auto start = Clock::now();
    for (std::size_t t = 0; t < source->tensors().size(); ++t) {
      const std::uint64_t n = source->tensors()[t].nbytes;
      source->read(t, {0, n}, MutableBytes(buffer.data(), n));
    }
    row.bound += max_over_ranks(world, std::chrono::duration<double>(Clock::now() - start).count());
  }
  row.bound /= o.iters;
  return row;
}

void print_header(const BenchOptions& o, const ModelConfig& c, Communicator& world) {
  if (world.rank() != 0) return;
  std::cout << "# reload_bench scenario=" << o.scenario << " layers=" << c.num_hidden_layers
            << " hidden=" << c.hidden_size << " world=" << world.size()
            << " tp=" << (o.tp > 0 ? o.tp : world.size())
            << (o.expert_parallel ? " experts=expert-parallel" : "") << " warmup=" << o.warmup
            << " iters=" << o.iters << (o.retained ? " malloc=retain" : "")
            << (o.rotate_broadcast_roots ? " node-readers=rotated-broadcast-roots" : "")
            << "\n# busbw: broadcast factor 1, scatter (n-1)/n; bound = same bytes, same "
               "collectives, no model\n"
            << std::left << std::setw(11) << "# format" << std::setw(6) << "quant" << std::setw(10)
            << "dist" << std::setw(8) << "readers" << std::right << std::setw(8) << "bucketMB"
            << std::setw(6) << "depth" << std::setw(14) << "bytes" << std::setw(10) << "time(s)"
            << std::setw(10) << "algbw" << std::setw(10) << "busbw" << std::setw(10) << "bound(s)"
            << std::setw(8) << "ratio" << std::setw(12) << "stagingMB" << std::setw(9) << "copies"
            << std::setw(8) << "crc%" << std::setw(9) << "crcCost%" << std::setw(8) << "wrong"
            << "\n";
}

void print_row(const Row& r, Communicator& world) {
  if (world.rank() != 0) return;
  const int n = world.size();
  const double algbw = r.bytes / r.seconds / 1e9;
  const double factor =
      r.distribution == "scatter" && r.readers == "one" && n > 1 ? double(n - 1) / n : 1.0;
  std::cout << std::left << std::setw(11) << r.format << std::setw(6) << r.quantization
            << std::setw(10) << r.distribution << std::setw(8) << r.readers << std::right
            << std::fixed << std::setprecision(1) << std::setw(8) << r.bucket_mb << std::setw(6)
            << (r.depth ? std::to_string(r.depth) : "-") << std::setw(14) << r.bytes
            << std::setprecision(4) << std::setw(10) << r.seconds << std::setprecision(2)
            << std::setw(10) << algbw << std::setw(10) << algbw * factor << std::setprecision(4)
            << std::setw(10) << r.bound << std::setprecision(2) << std::setw(8)
            << r.seconds / r.bound << std::setprecision(1) << std::setw(12) << r.staging / 1048576.0
            << std::setprecision(2) << std::setw(9) << (r.bytes ? double(r.copied) / r.bytes : 0.0)
            << std::setprecision(1) << std::setw(8) << r.crc_percent() << std::setw(9);
  if (r.cost_measured())
    std::cout << r.crc_cost_percent();
  else
    std::cout << "-";
  std::cout << std::setw(8) << r.wrong << std::endl;
}

// The targets of docs/PERFORMANCE.md, judged on the rows of this run (a target
// whose rows were not run is not printed).
void print_targets(const BenchOptions& o, const std::vector<Row>& rows, Communicator& world) {
  if (world.rank() != 0) return;
  bool missed = false;
  // "1.53 MISSED by 0.23" (how far over the limit, in the value's unit), or "met".
  auto verdict = [&missed](double value, double limit, const char* unit = "") {
    std::ostringstream out;
    out << std::fixed << std::setprecision(2) << value << unit;
    if (value <= limit) {
      out << " met";
    } else {
      out << " MISSED by " << std::setprecision(3) << value - limit << unit;
      missed = true;
    }
    return out.str();
  };
  std::cout << "# targets (warm page cache, this machine)\n";
  const bool large =
      o.scenario == "tinyllama" || o.scenario == "llama3-8b-4l" || o.scenario == "llama3-8b-4l-fp8";
  const bool scaled = world.size() == 2 || world.size() == 4;
  const Row* whole = nullptr;
  for (const Row& r : rows)
    if (r.readers == "whole") whole = &r;
  for (const Row& r : rows) {
    if (r.readers == "whole") continue;
    const std::string what =
        r.format + " " + r.quantization + " " + r.distribution + " readers " + r.readers;
    if (r.readers == "all" || r.readers == "node") {
      std::cout << "#   readers " << r.readers << " within 1.2x its bound, " << what << ": "
                << verdict(r.seconds / r.bound, 1.2) << "\n";
      for (const Row& one : rows)
        if (one.readers == "one" && one.format == r.format && one.quantization == r.quantization &&
            one.bucket_mb == r.bucket_mb)
          std::cout << "#   readers " << r.readers << " >= 1.5x faster than one ("
                    << one.distribution << "), " << what << ": "
                    << verdict(r.seconds / one.seconds, 1 / 1.5) << " of its time\n";
    }
    if (r.readers == "stream") {
      const double limit = static_cast<double>(tpreload::detail::kBucketsPerSegment) * r.bucket_mb *
                               1048576 * static_cast<double>(std::max(r.depth, std::int64_t{1})) +
                           static_cast<double>(r.largest_tensor);
      std::cout << "#   stream: the reader holds <= " << tpreload::detail::kBucketsPerSegment
                << " x bucket x depth + one tensor (" << std::fixed << std::setprecision(1)
                << r.held_most / 1048576.0 << " of " << r.held_total / 1048576.0 << " MB), " << what
                << ": " << verdict(r.held_most / 1048576.0, limit / 1048576.0, " MB") << "\n";
    }
    if (r.readers == "sharded") {
      std::cout << "#   sharded: the busiest source sends <= 1.1x the mean (" << std::fixed
                << std::setprecision(0) << r.sent_max << " and " << r.sent_mean << " bytes), "
                << what << ": " << verdict(r.sent_mean > 0 ? r.sent_max / r.sent_mean : 1.0, 1.1)
                << "\n";
      for (const Row& one : rows)
        if (one.readers == "one" && one.format == r.format && one.quantization == r.quantization &&
            one.bucket_mb == r.bucket_mb)
          std::cout << "#   sharded no slower than one (" << one.distribution << ")"
                    << (world.size() >= 4 ? ", faster from 4 ranks" : "") << ", " << what << ": "
                    << verdict(r.seconds / one.seconds, world.size() >= 4 ? 0.999 : 1.0)
                    << " of its time\n";
    }
    if (whole && r.quantization == "none" && r.format == "checkpoint")
      std::cout << "#   no slower than every rank loading the whole checkpoint"
                << (world.size() >= 4 ? " (faster from 4 ranks)" : "") << ", " << what << ": "
                << verdict(r.seconds / whole->seconds, world.size() >= 4 ? 0.999 : 1.0)
                << " of its time\n";
    if (large && scaled && r.quantization == "none" && r.readers == "one")
      std::cout << "#   reload <= 1.15x bound, " << what << ": "
                << verdict(r.seconds / r.bound, 1.15) << "\n";
    if (o.scenario == "small-tensors" && r.readers == "one")  // (the bound of its row)
      std::cout << "#   small tensors <= 1.3x bound, " << what << ": "
                << verdict(r.seconds / r.bound, 1.3) << "\n";
    const double limit_mb = 2 * r.bucket_mb + 64;
    std::cout << "#   extra memory <= " << limit_mb << " MB (2 x bucket + 64), " << what << ": "
              << verdict(r.staging / 1048576.0, limit_mb, " MB") << "\n";
    if (!o.no_checksums && (r.readers == "one" || r.readers == "node")) {
      std::cout << "#   checksums <= 5% of the reload (time in CRC-32C, rank that spends most), "
                << what << ": " << verdict(r.crc_percent(), 5.0, "%") << "\n";
      if (r.cost_measured())
        std::cout << "#   checksums <= 5% of the reload (median of time with - time without), "
                  << what << ": " << verdict(r.crc_cost_percent(), 5.0, "%") << "\n";
    }
    if (r.readers == "one")
      std::cout << "#   reader copies per byte sent <= 1 (the read), " << what << ": "
                << verdict(r.bytes ? double(r.copied) / r.bytes : 0.0, 1.0) << "\n";
    if (r.format == "checkpoint" && online_fp8(r.quantization))
      for (const Row& none : rows)
        if (none.format == "checkpoint" && none.quantization == "none" &&
            none.distribution == r.distribution && none.readers == r.readers &&
            none.bucket_mb == r.bucket_mb) {
          std::cout << "#   online " << r.quantization << " <= 1.3x the unquantized reload, "
                    << r.distribution << ": " << verdict(r.seconds / none.seconds, 1.3) << "\n";
          // (the two rows' bounds move the same bytes: apart, the machine's speed
          // moved between the rows and the ratio says little)
          const double drift = r.bound > none.bound ? r.bound / none.bound : none.bound / r.bound;
          if (r.bound > 0 && none.bound > 0 && drift > 1.2) {
            char x[32];
            std::snprintf(x, sizeof x, "%.2f", drift);
            std::cout << "#     (their bounds differ " << x
                      << "x: the machine's speed changed between the rows; "
                         "scripts/online_fp8_ratio.sh measures the modes in turn)\n";
          }
        }
    if (r.format != "checkpoint" || r.quantization != "int8") continue;
    for (const Row& k : rows)
      if (k.format == "kernel" && k.quantization == "int8" && k.distribution == r.distribution &&
          k.readers == r.readers && k.bucket_mb == r.bucket_mb)
        std::cout << "#   checkpoint int8 <= 1.5x kernel int8, " << r.distribution << ": "
                  << verdict(r.seconds / k.seconds, 1.5) << "\n";
  }
  if (missed)
    std::cout << "# every target, its latest figures and the command behind them: "
                 "docs/PERFORMANCE.md, Targets\n";
  std::cout << std::flush;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "reload_bench: in-place reload time against the raw read + transport bound, per "
      "format, quantization, distribution and bucket size (run under mpirun)."};
  BenchOptions o;
  std::string scenarios;
  for (const std::string& name : scenario_names())
    scenarios += (scenarios.empty() ? "" : ", ") + name;
  app.add_option("--scenario", o.scenario, "one of " + scenarios)->capture_default_str();
  app.add_option("--dir", o.dir, "Where checkpoints are generated (reused when present)")
      ->capture_default_str();
  app.add_option("--tp", o.tp, "Tensor-parallel size (default: world size)");
  app.add_option("--formats", o.formats, "checkpoint and/or kernel (separated by spaces)")
      ->check(CLI::IsMember({"checkpoint", "kernel"}))
      ->capture_default_str();
  std::vector<std::string> quantizations = {"none"};
  for (const auto& q : quantization_schemes()) quantizations.push_back(q);
  app.add_option("--quantizations", o.quantizations,
                 "none and/or schemes (" + quantization_list() + "), separated by spaces")
      ->check(CLI::IsMember(quantizations))
      ->capture_default_str();
  app.add_option("--distributions", o.distributions, "broadcast and/or scatter")
      ->check(CLI::IsMember({"broadcast", "scatter"}))
      ->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "Bucket sizes in MiB")->capture_default_str();
  app.add_option("--readers", o.readers,
                 "one (the reader rank reads and sends), node (a reader per node sends within its "
                 "node; bound: one reader's times the share of its bytes the busiest node reader "
                 "reads) and/or all (every rank "
                 "reads its own slices; one row per format, laid out as scatter) and/or sharded "
                 "(every rank holds a row slice of every tensor and the ranks move what each "
                 "needs point to point; checkpoint format; bound: the same exchanges, raw) and/or "
                 "stream (the reader holds the checkpoint in memory and hands it over as a "
                 "weight stream, a segment at a time; checkpoint format; bound: the same "
                 "tensors as one in-memory source)")
      ->check(CLI::IsMember({"one", "node", "all", "sharded", "stream"}))
      ->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "readers node: world ranks per node (default 0: the ranks MPI says share memory; "
                 "N > 0 emulates nodes of N ranks on one machine)")
      ->capture_default_str();
  app.add_flag("--rotate-broadcast-roots", o.rotate_broadcast_roots,
               "readers node: the node readers take turns reading the broadcast buckets for every "
               "rank (ReloadOptions::rotate_broadcast_roots)");
  app.add_flag("--baseline", o.baseline,
               "Also time what users run without tpreload: every rank opens the whole "
               "checkpoint and loads it through the weight loaders, keeping its slices (readers "
               "'whole'; bound: every rank reading every byte)");
  app.add_flag("--cold", o.cold,
               "Drop the checkpoint's files from the page cache (posix_fadvise DONTNEED) before "
               "every timed reload and bound, so that reads come from the disk");
  app.add_flag("--zero-copy", o.zero_copy,
               "Broadcast runs of the mapped file as they are (ReloadOptions::zero_copy)");
  app.add_flag("--no-checksums", o.no_checksums,
               "Reload without the CRC-32C of the transferred bytes (ReloadOptions::checksums)");
  app.add_flag("--checksum-cost", o.checksum_cost,
               "Also time every reload without checksums, alternating which goes first, and "
               "print what the checksums cost (crcCost%: the median of the iterations' "
               "differences, as a share of the median reload with them; use an even --iters)");
  app.add_flag("--keep-open", o.keep_open,
               "Open the checkpoint once and reuse it; by default each timed reload opens it, "
               "as a reload of a new checkpoint does, given the listing the workspace kept");
  app.add_flag("--parse-every-open", o.parse_every_open,
               "Open the checkpoint without the workspace's known listing: every open parses "
               "the headers again");
  app.add_option("--pipeline-depth", o.pipeline_depth,
                 "Buffers in flight per rank (0: chosen per rank, ReloadOptions::pipeline_depth)")
      ->capture_default_str();
  app.add_option("--scatter-replicated-bytes", o.scatter_replicated_bytes,
                 "Scatter: replicated tensors whose copies for every rank come to at most this "
                 "many bytes travel in the scatter buckets (0: every replicated tensor is "
                 "broadcast; ReloadOptions::scatter_replicated_bytes)")
      ->capture_default_str();
  app.add_flag("--retain-freed-memory", o.retain_freed_memory,
               "Keep the memory the process frees instead of returning it to the kernel, as "
               "reload_runner does (retain_freed_memory()); off by default, so that rows measure "
               "the library in a process that does not");
  app.add_flag("--expert-parallel", o.expert_parallel,
               "MoE scenarios: whole experts per rank instead of every expert split by tp");
  app.add_option("--warmup", o.warmup, "Untimed reloads per row")->capture_default_str();
  app.add_option("--iters", o.iters, "Timed reloads per row")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.retained = o.retain_freed_memory && retain_freed_memory();
  return run_mpi_program(&argc, &argv, "warn", CommOptions{}, [&](MpiCommunicator& world) {
    const ModelConfig config = scenario_config(o.scenario);
    const std::string dir = prepare_checkpoint(o, config, world);
    print_header(o, config, world);
    std::int64_t wrong = 0;
    std::vector<Row> rows;
    auto add = [&](Row row) {
      rows.push_back(std::move(row));
      print_row(rows.back(), world);
      wrong += rows.back().wrong;
    };
    if (o.baseline)
      add(run_whole_row(o, config, dir, Row{"checkpoint", "none", "-", 0, "whole"}, world));
    for (const auto& format : o.formats)
      for (const auto& quant : o.quantizations)
        for (const auto& readers : o.readers)
          for (const auto& dist : o.distributions) {
            // Every rank reading has one layout: one row per bucket size.
            if (readers == "all" && dist != o.distributions.front()) continue;
            // Sharded sources: checkpoint format, its one layout (scatter).
            if (readers == "sharded" && (format != "checkpoint" || dist != o.distributions.front()))
              continue;
            if (readers == "stream" && format != "checkpoint") continue;
            for (double mb : o.bucket_mb) {
              const Row row{format, quant, dist, mb, readers};
              add(readers == "sharded"  ? run_sharded_row(o, config, dir, row, world)
                  : readers == "stream" ? run_stream_row(o, config, dir, row, world)
                                        : run_row(o, config, dir, row, world));
            }
          }
    print_targets(o, rows, world);
    return wrong == 0 ? 0 : 5;
  });
}
