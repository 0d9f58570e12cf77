#include "tpreload/comm/nccl_transport.h"

#include <cstring>
#include <thread>

#include "nccl_library.h"
#include "tpreload/comm/agreement.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/device.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {
namespace {

using Clock = std::chrono::steady_clock;

// `device` current for a scope, or nothing where it cannot be made current
// (then NCCL's call fails and says why). Never throws.
std::unique_ptr<Device::Scope> current_or_none(Device& device) noexcept {
  try {
    return device.make_current();
  } catch (const std::exception& e) {
    log().warn("cannot make {} current for an NCCL call: {}", device.describe(), e.what());
    return nullptr;
  }
}

// The one owner of an ncclComm_t. close() is the graceful, collective teardown;
// the destructor never waits on peers: a communicator not closed is aborted
// (local: it frees the resources and cancels what is in flight), with its
// device current.
class NcclComm {
 public:
  NcclComm() = default;
  NcclComm(ncclComm_t comm, std::shared_ptr<Device> device)
      : comm_(comm), device_(std::move(device)) {}
  ~NcclComm() { abort(); }
  NcclComm(NcclComm&& o) noexcept : comm_(o.comm_), device_(std::move(o.device_)) {
    o.comm_ = nullptr;
  }
  NcclComm& operator=(NcclComm&&) = delete;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  void abort() noexcept {
    if (!comm_) return;
    const auto current = device_ ? current_or_none(*device_) : nullptr;
    nccl::library().CommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_ = nullptr;
  std::shared_ptr<Device> device_;
};

// ncclGroupStart() now; ncclGroupEnd() by end(), or by the destructor when an
// error unwinds out of the group, so that no group is ever left open.
class GroupGuard {
 public:
  GroupGuard() { NCCL_CHECK(nccl::library().GroupStart()); }
  ~GroupGuard() {
    if (open_) {
      const ncclResult_t r = nccl::library().GroupEnd();
      if (r != ncclSuccess && r != ncclInProgress)
        log().error("closing an NCCL group while unwinding: {}", nccl::result_text(r));
    }
  }
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;
  ncclResult_t end() {
    open_ = false;
    return nccl::library().GroupEnd();
  }

 private:
  bool open_ = true;
};

bool ok_or_pending(ncclResult_t r) {
  return r == ncclSuccess || r == ncclInProgress;
}

class NcclTransport;

class NcclTransfer final : public Transfer {
 public:
  NcclTransfer(NcclTransport& transport, std::unique_ptr<DeviceEvent> event, std::string what,
               Clock::time_point deadline)
      : Transfer(std::move(what), deadline), transport_(transport), event_(std::move(event)) {}

 private:
  bool poll() override;
  void expire() override;
  NcclTransport& transport_;
  std::unique_ptr<DeviceEvent> event_;
};

class NcclTransport final : public DataTransport {
 public:
  NcclTransport(std::shared_ptr<Device> device, NcclComm comm, int rank, int size,
                NcclOptions options)
      : device_(std::move(device)),
        comm_(std::move(comm)),
        rank_(rank),
        size_(size),
        options_(std::move(options)),
        timeout_(options_.timeout / 2),
        stream_(device_->make_stream()) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  Device* device() const override { return device_.get(); }

  std::unique_ptr<Transfer> broadcast(MutableBytes buffer, int root) override {
    const std::string what =
        detail::concat("NCCL broadcast of ", buffer.size, " bytes from root ", root);
    check(root, what);
    const auto current = device_->make_current();
    const auto deadline = Clock::now() + timeout_;
    // In place: the root's buffer is its send buffer; the others receive into theirs.
    call(nccl::library().Broadcast(buffer.data, buffer.data, buffer.size, ncclUint8, root,
                                   comm_.get(), stream()),
         what, deadline);
    return std::make_unique<NcclTransfer>(*this, stream_->record(), what, deadline);
  }

