#include "threadpool.h"

#include <chrono>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KWKER_PAUSE() _mm_pause()
#else
#define KWKER_PAUSE() ((void)0)
#endif

namespace kwker {

namespace {

// Every thread computes a step in the default floating-point environment (round to nearest even, no
// flush-to-zero): the caller's thread may have another (torch.set_flush_denormal sets FTZ/DAZ), and
// the kernels' bits must not depend on which thread, or whose caller, computes a value.
class DefaultFpEnv {
 public:
#if defined(__x86_64__) || defined(__i386__)
  DefaultFpEnv() : saved_(_mm_getcsr()) { _mm_setcsr(kDefault); }
  ~DefaultFpEnv() { _mm_setcsr(saved_); }

 private:
  // all exceptions masked, round to nearest, no FTZ/DAZ
  static constexpr unsigned kDefault = 0x1f80;
  unsigned saved_;
#endif
};

// How long an idle worker spins before it sleeps: long enough to bridge the Python work between two
// steps.
constexpr auto kSpinTime = std::chrono::milliseconds(2);
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_(n_threads) {
  if (n_threads < 1 || n_threads > kMaxThreads)
    throw std::invalid_argument("threads must be between 1 and " + std::to_string(kMaxThreads) +
                                ", got " + std::to_string(n_threads));
  try {
    for (int t = 1; t < n_; t++) threads_.emplace_back([this, t] { worker(t); });
  } catch (
      ...) {  // the destructor does not run for a half-built pool: stop the workers that did start
    stop_and_join();
    throw;
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
    epoch_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& th : threads_) th.join();
  threads_.clear();
}

void ThreadPool::worker(int tid) {
  uint64_t seen = 0;
  for (;;) {
    auto start = std::chrono::steady_clock::now();
    int spins = 0;
    while (epoch_.load(std::memory_order_acquire) == seen) {
      KWKER_PAUSE();
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() - start > kSpinTime) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return epoch_.load(std::memory_order_acquire) != seen; });
      }
    }
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    {
      DefaultFpEnv env;
      (*job_)(tid);
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  std::lock_guard<std::mutex> caller(run_mu_);  // one parallel region at a time, whoever calls
  DefaultFpEnv env;
  if (n_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(mu_);
    epoch_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(0);
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != n_ - 1) {
    KWKER_PAUSE();
    if (++spins > 4096) std::this_thread::yield();
  }
}

void ThreadPool::barrier() {
  if (n_ == 1) return;
  const uint64_t gen = bar_gen_.load(std::memory_order_acquire);
  if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
    bar_count_.store(0, std::memory_order_relaxed);
    bar_gen_.fetch_add(1, std::memory_order_release);
    return;
  }
  int spins = 0;
  while (bar_gen_.load(std::memory_order_acquire) == gen) {
    KWKER_PAUSE();
    if (++spins > 4096) std::this_thread::yield();  // oversubscribed: let the late thread run
  }
}

std::pair<int, int> ThreadPool::split(int total, int tid, int align) const {
  const int units = (total + align - 1) / align;
  const int per = units / n_, extra = units % n_;
  int b = tid * per + (tid < extra ? tid : extra);
  int e = b + per + (tid < extra ? 1 : 0);
  b *= align;
  e *= align;
  return {b < total ? b : total, e < total ? e : total};
}

}  // namespace kwker
