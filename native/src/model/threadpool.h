// A persistent pool for one decode step: every thread runs the same step body (a parallel region,
// the caller is thread 0) and meets the others at barriers between phases. Workers spin briefly
// after a step so that the next one starts without a wake-up, then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kwker {

// The most threads a pool takes: more than any CPU this runs on has cores, and few enough that a
// mistaken count (threads=400) is refused instead of starting hundreds of spinning threads.
constexpr int kMaxThreads = 256;

class ThreadPool {
 public:
  // 1 <= n_threads <= kMaxThreads (std::invalid_argument otherwise). If a thread cannot be started,
  // the ones already started are stopped and joined, and the error (std::system_error) propagates.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }
  // Runs fn(tid) on every thread, tid 0 on the caller; returns when all are done. Callers on other
  // threads wait their turn.
  void run(const std::function<void(int)>& fn);
  // Called by every thread inside run(): returns when all threads have reached it.
  void barrier();

  // [begin, end) of `total` items for thread tid, cut at multiples of `align`.
  std::pair<int, int> split(int total, int tid, int align = 1) const;

 private:
  void worker(int tid);
  void stop_and_join();  // ends every started worker

  int n_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> done_{0};
  std::atomic<int> bar_count_{0};
  std::atomic<uint64_t> bar_gen_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::mutex run_mu_;
  std::condition_variable cv_;
};

}  // namespace kwker