  std::unique_ptr<Transfer> scatter(ConstBytes send, const std::vector<ByteRange>& ranges,
                                    MutableBytes recv, int root) override {
    const std::string what = detail::concat("NCCL scatter of ", recv.size, " bytes to rank ", rank_,
                                            " from root ", root);
    check(root, what);
    detail::check_scatter_arguments(what, rank_, size_, send, ranges, recv, rank_ == root);
    const auto current = device_->make_current();
    const auto deadline = Clock::now() + timeout_;
    if (rank_ == root && recv.size && recv.data != send.data + ranges[root].offset)
      stream_->copy(recv.data, send.data + ranges[root].offset, recv.size,
                    CopyKind::kDeviceToDevice);
    // Inside the group only the first failure is kept: the communicator may be
    // aborted only once the group is closed (ncclCommAbort frees what an open
    // group still points to).
    ncclResult_t first = ncclSuccess;
    auto keep = [&first](ncclResult_t rc) {
      if (first == ncclSuccess && !ok_or_pending(rc)) first = rc;
    };
    GroupGuard group;
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r)
        if (r != root && ranges[r].length)
          keep(nccl::library().Send(send.data + ranges[r].offset, ranges[r].length, ncclUint8, r,
                                    comm_.get(), stream()));
    } else if (recv.size) {
      keep(nccl::library().Recv(recv.data, recv.size, ncclUint8, root, comm_.get(), stream()));
    }
    const ncclResult_t ended = group.end();
    if (first != ncclSuccess) fail(what, nccl::result_text(first), false);
    call(ended, what, deadline);
    return std::make_unique<NcclTransfer>(*this, stream_->record(), what, deadline);
  }

  // Every pair's bytes in one NCCL group: each ncclSend and ncclRecv of this
  // rank posted together, so that no pair waits on another's order.
  std::unique_ptr<Transfer> exchange(ConstBytes send, MutableBytes recv,
                                     const std::vector<std::uint64_t>& counts) override {
    const std::string what = detail::concat("NCCL exchange of ", send.size, " bytes sent and ",
                                            recv.size, " received by rank ", rank_);
    check(0, what);
    const detail::ExchangeLayout layout = detail::exchange_layout(rank_, size_, send, recv, counts);
    const auto current = device_->make_current();
    const auto deadline = Clock::now() + timeout_;
    ncclResult_t first = ncclSuccess;  // (as in scatter: aborted only once the group closed)
    auto keep = [&first](ncclResult_t rc) {
      if (first == ncclSuccess && !ok_or_pending(rc)) first = rc;
    };
    const auto n = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    GroupGuard group;
    for (std::size_t peer = 0; peer < n; ++peer) {
      const int to = static_cast<int>(peer);
      if (const std::uint64_t out = counts[me * n + peer])
        keep(nccl::library().Send(send.data + layout.send_at[peer], out, ncclUint8, to, comm_.get(),
                                  stream()));
      if (const std::uint64_t in = counts[peer * n + me])
        keep(nccl::library().Recv(recv.data + layout.recv_at[peer], in, ncclUint8, to, comm_.get(),
                                  stream()));
    }
    const ncclResult_t ended = group.end();
    if (first != ncclSuccess) fail(what, nccl::result_text(first), false);
    call(ended, what, deadline);
    return std::make_unique<NcclTransfer>(*this, stream_->record(), what, deadline);
  }

  // A communicator of the group's own, joined over its control plane as this
  // one was over the world's (a fresh unique id, the same deadlines).
  std::unique_ptr<DataTransport> split(Communicator& group, int, int) override {
    return make_nccl_transport(group, device_, options_);
  }

  // The communicator's asynchronous state: throws (after aborting) on an error.
  bool pending(const std::string& what) {
    const auto current = current_or_none(*device_);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = nccl::library().CommGetAsyncError(comm_.get(), &state);
    if (rc != ncclSuccess)
      fail(what, detail::concat("ncclCommGetAsyncError: ", nccl::result_text(rc)), false);
    if (!ok_or_pending(state)) fail(what, nccl::result_text(state), false);
    return state == ncclInProgress;
  }

