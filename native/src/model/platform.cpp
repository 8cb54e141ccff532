#include "platform.h"

#include <cstdlib>

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <malloc.h>
#include <windows.h>
#else
#include <sys/mman.h>
#endif

namespace kwker::platform {

// Windows' C runtime has no aligned_alloc (its free cannot release such a block), and macOS has it
// only from 10.15 on (wheels target older releases): posix_memalign serves the other systems.
void* aligned_alloc(size_t align, size_t size) {
#if defined(_WIN32)
  return _aligned_malloc(size, align);
#elif defined(__linux__)
  return std::aligned_alloc(align, size);
#else
  void* p = nullptr;
  return posix_memalign(&p, align, size) == 0 ? p : nullptr;
#endif
}

void aligned_free(void* p) {
#if defined(_WIN32)
  _aligned_free(p);
#else
  std::free(p);
#endif
}

// An anonymous mapping; on Windows committed pages, which the system also zeroes on first touch.
void* map_pages(size_t bytes) {
#if defined(_WIN32)
  return VirtualAlloc(nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
#else
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
#endif
}

void unmap_pages(void* p, size_t bytes) {
#if defined(_WIN32)
  (void)bytes;
  VirtualFree(p, 0, MEM_RELEASE);
#else
  munmap(p, bytes);
#endif
}

// Linux takes the advice where the system allows (THP in `madvise` mode). Elsewhere there is none
// to give: Windows' large pages need a privilege and are never paged out; macOS has no such advice.
void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, bytes, MADV_HUGEPAGE);  // no error if the system declines
#else
  (void)p, (void)bytes;
#endif
}

}  // namespace kwker::platform
