// Small concurrency helpers of the reload engine (internal).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "tpreload/comm/agreement.h"

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

using tpreload::agree_on_problem;

}  // namespace tpreload::detail