  // Abort the communicator (transfers in flight are cancelled, buffers become
  // free) and throw. The transport is broken from then on.
  [[noreturn]] void fail(const std::string& what, const std::string& why, bool timeout) {
    const char* last = comm_.get() ? nccl::library().GetLastError(comm_.get()) : nullptr;
    comm_.abort();
    broken_ = true;
    const std::string message =
        detail::concat("rank ", rank_, "/", size_, ": ", what, " on ", device_->describe(), " ",
                       why, last && *last ? detail::concat(" (NCCL: ", last, ")") : std::string(),
                       "; the NCCL communicator was aborted");
    log().error("{}", message);
    if (timeout) throw CommTimeoutError(message);
    throw CommError(message);
  }

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_->native_handle()); }

  void check(int root, const std::string& what) const {
    if (broken_)
      raise<CommError>("rank ", rank_, "/", size_, ": ", what,
                       " on a broken NCCL transport (an earlier transfer failed)");
    if (root < 0 || root >= size_)
      raise<UsageError>(what, ": root ", root, " is not a rank of ", size_);
  }

  // A call on a non-blocking communicator: an error aborts; ncclInProgress is
  // waited out (the operation is enqueued once the state settles).
  void call(ncclResult_t rc, const std::string& what, Clock::time_point deadline) {
    if (!ok_or_pending(rc)) fail(what, nccl::result_text(rc), false);
    while (pending(what)) {
      if (Clock::now() > deadline) fail(what, "was not enqueued before its deadline", true);
      std::this_thread::yield();
    }
  }

  std::shared_ptr<Device> device_;
  NcclComm comm_;
  int rank_, size_;
  NcclOptions options_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<DeviceStream> stream_;
  bool broken_ = false;
};

bool NcclTransfer::poll() {
  transport_.pending(what());  // throws on an asynchronous error
  try {
    return event_->done();
  } catch (const std::exception& e) {  // a CUDA error: the transport is broken too
    transport_.fail(what(), detail::concat("failed on the device: ", e.what()), false);
  }
}

void NcclTransfer::expire() {
  transport_.fail(what(),
                  detail::concat("did not complete within ", transport_.timeout().count(),
                                 " ms; a peer is dead, stuck, or not making the same call"),
                  true);
}

