// What this machine runs and how fast it can go: the ISA checks, and the probes `kwker bench` holds
// its figures against (read bandwidth, FMA and int8 dot-product peaks).
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "../kernels/cpu_features.h"
#include "../kernels/kernels.h"
#include "../model/roofline.h"
#include "../model/threadpool.h"

namespace py = pybind11;

namespace kwker {

namespace {

void check_threads(int threads) {
  if (threads < 1 || threads > kMaxThreads)
    throw std::invalid_argument("threads must be between 1 and " + std::to_string(kMaxThreads));
}

}  // namespace

void register_machine(py::module_& m) {
  m.def("isa_supported", &isa_supported, py::arg("isa"),
        "Whether this CPU runs the given ISA's kernels.");
  m.def("isa_best", &isa_best, "The best ISA this CPU runs.");
  m.def(
      "cpu_features",
      [] {
        const CpuFeatures& f = cpu_features();
        py::dict d;
        for (auto [name, on] : {std::pair<const char*, bool>{"avx2", f.avx2},
                                {"fma", f.fma},
                                {"f16c", f.f16c},
                                {"avx512f", f.avx512f},
                                {"avx512bw", f.avx512bw},
                                {"avx512vl", f.avx512vl},
                                {"avx512dq", f.avx512dq},
                                {"avx512vnni", f.avx512vnni},
                                {"avx512bf16", f.avx512bf16}})
          d[name] = on;
        return d;
      },
      "The CPU features the ISA checks read (CPUID bits the operating system also enables).");
  m.def(
      "measure_read_bandwidth",
      [](size_t bytes, int threads, int repeats) {
        check_threads(threads);
        if (bytes < 4096 || bytes > (size_t(1) << 36) || repeats < 1)
          throw std::invalid_argument("bytes must be 4 KB .. 64 GB and repeats positive");
        py::gil_scoped_release release;
        return measure_read_bandwidth(bytes, threads, repeats);
      },
      py::arg("bytes"), py::arg("threads"), py::arg("repeats") = 8,
      "Best read GB/s over a buffer of `bytes`.");
  m.def(
      "measure_fma_peak",
      [](int threads) {
        check_threads(threads);
        py::gil_scoped_release release;
        return measure_fma_peak(threads);
      },
      py::arg("threads"), "Best float32 FMA GFLOP/s (AVX2, 12 accumulators in registers).");
  m.def(
      "measure_int8_peak",
      [](int threads) {
        check_threads(threads);
        py::gil_scoped_release release;
        return measure_int8_peak(threads);
      },
      py::arg("threads"),
      "Best int8 (u8 x s8) G multiply-accumulates/s: AVX2 vpmaddubsw or AVX-512 VNNI vpdpbusd.");
}

}  // namespace kwker
