# CMake toolchain for building for 64-bit Windows on Linux with Debian's MinGW-w64 (package
# mingw-w64): GCC by default, or clang with -DKWKER_MINGW_CLANG=clang++-19 (MinGW's headers and
# libraries, clang's code generation). Used by scripts/cross_build_windows.sh.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(KWKER_MINGW_TRIPLE x86_64-w64-mingw32)
if(KWKER_MINGW_CLANG)
  set(CMAKE_CXX_COMPILER ${KWKER_MINGW_CLANG})
  set(CMAKE_CXX_COMPILER_TARGET ${KWKER_MINGW_TRIPLE})
  # clang takes the C++ library of the first GCC it finds, Debian's win32 thread model (no
  # std::mutex): point it at the posix one's headers and libraries
  execute_process(COMMAND ${KWKER_MINGW_TRIPLE}-g++-posix -print-libgcc-file-name
                  OUTPUT_VARIABLE _libgcc OUTPUT_STRIP_TRAILING_WHITESPACE)
  get_filename_component(_gcc_dir "${_libgcc}" DIRECTORY)
  set(CMAKE_CXX_FLAGS_INIT "-nostdinc++ -isystem ${_gcc_dir}/include/c++ \
-isystem ${_gcc_dir}/include/c++/${KWKER_MINGW_TRIPLE} -isystem ${_gcc_dir}/include/c++/backward")
  # -pthread: the driver then links winpthread after libstdc++, which calls it
  set(CMAKE_EXE_LINKER_FLAGS_INIT "-L${_gcc_dir} -pthread")
  set(CMAKE_SHARED_LINKER_FLAGS_INIT "-L${_gcc_dir} -pthread")
else()
  # the posix thread model: GCC 12's win32 one has no std::thread
  set(CMAKE_CXX_COMPILER ${KWKER_MINGW_TRIPLE}-g++-posix)
endif()
set(CMAKE_FIND_ROOT_PATH /usr/${KWKER_MINGW_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
