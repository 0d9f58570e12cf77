// Ranks as threads of one process: every collective is a rendezvous of the
// group's threads over shared memory. Each call posts what it brings (its
// buffer, its sizes), waits until every rank has posted, reads what it needs
// from the others' buffers into its own, and waits again before it returns, so
// that no rank reuses a buffer another rank still reads. Checks that depend on
// what every rank posted are made on every rank from the same posts, so a
// mismatched call fails alike everywhere instead of leaving a rank waiting.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

// What one rank brings to the collective in progress.
struct Post {
  const void* in = nullptr;  // its send (root) or input buffer
  std::uint64_t bytes = 0;   // its buffer's length, or element count
  int root = -1;             // the root it names
  int color = 0, key = 0;    // split
  const std::vector<ByteRange>* ranges = nullptr;
};

// How often a rank that waits for the others yields its core before it sleeps.
constexpr int kYieldsBeforeSleeping = 128;

// The shared state of one group of threads.
struct Group {
  explicit Group(int n) : size(n), posts(static_cast<std::size_t>(n)), made(n) {}

  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  // (written under the mutex; read without it by ranks that wait for the others)
  std::atomic<std::uint64_t> generation{0};
  std::string broken;  // why the group can no longer be used ("" while it can)
  std::vector<Post> posts;
  std::vector<std::shared_ptr<Group>> made;  // split: the group each leader made
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank, CommOptions options)
      : group_(std::move(group)), rank_(rank), options_(options) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string backend() const override { return "threads"; }

  void broadcast(MutableBytes buffer, int root) override {
    const char* what = "broadcast";
    check_root(what, root);
    Post p;
    p.in = buffer.data;
    p.bytes = buffer.size;
    p.root = root;
    post(what, p);
    const Post& from = posts()[static_cast<std::size_t>(root)];
    for (int r = 0; r < size(); ++r) {
      const Post& q = posts()[static_cast<std::size_t>(r)];
      if (q.root != root || q.bytes != from.bytes)
        fail_alike(what, detail::concat("rank ", r, " passed ", q.bytes, " bytes from root ",
                                        q.root, ", root ", root, " ", from.bytes, " bytes"));
    }
    if (rank_ != root && buffer.size > 0) std::memcpy(buffer.data, from.in, buffer.size);
    sync(what);
  }

  void scatterv(ConstBytes send, const std::vector<ByteRange>& ranges, MutableBytes recv,
                int root) override {
    const char* what = "scatterv";
    check_root(what, root);
    detail::check_scatter_arguments("threads scatterv", rank_, size(), send, ranges, recv,
                                    rank_ == root);
    Post p;
    p.in = send.data;
    p.bytes = recv.size;
    p.root = root;
    p.ranges = &ranges;
    post(what, p);
    const Post& from = posts()[static_cast<std::size_t>(root)];
    for (int r = 0; r < size(); ++r) {
      const Post& q = posts()[static_cast<std::size_t>(r)];
      if (q.root != root)
        fail_alike(what, detail::concat("rank ", r, " named root ", q.root, ", rank ", rank_,
                                        " root ", root));
      const std::uint64_t length = (*from.ranges)[static_cast<std::size_t>(r)].length;
      if (q.bytes != length)
        fail_alike(what, detail::concat("the root's range for rank ", r, " has ", length,
                                        " bytes, the rank receives ", q.bytes));
    }
    const ByteRange mine = (*from.ranges)[static_cast<std::size_t>(rank_)];
    if (recv.size > 0)  // (in place on the root: the same bytes)
      std::memmove(recv.data, static_cast<const std::byte*>(from.in) + mine.offset, recv.size);
    sync(what);
  }

  void allreduce_bits(std::uint64_t* words, std::size_t count, BitOp op) override {
    reduce<std::uint64_t>("allreduce_bits", words, count, [op](std::uint64_t a, std::uint64_t b) {
      return op == BitOp::kOr ? a | b : a & b;
    });
  }

  void allreduce_ints(std::int64_t* values, std::size_t count, IntOp op) override {
    reduce<std::int64_t>("allreduce_ints", values, count, [op](std::int64_t a, std::int64_t b) {
      return op == IntOp::kSum ? a + b : op == IntOp::kMax ? std::max(a, b) : std::min(a, b);
    });
  }

  // Summed in rank order on every rank: the same result everywhere.
  void allreduce_floats(float* values, std::size_t count) override {
    reduce<float>("allreduce_floats", values, count, [](float a, float b) { return a + b; });
  }

  void barrier() override {
    post("barrier", Post{});
    sync("barrier");
  }

  // Every rank posts its color and key; the lowest rank of each color makes
  // the new group; each member then takes it, its rank the place of (key, rank)
  // among the members.
  std::unique_ptr<Communicator> split(int color, int key) override {
    const char* what = "split";
    Post p;
    p.color = color;
    p.key = key;
    post(what, p);
    std::vector<std::pair<int, int>> members;  // (key, rank) of this color
    for (int r = 0; r < size(); ++r) {
      const Post& q = posts()[static_cast<std::size_t>(r)];
      if (q.color == color) members.emplace_back(q.key, r);
    }
    std::sort(members.begin(), members.end());
    const int leader = std::min_element(members.begin(), members.end(), [](auto& a, auto& b) {
                         return a.second < b.second;
                       })->second;
    if (rank_ == leader)
      group_->made[static_cast<std::size_t>(rank_)] =
          std::make_shared<Group>(static_cast<int>(members.size()));
    sync(what);
    std::shared_ptr<Group> made = group_->made[static_cast<std::size_t>(leader)];
    sync(what);
    const auto place = std::find(members.begin(), members.end(), std::make_pair(key, rank_));
    return std::make_unique<ThreadCommunicator>(
        std::move(made), static_cast<int>(place - members.begin()), options_);
  }

  [[noreturn]] void abort(int code) noexcept override {
    std::cerr << "threads communicator: rank " << rank_ << " of " << size()
              << " ends the process with status " << code << std::endl;
    std::_Exit(code);
  }

 private:
  const std::vector<Post>& posts() const { return group_->posts; }

  void check_root(const char* what, int root) const {
    if (root < 0 || root >= size())
      raise<UsageError>("threads ", what, ": root ", root, " is not a rank of ", size());
  }

  // Posts this rank's part and waits for every rank's.
  void post(const char* what, const Post& p) {
    {
      std::lock_guard<std::mutex> lock(group_->mutex);
      if (!group_->broken.empty()) broken(what, group_->broken);
      group_->posts[static_cast<std::size_t>(rank_)] = p;
    }
    sync(what);
  }

  // Every rank reads every rank's input, reduces in rank order into its own
  // scratch, and writes its buffer only once every rank has read.
  template <typename T, typename Op>
  void reduce(const char* what, T* values, std::size_t count, Op op) {
    Post p;
    p.in = values;
    p.bytes = count;
    post(what, p);
    for (int r = 0; r < size(); ++r)
      if (posts()[static_cast<std::size_t>(r)].bytes != count)
        fail_alike(
            what, detail::concat("rank ", r, " passed ", posts()[static_cast<std::size_t>(r)].bytes,
                                 " values, rank ", rank_, " ", count));
    std::vector<T> out(static_cast<const T*>(posts()[0].in),
                       static_cast<const T*>(posts()[0].in) + count);
    for (int r = 1; r < size(); ++r) {
      const T* in = static_cast<const T*>(posts()[static_cast<std::size_t>(r)].in);
      for (std::size_t i = 0; i < count; ++i) out[i] = op(out[i], in[i]);
    }
    sync(what);
    std::copy(out.begin(), out.end(), values);
  }

  // Waits until every rank of the group has reached the same point, for at
  // most the communicator's timeout; on expiry the group is broken for all.
  void sync(const char* what) {
    std::unique_lock<std::mutex> lock(group_->mutex);
    if (!group_->broken.empty()) broken(what, group_->broken);
    const std::uint64_t generation = group_->generation.load(std::memory_order_relaxed);
    if (++group_->arrived == group_->size) {
      group_->arrived = 0;
      group_->generation.store(generation + 1, std::memory_order_release);
      lock.unlock();  // (the woken ranks need the mutex: not held while they wake)
      group_->changed.notify_all();
      return;
    }
    // The last ranks to arrive usually come within a few time slices: give them
    // the core before sleeping (with more ranks than cores, a sleep and wake-up
    // per rank and collective is most of a small collective's cost).
    lock.unlock();
    for (int i = 0; i < kYieldsBeforeSleeping; ++i) {
      if (group_->generation.load(std::memory_order_acquire) != generation) return;
      std::this_thread::yield();
    }
    lock.lock();
    const bool done = group_->changed.wait_for(lock, options_.timeout, [&] {
      return group_->generation.load(std::memory_order_relaxed) != generation ||
             !group_->broken.empty();
    });
    if (group_->generation.load(std::memory_order_relaxed) != generation) return;
    if (!done) {
      group_->broken = detail::concat("threads ", what, " timed out after ",
                                      options_.timeout.count(), " ms on rank ", rank_, " of ",
                                      size(), " (", group_->arrived, " ranks arrived)");
      group_->changed.notify_all();
      const std::string message = group_->broken;
      lock.unlock();
      failed<CommTimeoutError>(message);
    }
    broken(what, group_->broken);
  }

  // A check that every rank makes from the same posts: every rank raises it.
  [[noreturn]] void fail_alike(const char* what, const std::string& why) {
    failed<CommError>(detail::concat("threads ", what, ": ", why));
  }

  [[noreturn]] void broken(const char* what, const std::string& why) {
    failed<CommError>(detail::concat("threads ", what, " on rank ", rank_,
                                     ": the communicator is broken (", why, ")"));
  }

  template <typename E>
  [[noreturn]] void failed(const std::string& message) {
    if (options_.abort_on_failure) {
      std::cerr << message << std::endl;
      abort(1);
    }
    raise<E>(message);
  }

  std::shared_ptr<Group> group_;
  int rank_;
  CommOptions options_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size,
                                                                     CommOptions options) {
  if (size < 1) raise<UsageError>("make_thread_communicators: size must be positive, got ", size);
  detail::check_timeout("the threads communicator's timeout", options.timeout);
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r)
    out.push_back(std::make_unique<ThreadCommunicator>(group, r, options));
  return out;
}

}  // namespace tpreload
