/* emu_host.h - the host side of the CUDA emulator (tests only, issue 7):
 * compiles a CUDA module's source (prelude + kernels, as codegen/cuda.h's
 * functions print it) with the host C++ compiler against the emulation
 * header tests/cuda/emu/ts_cuda_emu.h into a shared object, dlopens it and
 * launches its kernels on the CPU (docs/cuda.md, "Emulation").  Emulated
 * device memory is host memory: pass host pointers in CgCudaArgs.
 *
 * To use it from a test executable in another folder, add to its
 * CMakeLists.txt (see tests/cuda/CMakeLists.txt):
 *   add_executable(T ... ${PROJECT_SOURCE_DIR}/tests/cuda/emu_host.c)
 *   target_link_libraries(T tessera)          # ir/util.h, codegen/cuda.h
 *   target_include_directories(T PRIVATE ${PROJECT_SOURCE_DIR}/tests/cuda)
 *   target_compile_definitions(T PRIVATE TS_EMU_CXX_DEFAULT="${CMAKE_CXX_COMPILER}"
 *                              TS_EMU_HEADER="${PROJECT_SOURCE_DIR}/tests/cuda/emu/ts_cuda_emu.h")
 * and #include "emu_host.h".
 *
 * Environment: TS_EMU_CXX overrides the compiler (may hold words, e.g.
 * "ccache g++"); TS_EMU_CXXFLAGS adds flags (e.g. -DTS_EMU_UCONTEXT, the
 * portable context switch); TS_EMU_KEEP=1 keeps the temporary directory
 * (source, shared object, compiler log) and names it in messages.
 * Launches of one module are serialized (a mutex in the module): its
 * blocks run one at a time, threads as user-level threads. */
#ifndef TS_EMU_HOST_H
#define TS_EMU_HOST_H
#include "codegen/cuda.h"

typedef struct TsEmu TsEmu;

/* Compiles a CUDA module source with the host C++ compiler
 * (-std=c++17 -O1 -fPIC -shared -x c++ -include ts_cuda_emu.h -w) into a
 * shared object in a fresh directory under $TMPDIR (default /tmp) and
 * dlopens it.  NULL with a message (the compiler's first error lines) on
 * failure. */
TsEmu *ts_emu_load(const char *source, char *err, size_t errlen);

/* Runs kernel l->name over l->blocks x l->threads with arguments a (host
 * pointers).  0, or -1 with a message: unknown kernel, bad launch shape
 * (threads a multiple of 32 in 32 .. 1024, blocks 1 .. 2^31-1), a
 * __syncthreads not reached by every thread of the block, a shuffle by a
 * partial warp, a deadlock. */
int ts_emu_launch_kernel(TsEmu *e, const CgCudaLaunch *l, const CgCudaArgs *a, char *err, size_t errlen);

/* dlclose; removes the temporary files.  NULL is fine. */
void ts_emu_free(TsEmu *e);

#endif
