// tpreload._tpreload: the Python binding of the reload engine. It takes tensors
// as descriptors (pointer, shape, strides, dtype, device) made by the pure-Python
// package (python/tpreload/__init__.py) from whatever tensors the caller has, so
// it never links the caller's LibTorch: the engine, the MPI control and data
// planes and (in a CUDA build) the CUDA device and NCCL, nothing of torch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/comm/mpi_communicator.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"
#include "tpreload/model/borrowed.h"
#include "tpreload/model/config.h"
#include "tpreload/reload/reload.h"
#include "tpreload/reload/report.h"
#include "tpreload/reload/sharded_source.h"
#include "tpreload/runtime/data_plane.h"
#include "tpreload/runtime/program.h"

namespace py = pybind11;
using namespace tpreload;

namespace {

// The longest deadline Python may set, in seconds (a week: no wait is meant to
// be longer, and milliseconds of it fit any clock).
constexpr double kMaxSeconds = 7 * 24 * 3600;

std::chrono::milliseconds milliseconds_of(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

// One call at a time, in any thread: MPI runs at MPI_THREAD_SERIALIZED, and a
// reload uses its workspace's buffers, the World's planes and communicator
// until it returns. Every call that touches them (collectives, Workspace
// release, finalize) takes this mutex with the GIL released (a reload takes the
// GIL inside it never, but another thread may hold it while it waits here).
std::timed_mutex& calls_mutex() {
  static std::timed_mutex m;
  return m;
}

// The MPI world of the process. Initialises MPI when the process has not (and
// then finalizes it in finalize(), which the package registers with atexit).
class World {
 public:
  // `timeout_s`: the deadline of every collective (CommOptions::timeout).
  explicit World(double timeout_s) : timeout_s_(timeout_s) {
    if (!(timeout_s > 0 && timeout_s <= kMaxSeconds))  // (also NaN and inf)
      raise<UsageError>("World: timeout_s must be in (0, ", kMaxSeconds, "], got ", timeout_s);
    mpi_ = std::make_unique<MpiRuntime>(nullptr, nullptr);
    init_logging(mpi_->world_rank(), mpi_->world_size(), "warn");
    CommOptions options;
    options.timeout = milliseconds_of(timeout_s);
    comm_ = MpiCommunicator::world(options);
  }
  double timeout_s() const { return timeout_s_; }
  int rank() { return comm().rank(); }
  int size() { return comm().size(); }
  MpiCommunicator& comm() {
    if (!comm_) raise<UsageError>("the tpreload World was finalized");
    return *comm_;
  }
  // A collective failed on this rank alone (its peers may be waiting in one):
  // the process must not finalize MPI, which would wait for them forever.
  void poison() { poisoned_ = true; }
  bool poisoned() const { return poisoned_; }

  // Runs a collective step: an error every rank raised alike passes through; any
  // other poisons the World.
  template <typename F>
  auto collective(F&& step) {
    py::gil_scoped_release release;
    std::lock_guard<std::timed_mutex> lock(calls_mutex());
    try {
      return step();
    } catch (const AgreedError&) {
      throw;
    } catch (...) {
      poisoned_ = true;
      throw;
    }
  }
  void barrier() {
    collective([&] { comm().barrier(); });
  }
  // Every rank's string, in rank order.
  std::vector<std::string> allgather(const std::string& mine) {
    return collective([&] {
      std::vector<std::string> out;
      const int me = comm().rank();
      for (int r = 0; r < comm().size(); ++r) {
        std::int64_t length = r == me ? static_cast<std::int64_t>(mine.size()) : 0;
        comm().allreduce_ints(&length, 1, IntOp::kMax);
        std::string s = r == me ? mine : std::string(static_cast<std::size_t>(length), '\0');
        comm().broadcast(MutableBytes(s.data(), s.size()), r);
        out.push_back(std::move(s));
      }
      return out;
    });
  }
  // COLLECTIVE. The data plane for parameters on `device` ("cpu" or "cuda:N")
  // over `transport`, kept between calls. The ranks agree on whether all of them
  // have theirs already; if not, every rank opens its plane anew.
  DataPlane& plane(const std::string& device, const std::string& transport) {
    const std::string key = device + "/" + transport;
    auto it = planes_.find(key);
    std::int64_t all_have = it != planes_.end() ? 1 : 0;
    comm().allreduce_ints(&all_have, 1, IntOp::kMin);
    if (all_have) return it->second;
    if (it != planes_.end()) planes_.erase(it);
    DataPlaneOptions o;
    o.device = device.rfind("cuda:", 0) == 0 ? "cuda" : "cpu";
    if (o.device == "cuda") o.cuda_ordinal = std::stoi(device.substr(5));
    o.transport = transport;
    o.comm = comm().options();
    return planes_.emplace(key, open_data_plane(comm(), o)).first->second;
  }
  // Waits for a call still running in another thread (a daemon thread at
  // exit) up to the communicator's timeout; past it MPI cannot be finalized
  // under that call, and the job is ended instead.
  void finalize() {
    py::gil_scoped_release release;
    std::unique_lock<std::timed_mutex> lock(calls_mutex(), std::defer_lock);
    const auto wait = comm_ ? comm_->options().timeout : std::chrono::milliseconds(0);
    if (!lock.try_lock_for(wait)) {
      log().error("ending the MPI job: a tpreload call still runs in another thread after {} s",
                  std::chrono::duration_cast<std::chrono::seconds>(wait).count());
      log().flush();
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    planes_.clear();
    comm_.reset();
    if (!mpi_) return;
    if (poisoned_) {  // peers may be inside a collective: end the job instead
      log().error(
          "ending the MPI job: this rank failed alone (a collective failed here only, or an "
          "unhandled exception), its peers may be waiting");
      log().flush();
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    mpi_->finalize();
  }

 private:
  double timeout_s_;
  std::unique_ptr<MpiRuntime> mpi_;
  std::unique_ptr<MpiCommunicator> comm_;
  std::map<std::string, DataPlane> planes_;
  bool poisoned_ = false;
};

// (name, data_ptr, shape, strides, dtype, device[, tp_rank]) from the package.
BorrowedTensor borrowed(const py::tuple& d) {
  BorrowedTensor t;
  t.name = d[0].cast<std::string>();
  t.data = reinterpret_cast<std::byte*>(d[1].cast<std::uintptr_t>());
  t.shape = d[2].cast<std::vector<std::int64_t>>();
  t.strides = d[3].cast<std::vector<std::int64_t>>();
  const auto name = d[4].cast<std::string>();
  if (const auto dtype = dtype_from_name(name))
    t.dtype = *dtype;
  else
    t.unknown_dtype = name;
  t.device = d[5].cast<std::string>();
  return t;
}

// The bytes of a host tensor the caller hands over (`what`: "weights_iterator",
// "shards"), which must be of a dtype tpreload reads, on the CPU and contiguous.
ConstBytes host_bytes(const BorrowedTensor& t, const char* what) {
  if (!t.unknown_dtype.empty())
    raise<UsageError>(what, " tensor '", t.name, "' has dtype ", t.unknown_dtype,
                      ", which tpreload does not read");
  if (t.device != "cpu")
    raise<UsageError>(what, " tensor '", t.name, "' is on ", t.device,
                      "; it is read from host memory (move it to the CPU first)");
  if (!is_contiguous(t)) raise<UsageError>(what, " tensor '", t.name, "' is not contiguous");
  std::uint64_t bytes = dtype_size(t.dtype);
  for (auto s : t.shape) bytes *= static_cast<std::uint64_t>(s);
  return ConstBytes(t.data, bytes);
}

// One tensor of weights_iterator from its descriptor (kernel format: its tp
// rank last).
InMemoryTensor in_memory(const py::tuple& d, bool kernel) {
  const BorrowedTensor t = borrowed(d);
  InMemoryTensor m{t.name, t.dtype, t.shape, host_bytes(t, "weights_iterator"), nullptr};
  if (kernel) m.tp_rank = d[6].cast<int>();
  return m;
}

std::vector<InMemoryTensor> in_memory(const std::vector<py::tuple>& descriptors, bool kernel) {
  std::vector<InMemoryTensor> out;
  for (const auto& d : descriptors) out.push_back(in_memory(d, kernel));
  return out;
}

// The reader's weights_iterator taken as the reload goes (readers="one"):
// `next` (the package's) returns (descriptor, tensor) per tensor and None at
// the end. Called inside the reload, where the GIL is released: it takes the
// GIL for each tensor, and each tensor is kept alive (a Python reference,
// dropped under the GIL) until the reload has sent it.
class PythonStream final : public WeightStream {
 public:
  PythonStream(py::function next, bool kernel) : next_(std::move(next)), tagged_(kernel) {}
  // Kernel format: what the tensors were made for (the model's layout).
  void set_kernel_format(KernelFormatInfo info) { kernel_ = std::move(info); }

  std::string describe() const override { return "weights_iterator"; }
  std::optional<KernelFormatInfo> kernel_format() const override { return kernel_; }
  std::optional<InMemoryTensor> next() override {
    py::gil_scoped_acquire gil;
    try {
      const py::object item = next_();
      if (item.is_none()) return std::nullopt;
      const auto pair = item.cast<py::tuple>();
      InMemoryTensor m = in_memory(pair[0].cast<py::tuple>(), tagged_);
      m.keep_alive = std::shared_ptr<const void>(new py::object(pair[1]), [](py::object* o) {
        py::gil_scoped_acquire again;
        delete o;
      });
      return m;
    } catch (py::error_already_set& e) {  // (its text, while the GIL is held)
      raise<CheckpointError>(e.what());
    }
  }

 private:
  py::function next_;
  bool tagged_;
  std::optional<KernelFormatInfo> kernel_;
};

// Sharded sources: (name, data_ptr, box shape, strides, dtype, device, full
// shape, offsets) per box this rank holds.
std::unique_ptr<ShardedSource> sharded_source(const std::vector<py::tuple>& descriptors) {
  std::vector<HeldTensor> held;
  for (const auto& d : descriptors) {
    const BorrowedTensor t = borrowed(d);
    HeldTensor h;
    h.name = t.name;
    h.dtype = t.dtype;
    h.shape = d[6].cast<std::vector<std::int64_t>>();
    h.box = {d[7].cast<std::vector<std::int64_t>>(), t.shape};
    h.bytes = host_bytes(t, "shards");
    held.push_back(std::move(h));
  }
  return std::make_unique<ShardedSource>(std::move(held));
}

struct Request {
  std::optional<std::string> problem;  // what the package found wrong on this rank
  std::string config;                  // config.json or its directory
  int tp_size = 0;
  std::optional<std::string> weights_path;
  std::optional<std::vector<py::tuple>> weights_iterator;
  std::optional<py::function> weights_stream;    // the reader's iterator, taken lazily
  std::optional<std::vector<py::tuple>> shards;  // sharded sources: what this rank holds
  bool checkpoint_format = true;
  std::string quantization;
  bool lora = false, expert_parallel = false;
  bool derived_views = false;  // the model holds its derived parameters as views (BorrowedOptions)
  std::string distribution = "scatter";
  double bucket_mb = ReloadOptions{}.bucket_bytes / 1048576.0;
  int pipeline_depth = ReloadOptions{}.pipeline_depth, reader_rank = 0;
  std::string readers = "one";
  int ranks_per_node = 0;
  bool rotate_broadcast_roots = false;
  std::string transport = "mpi";
  bool fingerprint = false;
  bool atomic = false, require_complete = false;
  bool checksums = true;
  bool zero_copy = false, compare_replicas = true;
  int serving_ranks = 0;  // shards=: the ranks after these serve nothing (params empty)
  double read_timeout_s = static_cast<double>(ReloadOptions{}.read_stall_timeout.count());
};

ReloadOptions reload_options(const Request& q) {
  ReloadOptions o;
  o.format = q.checkpoint_format ? WeightFormat::kCheckpoint : WeightFormat::kKernel;
  if (q.distribution != "scatter" && q.distribution != "broadcast")
    raise<UsageError>("distribution must be 'scatter' or 'broadcast', got '", q.distribution, "'");
  o.distribution = q.distribution == "scatter" ? Distribution::kScatter : Distribution::kBroadcast;
  if (!(q.bucket_mb > 0 && q.bucket_mb <= 1048576))  // also refuses NaN and inf
    raise<UsageError>("bucket_mb must be in (0, 1048576], got ", q.bucket_mb);
  o.bucket_bytes = static_cast<std::uint64_t>(q.bucket_mb * 1048576);
  o.pipeline_depth = q.pipeline_depth;
  o.reader_rank = q.reader_rank;
  const std::optional<Readers> readers = parse_readers(q.readers);
  if (!readers) raise<UsageError>("readers must be 'one', 'node' or 'all', got '", q.readers, "'");
  o.readers = *readers;
  o.ranks_per_node = q.ranks_per_node;
  o.rotate_broadcast_roots = q.rotate_broadcast_roots;
  o.atomic = q.atomic;
  o.require_complete = q.require_complete;
  o.checksums = q.checksums;
  o.zero_copy = q.zero_copy;
  o.compare_replicas = q.compare_replicas;
  o.serving_ranks = q.serving_ranks;
  if (q.serving_ranks && !q.shards)
    raise<UsageError>(
        "serving_ranks is for shards= (ranks that serve nothing send what they hold)");
  if (q.serving_ranks && q.fingerprint)
    raise<UsageError>(
        "fingerprint= reads every rank's parameters back, but with serving_ranks "
        "some ranks hold none");
  if (!(q.read_timeout_s >= 1 && q.read_timeout_s <= kMaxSeconds))
    raise<UsageError>("read_timeout_s must be in [1, ", kMaxSeconds, "], got ", q.read_timeout_s);
  o.read_stall_timeout = std::chrono::seconds(std::llround(q.read_timeout_s));
  return o;
}

// The reader rank's source: the iterator's tensors, or the path (the config's
// directory when none is given).
std::unique_ptr<WeightSource> open_source(const Request& q, const ModelConfig& config,
                                          bool from_memory, std::vector<InMemoryTensor> memory,
                                          const ReloadWorkspace* workspace) {
  if (from_memory) {
    std::optional<KernelFormatInfo> kernel;
    if (!q.checkpoint_format)
      kernel =
          KernelFormatInfo{q.tp_size, config.dtype, q.quantization, config.json, q.expert_parallel};
    return make_in_memory_source(std::move(memory), kernel);
  }
  return open_weight_source(q.weights_path.value_or(model_directory(q.config)),
                            workspace ? workspace->known_listing() : nullptr);
}

py::dict result_dict(const ReloadResult& r,
                     const std::optional<std::vector<ParamFingerprint>>& fingerprints) {
  py::dict d;
  d["complete"] = r.complete();
  d["loaded"] = r.loaded;
  d["not_loaded_on_all_ranks"] = r.not_loaded_on_all_ranks;
  d["not_loaded_on_some_ranks"] = r.not_loaded_on_some_ranks;
  d["skipped"] = r.skipped;
  d["source"] = r.source;
  d["readers"] = std::string(readers_name(r.readers));
  d["rotated_broadcast_roots"] = r.rotated_broadcast_roots;
  d["pipeline_depth"] = r.pipeline_depth;
  d["nodes_served"] = r.nodes_served;
  d["transport"] = r.transport;
  d["parameter_memory"] = r.parameter_memory;
  d["bytes_read"] = r.bytes_read;
  d["bytes_transferred"] = r.bytes_transferred;
  d["bytes_copied_on_reader"] = r.bytes_copied_on_reader;
  d["buckets"] = r.buckets;
  d["staging"] =
      py::dict(py::arg("host") = r.staging.host, py::arg("pinned_host") = r.staging.pinned,
               py::arg("device") = r.staging.device);
  d["seconds"] =
      py::dict(py::arg("total") = r.seconds.total, py::arg("read") = r.seconds.read,
               py::arg("transfer") = r.seconds.transfer, py::arg("apply") = r.seconds.apply,
               py::arg("finish") = r.seconds.finish, py::arg("validate") = r.seconds.validate,
               py::arg("checksum") = r.seconds.checksum, py::arg("prepare") = r.seconds.prepare);
  d["atomic"] = r.atomic;
  d["fingerprint"] =
      fingerprints ? py::object(py::str(model_fingerprint(*fingerprints))) : py::none();
  py::dict crcs;
  if (fingerprints)
    for (const auto& f : *fingerprints) crcs[py::str(f.name)] = f.crc32_by_rank;
  d["crc32"] = crcs;
  return d;
}

// COLLECTIVE. Every local step that can fail (the package's own checks, the
// request, the config, the parameters against the rules, the data plane, the
// reader's source) is agreed on, so that every rank raises the same error before
// any parameter is written.
py::dict reload(World& world, const std::vector<py::tuple>& params, Request q,
                ReloadWorkspace* workspace) {
  std::optional<std::string> problem = q.problem;
  ReloadOptions options;
  bool reader = false;  // passes a source (opens_source), once the options are read
  std::vector<BorrowedTensor> tensors;
  std::vector<InMemoryTensor> memory;
  std::unique_ptr<ShardedSource> held;   // shards=: what this rank holds
  std::unique_ptr<PythonStream> stream;  // the reader's weights_iterator, taken lazily
  if (!problem) {
    try {  // with the GIL: descriptors are Python objects
      options = reload_options(q);
      reader = opens_source(options, world.rank());
      if (q.tp_size < 0) raise<UsageError>("tp_size must be positive, got ", q.tp_size);
      if (q.serving_ranks < 0 || q.serving_ranks > world.size())
        raise<UsageError>("serving_ranks must be in [0, ", world.size(), "], got ",
                          q.serving_ranks);
      const int serving = q.serving_ranks ? q.serving_ranks : world.size();
      q.tp_size = q.tp_size > 0 ? q.tp_size : serving;
      if (serving % q.tp_size != 0)
        raise<UsageError>("tp_size ", q.tp_size, " does not divide the ", serving,
                          q.serving_ranks ? " serving ranks" : " ranks of the world");
      for (const auto& d : params) tensors.push_back(borrowed(d));
      if (q.shards)
        held = sharded_source(*q.shards);
      else if (reader && q.weights_iterator)
        memory = in_memory(*q.weights_iterator, !q.checkpoint_format);
      else if (reader && q.weights_stream)
        stream = std::make_unique<PythonStream>(*q.weights_stream, !q.checkpoint_format);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  const bool from_memory = q.weights_iterator.has_value();
  const bool sharded = q.shards.has_value();
  q.weights_iterator.reset();  // its Python tuples stay with the caller
  q.shards.reset();
  ReloadResult result;
  std::optional<std::vector<ParamFingerprint>> fingerprints;
  // No Python object is touched in here but by the stream, which takes the GIL.
  world.collective([&] {
    MpiCommunicator& comm = world.comm();
    agree_on_problem<UsageError>(comm, problem, "reading the request");
    // (fingerprints are gathered collectively after the reload)
    agree_on_values<UsageError>(comm, {{"fingerprint", q.fingerprint}},
                                " (every rank must pass the same fingerprint=); nothing was "
                                "reloaded");
    std::optional<ModelConfig> config;
    try {
      config = load_model_config(q.config);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    agree_on_problem<ModelError>(comm, problem, "reading the model config");
    std::unique_ptr<BorrowedTarget> target;
    std::unique_ptr<ShardingRules> rules;  // a rank that serves nothing: the servers' layout
    const bool serves = q.serving_ranks == 0 || comm.rank() < q.serving_ranks;
    std::optional<std::string> model_problem;
    try {
      BorrowedOptions o;  // (by name: three of its fields are adjacent bools)
      o.tp_size = q.tp_size;
      o.tp_rank = comm.rank() % q.tp_size;
      o.quantization = q.quantization;
      o.lora = q.lora;
      o.expert_parallel = q.expert_parallel;
      o.derived_views = q.derived_views;
      if (serves)
        target = std::make_unique<BorrowedTarget>(*config, o, std::move(tensors));
      else
        rules = std::make_unique<ShardingRules>(*config, q.tp_size, q.quantization,
                                                q.expert_parallel, !q.derived_views);
    } catch (const ValidationError& e) {
      problem = e.what();
    } catch (const std::exception& e) {
      model_problem = e.what();
    }
    agree_on_problem<ModelError>(comm, model_problem, "sharding the model");
    agree_on_problem<ValidationError>(comm, problem,
                                      "checking the parameters (nothing was reloaded)");
    DataPlane& plane =  // (agrees on its failures)
        world.plane(target ? target->device_name() : std::string("cpu"), q.transport);
    try {
      if (target) target->attach(plane.device);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    agree_on_problem<ValidationError>(comm, problem,
                                      "checking the parameters (nothing was reloaded)");
    std::unique_ptr<WeightSource> source;
    try {
      if (reader && !sharded && !stream)
        source = open_source(q, *config, from_memory, std::move(memory), workspace);
      if (stream && !q.checkpoint_format)
        stream->set_kernel_format(KernelFormatInfo{q.tp_size, config->dtype, q.quantization,
                                                   config->json, q.expert_parallel});
    } catch (const std::exception& e) {
      problem = e.what();
    }
    agree_on_problem<CheckpointError>(comm, problem, "opening the weights (nothing was reloaded)");
    ReloadWorkspace local;
    // The reader's choice: every rank reloads from its stream, or none does.
    std::int64_t streamed = stream ? 1 : 0;
    comm.allreduce_ints(&streamed, 1, IntOp::kMax);
    if (sharded && !serves)
      result = push_shards(comm, *plane.transport, *held, *rules, options,
                           workspace ? workspace : &local, q.lora);
    else if (sharded)  // (a rank given no shards= while others were is refused by the engine)
      result = reload_weights(*target, comm, *plane.transport, *held, options,
                              workspace ? workspace : &local);
    else if (streamed)
      result = reload_from_stream(*target, comm, *plane.transport, stream.get(), options,
                                  workspace ? workspace : &local);
    else
      result = reload_weights(*target, comm, *plane.transport, source.get(), options,
                              workspace ? workspace : &local);
    if (q.fingerprint) fingerprints = gather_fingerprints(*target, comm, options.device_timeout);
  });
  return result_dict(result, fingerprints);
}

// The Python exception classes, set from a C++ Error with `agreed`: whether
// every rank raised it alike (the job may go on), or this rank alone (its peers
// may be waiting in a collective: the process should end).
struct PythonErrors {
  py::handle base, checkpoint, comm, timeout, model, validation, usage;

  py::handle of(const Error& e) const {
    if (dynamic_cast<const CommTimeoutError*>(&e)) return timeout;
    if (dynamic_cast<const CommError*>(&e)) return comm;
    if (dynamic_cast<const CheckpointError*>(&e)) return checkpoint;
    if (dynamic_cast<const ValidationError*>(&e)) return validation;
    if (dynamic_cast<const ModelError*>(&e)) return model;
    if (dynamic_cast<const UsageError*>(&e)) return usage;
    return base;
  }
};

PythonErrors& python_errors() {
  static PythonErrors errors;  // handles leak on purpose: they live as long as the module
  return errors;
}

}  // namespace

PYBIND11_MODULE(_tpreload, m) {
  m.doc() = "tpreload's native engine (use the tpreload package, not this module)";
  PythonErrors& errors = python_errors();
  auto define = [&m](const char* name, py::handle base) {
    py::object cls = py::reinterpret_steal<py::object>(
        PyErr_NewException((std::string("tpreload.") + name).c_str(), base.ptr(), nullptr));
    m.attr(name) = cls;
    return cls.release();
  };
  errors.base = define("Error", PyExc_RuntimeError);
  errors.checkpoint = define("CheckpointError", errors.base);
  errors.comm = define("CommError", errors.base);
  errors.timeout = define("CommTimeoutError", errors.comm);
  errors.model = define("ModelError", errors.base);
  errors.validation = define("ValidationError", errors.base);
  errors.usage = define("UsageError", errors.base);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object error = py::reinterpret_borrow<py::object>(python_errors().of(e))(e.what());
      error.attr("agreed") = dynamic_cast<const AgreedError*>(&e) != nullptr;
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    }
  });

  py::class_<World>(m, "World")
      .def(py::init<double>(), py::arg("timeout_s"))
      .def_property_readonly("timeout_s", &World::timeout_s)
      .def_property_readonly("rank", &World::rank)
      .def_property_readonly("size", &World::size)
      .def("barrier", &World::barrier)
      .def("allgather", &World::allgather)
      .def("poison", &World::poison)
      .def_property_readonly("poisoned", &World::poisoned)
      .def("finalize", &World::finalize);

  // A reload in another thread may be using the workspace: wait for it.
  py::class_<ReloadWorkspace>(m, "Workspace")
      .def(py::init<>())
      .def_property_readonly("bytes",
                             [](const ReloadWorkspace& w) {
                               py::gil_scoped_release release;
                               std::lock_guard<std::timed_mutex> lock(calls_mutex());
                               return w.bytes();
                             })
      .def("release", [](ReloadWorkspace& w) {
        py::gil_scoped_release release;
        std::lock_guard<std::timed_mutex> lock(calls_mutex());
        w.release();
      });

  py::class_<Request>(m, "Request")
      .def(py::init<>())
      .def_readwrite("problem", &Request::problem)
      .def_readwrite("fingerprint", &Request::fingerprint)
      .def_readwrite("atomic", &Request::atomic)
      .def_readwrite("require_complete", &Request::require_complete)
      .def_readwrite("checksums", &Request::checksums)
      .def_readwrite("zero_copy", &Request::zero_copy)
      .def_readwrite("compare_replicas", &Request::compare_replicas)
      .def_readwrite("read_timeout_s", &Request::read_timeout_s)
      .def_readwrite("config", &Request::config)
      .def_readwrite("tp_size", &Request::tp_size)
      .def_readwrite("weights_path", &Request::weights_path)
      .def_readwrite("weights_iterator", &Request::weights_iterator)
      .def_readwrite("weights_stream", &Request::weights_stream)
      .def_readwrite("serving_ranks", &Request::serving_ranks)
      .def_readwrite("shards", &Request::shards)
      .def_readwrite("checkpoint_format", &Request::checkpoint_format)
      .def_readwrite("quantization", &Request::quantization)
      .def_readwrite("lora", &Request::lora)
      .def_readwrite("expert_parallel", &Request::expert_parallel)
      .def_readwrite("derived_views", &Request::derived_views)
      .def_readwrite("distribution", &Request::distribution)
      .def_readwrite("bucket_mb", &Request::bucket_mb)
      .def_readwrite("pipeline_depth", &Request::pipeline_depth)
      .def_readwrite("reader_rank", &Request::reader_rank)
      .def_readwrite("readers", &Request::readers)
      .def_readwrite("ranks_per_node", &Request::ranks_per_node)
      .def_readwrite("rotate_broadcast_roots", &Request::rotate_broadcast_roots)
      .def_readwrite("transport", &Request::transport);

  m.def("reload", &reload, py::arg("world"), py::arg("params"), py::arg("request"),
        py::arg("workspace") = nullptr);
  m.def("built_with_cuda", &built_with_cuda);
  m.def("retain_freed_memory", &retain_freed_memory);
  m.def("set_log_level",
        [](World& w, const std::string& level) { init_logging(w.rank(), w.size(), level); });
}