// COLLECTIVE. This rank's NCCL communicator, or the reason it has none.
NcclComm join(Communicator& control, const std::shared_ptr<Device>& device, const ncclUniqueId& id,
              std::chrono::milliseconds timeout, std::optional<std::string>& problem) {
  const nccl::Library& lib = nccl::library();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that joining can be given up at a deadline
  ncclComm_t raw = nullptr;
  if (!problem) {  // (a rank that cannot join still takes part in the agreement)
    const ncclResult_t rc =
        lib.CommInitRankConfig(&raw, control.size(), id, control.rank(), &config);
    if (!ok_or_pending(rc)) problem = "ncclCommInitRankConfig: " + nccl::result_text(rc);
  }
  NcclComm comm(raw, device);
  // Ranks whose call failed outright say so before any rank polls.
  agree_on_problem<CommError>(control, problem, "creating the NCCL communicator");
  // Half the control plane's deadline: a rank that fails while polling waits in
  // the agreement that follows, and its peers must get there before that expires.
  const auto limit = timeout / 2;
  const auto deadline = Clock::now() + limit;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t status = lib.CommGetAsyncError(comm.get(), &state);
    if (status != ncclSuccess) {
      problem =
          "joining the NCCL communicator: ncclCommGetAsyncError: " + nccl::result_text(status);
      return comm;
    }
    if (!ok_or_pending(state)) {
      problem = "joining the NCCL communicator: " + nccl::result_text(state);
      return comm;
    }
    if (state == ncclSuccess) return comm;
    if (Clock::now() > deadline) {
      problem = detail::concat("joining the NCCL communicator did not finish within ",
                               limit.count(), " ms (a peer did not join)");
      return comm;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

std::unique_ptr<DataTransport> make_nccl_transport(Communicator& control,
                                                   std::shared_ptr<Device> device,
                                                   const NcclOptions& options) {
  std::optional<std::string> problem;
  try {
    detail::check_timeout("NcclOptions::timeout", options.timeout);
    if (!device || device->backend() != "cuda")
      raise<UsageError>("the NCCL transport needs a CUDA device, got ",
                        device ? device->describe() : std::string("none"));
    const NcclLibraryInfo info = load_nccl(options.library);
    log().debug("NCCL {} from {}", info.version, info.path);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  agree_on_problem<CommError>(control, problem, "setting up NCCL");

  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (control.rank() == 0) {
    const ncclResult_t rc = nccl::library().GetUniqueId(&id);
    if (rc != ncclSuccess) problem = "ncclGetUniqueId: " + nccl::result_text(rc);
  }
  agree_on_problem<CommError>(control, problem, "creating the NCCL unique id");
  control.broadcast(MutableBytes(&id, sizeof id), 0);

  // NCCL binds the communicator to the current device; the caller's is current
  // again afterwards (NCCL's later calls set the device they need).
  NcclComm comm = [&] {
    std::unique_ptr<Device::Scope> current;
    try {
      current = device->make_current();
    } catch (const std::exception& e) {
      problem = detail::concat("making ", device->describe(), " current: ", e.what());
    }
    return join(control, device, id, options.timeout, problem);
  }();
  // (its stream too, before the ranks agree: a rank that cannot make one says so)
  std::unique_ptr<DataTransport> transport;
  if (!problem) try {
      transport = std::make_unique<NcclTransport>(device, std::move(comm), control.rank(),
                                                  control.size(), options);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  agree_on_problem<CommError>(control, problem, "creating the NCCL communicator");
  log().debug("NCCL communicator of {} ranks on {}", control.size(), device->describe());
  return transport;
}

void nccl_self_send_recv(const std::shared_ptr<Device>& device, const void* src, void* dst,
                         std::uint64_t bytes, std::chrono::milliseconds timeout) {
  if (!device || device->backend() != "cuda")
    raise<UsageError>("an NCCL self send/recv needs a CUDA device, got ",
                      device ? device->describe() : std::string("none"));
  load_nccl();
  const nccl::Library& lib = nccl::library();
  const std::string what =
      detail::concat("NCCL self send/recv of ", bytes, " bytes on ", device->describe());
  auto check = [&](ncclResult_t rc, const char* call) {
    if (!ok_or_pending(rc)) raise<CommError>(what, ": ", call, ": ", nccl::result_text(rc));
  };
  const auto current = device->make_current();
  ncclUniqueId id;
  check(lib.GetUniqueId(&id), "ncclGetUniqueId");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t raw = nullptr;
  const ncclResult_t init = lib.CommInitRankConfig(&raw, 1, id, 0, &config);
  NcclComm comm(raw, device);  // (owned before any check: a failed init is aborted too)
  check(init, "ncclCommInitRankConfig");
  const auto deadline = Clock::now() + timeout;
  auto settle = [&](const char* step) {  // a non-blocking call's state, to a deadline
    for (ncclResult_t state = ncclInProgress; state == ncclInProgress;) {
      check(lib.CommGetAsyncError(comm.get(), &state), "ncclCommGetAsyncError");
      check(state, step);
      if (state == ncclInProgress && Clock::now() > deadline)
        raise<CommTimeoutError>(what, ": ", step, " did not finish within ", timeout.count(),
                                " ms");
      std::this_thread::yield();
    }
  };
  settle("joining");
  auto stream = device->make_stream();
  const auto native = static_cast<cudaStream_t>(stream->native_handle());
  {
    GroupGuard group;
    check(lib.Send(src, bytes, ncclUint8, 0, comm.get(), native), "ncclSend");
    check(lib.Recv(dst, bytes, ncclUint8, 0, comm.get(), native), "ncclRecv");
    check(group.end(), "ncclGroupEnd");
  }
  settle("enqueueing the group");
  const auto done = stream->record();
  while (!done->done()) {
    settle("the transfer");
    if (Clock::now() > deadline) {
      done->gave_up();
      raise<CommTimeoutError>(what, ": did not complete within ", timeout.count(), " ms");
    }
    std::this_thread::yield();
  }
}

}  // namespace tpreload
