#include "linear.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace kwker {

Linear::Linear(const float* w, int n, int k, const float* bias, std::shared_ptr<ThreadPool> pool,
               const std::string& isa)
    : n_(n),
      k_(k),
      kp_(pad_to(k)),
      np_(pad_to(n, kPanel)),
      kern_(&kernels_select(isa)),
      pool_(std::move(pool)) {
  if (n < 1 || k < 1) throw std::invalid_argument("a Linear needs positive sizes");
  w_ = Buffer(panel_bytes(WType::F32, n, k));
  pool_->run([&](int tid) {
    auto [p0, p1] = pool_->split(np_ / kPanel, tid);
    pack_panel_range(w + size_t(p0) * kPanel * k, WType::F32, n, k, w_.as<void>(), p0, p1);
  });
  if (bias) {
    bias_ = Buffer(sizeof(float) * np_);
    std::memcpy(bias_.as<float>(), bias, sizeof(float) * n);
  }
}

void Linear::forward(const float* x, int m, int ldx, float* y, int ldy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m > scratch_rows_) {
    scratch_rows_ = std::max(m, 2 * scratch_rows_);
    // zeroed: the padding columns stay 0
    xs_ = Buffer(sizeof(float) * size_t(scratch_rows_) * kp_);
    ys_ = Buffer(sizeof(float) * size_t(scratch_rows_) * np_);
  }
  float* xs = xs_.as<float>();
  float* ys = ys_.as<float>();
  const float* b = bias_.size() ? bias_.as<float>() : nullptr;
  pool_->run([&](int tid) {
    auto [t0, t1] = pool_->split(m, tid);
    for (int t = t0; t < t1; t++)
      std::memcpy(xs + size_t(t) * kp_, x + size_t(t) * ldx, sizeof(float) * k_);
    pool_->barrier();
    auto [p0, p1] = pool_->split(np_ / kPanel, tid);
    if (p0 < p1)
      kern_->matmul[int(WType::F32)](xs, m, kp_, w_.as<void>(), kp_, p0, p1, ys, np_, b, false);
    pool_->barrier();
    for (int t = t0; t < t1; t++)
      std::memcpy(y + size_t(t) * ldy, ys + size_t(t) * np_, sizeof(float) * n_);
  });
}

}  // namespace kwker
