// 64-byte aligned, zero-initialised storage: weights, KV cache and scratch are allocated once with
// it. Large buffers are anonymous mappings: the kernel hands out zeroed pages on first write, so
// memory is resident only where it is used (a KV cache sized for 2048 tokens costs RAM for the
// tokens it holds; perf-notes #6). Small ones come from the heap, zeroed here.
#pragma once

#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "platform.h"

namespace kwker {

class Buffer {
 public:
  static constexpr size_t kMappedBytes = size_t(1)
                                         << 20;  // from this size on: an anonymous mapping

  static constexpr size_t kHugePage = size_t(2) << 20;

  Buffer() = default;
  // huge_pages: an anonymous mapping aligned to 2 MB and advised for transparent huge pages (Linux,
  // where the system allows them: `madvise` mode), for memory that is streamed whole on every step
  // (weights).
  explicit Buffer(size_t bytes, bool huge_pages = false) : size_(bytes) {
    if (bytes == 0) return;
    mapped_ = huge_pages || bytes >= kMappedBytes;
    if (mapped_) {  // page aligned and zero filled by the kernel
      const size_t span = huge_pages ? (bytes + kHugePage - 1) / kHugePage * kHugePage : bytes;
      map_bytes_ = span + (huge_pages ? kHugePage : 0);  // room to align the start
      map_ = platform::map_pages(map_bytes_);
      if (!map_) throw std::bad_alloc();
      const uintptr_t a = reinterpret_cast<uintptr_t>(map_);
      data_ = reinterpret_cast<void*>(huge_pages ? (a + kHugePage - 1) / kHugePage * kHugePage : a);
      if (huge_pages) platform::advise_huge_pages(data_, span);
      return;
    }
    const size_t rounded = (bytes + 63) / 64 * 64;
    data_ = platform::aligned_alloc(64, rounded);
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, rounded);
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept
      : data_(o.data_), size_(o.size_), mapped_(o.mapped_), map_(o.map_), map_bytes_(o.map_bytes_) {
    o.data_ = nullptr, o.size_ = 0, o.mapped_ = false, o.map_ = nullptr, o.map_bytes_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(mapped_, o.mapped_);
    std::swap(map_, o.map_);
    std::swap(map_bytes_, o.map_bytes_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void release() {
    if (!data_) return;
    if (mapped_)
      platform::unmap_pages(map_, map_bytes_);
    else
      platform::aligned_free(data_);
    data_ = nullptr;
  }

  void* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  void* map_ = nullptr;  // the mapping (data_ is aligned within it)
  size_t map_bytes_ = 0;
};

}  // namespace kwker
