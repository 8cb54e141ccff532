// y = x w^T + b for one float32 weight matrix, packed once into the kernels' panel layout and run
// on a shared thread pool: what kwker.torch_ops puts under torch.nn.Linear.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "../kernels/kernels.h"
#include "buffer.h"
#include "threadpool.h"

namespace kwker {

class Linear {
 public:
  // w: [n, k] float32, bias: [n] or null. The pool is shared by every Linear that uses it.
  Linear(const float* w, int n, int k, const float* bias, std::shared_ptr<ThreadPool> pool,
         const std::string& isa);
  // x: m rows of k floats (row stride ldx); y: m rows of n floats (row stride ldy).
  void forward(const float* x, int m, int ldx, float* y, int ldy);
  int n() const { return n_; }
  int k() const { return k_; }

 private:
  int n_, k_, kp_, np_;
  const Kernels* kern_;
  std::shared_ptr<ThreadPool> pool_;
  Buffer w_, bias_, xs_, ys_;  // packed weights, padded bias, padded scratch for x and y
  int scratch_rows_ = 0;
  std::mutex mu_;  // the scratch buffers serve one call at a time
};

}  // namespace kwker
