// Small concurrency and agreement helpers of the reload engine (internal).
#pragma once

#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"

namespace tpreload::detail {

// A closable FIFO between the reader, transfer and apply threads.
template <typename T>
class BlockingQueue {
 public:
  void push(T value) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(std::move(value));
    }
    ready_.notify_one();
  }
  // Blocks until an item arrives; nullopt once closed and drained.
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return std::nullopt;
    T value = std::move(items_.front());
    items_.pop_front();
    return value;
  }
  // As pop(), but gives up after `timeout` (nullopt, with *timed_out set).
  template <typename Duration>
  std::optional<T> pop_for(Duration timeout, bool* timed_out) {
    std::unique_lock<std::mutex> lock(mutex_);
    *timed_out = !ready_.wait_for(lock, timeout, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return std::nullopt;
    T value = std::move(items_.front());
    items_.pop_front();
    return value;
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
  bool closed_ = false;
};

// COLLECTIVE. If any rank has a problem, every rank throws the same `E` whose
// message names the lowest such rank, its problem, and how many ranks had one.
template <typename E>
void agree_on_problem(Communicator& comm, const std::optional<std::string>& problem,
                      const std::string& what) {
  std::int64_t first = problem ? comm.rank() : INT64_MAX;
  comm.allreduce_ints(&first, 1, IntOp::kMin);
  if (first == INT64_MAX) return;
  std::int64_t ranks_with_problem = problem ? 1 : 0;
  comm.allreduce_ints(&ranks_with_problem, 1, IntOp::kSum);
  std::int64_t length = comm.rank() == first ? static_cast<std::int64_t>(problem->size()) : 0;
  comm.allreduce_ints(&length, 1, IntOp::kMax);
  std::string message(static_cast<std::size_t>(length), '\0');
  if (comm.rank() == first) message = *problem;
  comm.broadcast(MutableBytes(message.data(), message.size()), static_cast<int>(first));
  std::string others;
  if (ranks_with_problem > 1) others = concat(" (and on ", ranks_with_problem - 1, " other ranks)");
  raise<E>(what, " failed on rank ", first, "/", comm.size(), ": ", message, others);
}

}  // namespace tpreload::detail
