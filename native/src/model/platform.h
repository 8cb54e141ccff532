// Memory from the system, the same way on Linux, macOS and Windows: 64-byte aligned heap blocks,
// zero-filled page mappings and the huge-page advice. Only platform.cpp knows the system calls (and
// only it includes <windows.h>, whose macros would reach every file that includes this one).
#pragma once

#include <cstddef>

namespace kwker::platform {

// size bytes aligned to `align` (a power of two, size a multiple of it), or null; freed with
// aligned_free.
void* aligned_alloc(size_t align, size_t size);
void aligned_free(void* p);

// bytes of zero-filled, page-aligned memory that becomes resident only where it is written, or
// null; returned with unmap_pages(p, bytes).
void* map_pages(size_t bytes);
void unmap_pages(void* p, size_t bytes);

// Asks for transparent huge pages over [p, p + bytes) (p 2 MB aligned): advice only.
void advise_huge_pages(void* p, size_t bytes);

}  // namespace kwker::platform
