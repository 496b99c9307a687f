/* ts_cuda_emu.h - CUDA on the CPU for the tests (issue 7; docs/cuda.md,
 * "Emulation").  Force-included (g++ -include) before a CUDA module's
 * source, which then compiles with the host C++ compiler into a shared
 * object (tests/cuda/emu_host.c).  It provides exactly the CUDA subset
 * the generated and library kernels use (docs/cuda.md, "The kernel ABI")
 * and the launcher the module exports:
 *   extern "C" int ts_emu_launch(void (*fn)(TsArgs), const TsArgs *a, long long blocks, int threads,
 *                                char *err, unsigned long errlen);
 *
 * How it runs.  Blocks run one after another on the calling OS thread (a
 * mutex serializes launches of one module), so a function-static array is
 * exactly one block's shared memory: __shared__ is `static`.  A block's
 * threads are user-level threads, one worker per thread index with its
 * own mmap'd stack (TS_EMU_STACK_BYTES, a guard page below), kept across
 * blocks and launches.  A worker runs until it reaches a barrier or
 * returns; a FIFO scheduler then runs the next ready one (deterministic).
 * Barriers: __syncthreads (the whole block) and every warp shuffle (the
 * warp of 32 consecutive threads: each lane deposits its value, waits for
 * all 32, reads its source lane; deposits alternate between two buffers,
 * so one wait per shuffle suffices).  Atomics are plain read-modify-write:
 * threads switch only at barriers.  A barrier some threads can never pass
 * (divergent __syncthreads, a shuffle in a warp with returned lanes,
 * deadlock) ends the launch with a message; the abandoned workers' stacks
 * are reset.
 * Order (TS_EMU_ORDER, read at each launch): "fifo" (the default: blocks
 * ascending, threads in index order at the start and after each barrier),
 * "reverse" (blocks descending, threads in reverse index order), or
 * "random[:SEED]" (blocks in an order given by a bijection of their
 * indices, threads shuffled at the start and at every barrier release,
 * from SEED, default 1).  A kernel whose result depends on the order in
 * which its threads or blocks run (a race a GPU may show) gives different
 * bits under another order; the suite runs under all three.  Each block
 * starts with its shared memory poisoned (every __shared__ variable lives in
 * the section ts_shared, filled with 0xff bytes: NaN, -1), and the threads a
 * barrier or a warp shuffle releases together must all wait at the same
 * one (the module line it is called from; a kernel that reaches two
 * different __syncthreads in two threads is refused).  The context
 * switch is a few lines of x86-64 assembly
 * (callee-saved registers, MXCSR and the x87 control word; no signal-mask
 * system call as swapcontext makes); -DTS_EMU_UCONTEXT, and any other
 * architecture, use makecontext / swapcontext instead.
 *
 * __syncwarp and the WMMA subset (nvcuda::wmma, below) are warp barriers
 * as the shuffles are: every lane of the warp at the same call site.
 * Not emulated: partial shuffle masks (reported), dynamic shared memory,
 * 2-D/3-D launches, memory-model races (threads never interleave between
 * barriers, so a race a GPU would show is invisible here), a stack
 * overflow (the guard page faults: the test crashes). */
#ifndef TS_CUDA_EMU_H
#define TS_CUDA_EMU_H
#ifndef __cplusplus
#error "ts_cuda_emu.h is a C++ header (compile the module with -x c++)"
#endif

#include "../../../runtime/cpu/half.h"   /* the 16-bit conversions (WMMA) */
#include <math.h>   /* libstdc++'s math.h: the float overloads (exp(float) ...) in the global namespace, as CUDA has */
#include <cmath>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <type_traits>
#include <unistd.h>

#if !defined(__x86_64__) && !defined(TS_EMU_UCONTEXT)
#define TS_EMU_UCONTEXT 1
#endif
#ifdef TS_EMU_UCONTEXT
#include <ucontext.h>
#endif
#ifndef TS_EMU_STACK_BYTES
#define TS_EMU_STACK_BYTES (256 * 1024)
#endif

/* ---- the kernel ABI (codegen/cuda.h: CgCudaArgs, same layout) ---- */
typedef struct {
  void *b[32];
  const long long *run;
} TsArgs;
#define TS_ARGS_DEFINED 1

/* ---- qualifiers ---- */
#define __global__
#define __device__
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
/* every __shared__ variable in one section, so that each block starts
 * with its shared memory poisoned (0xff bytes: NaN, -1), as a GPU gives
 * garbage: a kernel must not read what its block has not written */
#define __shared__ static __attribute__((section("ts_shared")))

/* ---- built-in vector types ---- */
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) double2 {
  double x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) ushort4 {
  unsigned short x, y, z, w;
};
static inline float2 make_float2(float x, float y) { float2 r = {x, y}; return r; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 r = {x, y, z, w}; return r; }
static inline double2 make_double2(double x, double y) { double2 r = {x, y}; return r; }
static inline int4 make_int4(int x, int y, int z, int w) { int4 r = {x, y, z, w}; return r; }

/* ---- built-in variables: the running user-level thread's values (the
 * scheduler stores threadIdx before it switches to a thread, so whatever
 * a kernel reads, from memory or a register saved across a switch, is its
 * own) ---- */
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

/* ---- math: libm's, plus what CUDA has and libm lacks ---- */
using std::isinf;
using std::isnan;
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* glibc's math.h declares __expf / __logf (its internal names): ours are renamed */
static inline float ts_emu_expf(float x) { return expf(x); }
static inline float ts_emu_logf(float x) { return logf(x); }
#define __expf ts_emu_expf
#define __logf ts_emu_logf
static inline float __fdividef(float a, float b) { return a / b; }

/* ---- the scheduler ---- */
namespace ts_emu_impl {

enum { T_READY, T_SYNC, T_WARP, T_DONE, T_FAIL };
enum { MAX_THREADS = 1024, WARP = 32 };

struct Ctx {
#ifdef TS_EMU_UCONTEXT
  ucontext_t uc;
#else
  void *sp;
#endif
};

struct Thread {
  Ctx ctx;
  int state;
  int parity;      /* which of the warp's two shuffle buffers this lane's next shuffle uses */
  int site;        /* the module line of the barrier or shuffle it waits at */
  int pred;        /* __syncthreads_or: its predicate */
};

struct Warp {
  unsigned long long buf[2][WARP];
  int arrived, done;   /* lanes waiting at the shuffle, lanes returned */
};

struct State {
  Thread th[MAX_THREADS];
  char *stack[MAX_THREADS];   /* lowest address of each worker's mapping (guard page first) */
  int nworkers;
  Ctx sched;
  Thread *cur;
  void (*fn)(TsArgs);
  const TsArgs *args;
  const char *fail;           /* message of a thread that gave up (T_FAIL) */
  Warp warp[MAX_THREADS / WARP];
  int queue[MAX_THREADS];     /* ready threads, FIFO ring */
  int qhead, qlen;
  int order;                  /* TS_EMU_ORDER: 0 fifo, 1 reverse, 2 random */
  int sync_or;                /* the OR of the predicates at the last barrier's release */
  unsigned long long rng;     /* random: the xorshift state */
};

static State S;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static size_t page_bytes() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

static void worker_main();

#ifdef TS_EMU_UCONTEXT
static void ctx_init(Ctx *c, char *lo, size_t bytes) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = lo;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = NULL;
  makecontext(&c->uc, worker_main, 0);
}
static inline void ctx_swap(Ctx *from, Ctx *to) { swapcontext(&from->uc, &to->uc); }
#else
/* ts_emu_swap(save, to): pushes the callee-saved registers and the FP
 * control words, stores the stack pointer in *save, switches to the stack
 * `to` and pops the same frame from it.  A new worker's stack holds such a
 * frame whose return address is worker_main. */
__asm__(".text\n"
        ".p2align 4\n"
        ".type ts_emu_swap, @function\n"
        "ts_emu_swap:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size ts_emu_swap, .-ts_emu_swap\n");
extern "C" void ts_emu_swap(void **save, void *to);

static void ctx_init(Ctx *c, char *lo, size_t bytes) {
  unsigned mxcsr;
  unsigned short fpucw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  void **sp = (void **)(((uintptr_t)(lo + bytes)) & ~(uintptr_t)15);
  *--sp = NULL;                      /* worker_main's "return address": it never returns */
  *--sp = (void *)worker_main;       /* popped by ts_emu_swap's ret; rsp = 8 mod 16 at entry, as after a call */
  for (int i = 0; i < 6; i++) *--sp = NULL;   /* rbp rbx r12 r13 r14 r15 */
  uint64_t csr = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
  *--sp = (void *)(uintptr_t)csr;
  c->sp = sp;
}
static inline void ctx_swap(Ctx *from, Ctx *to) { ts_emu_swap(&from->sp, to->sp); }
#endif

/* The running thread gives the CPU back to the scheduler (its state says why). */
static inline void yield(Thread *t) {
  ctx_swap(&t->ctx, &S.sched);
  __asm__ volatile("" ::: "memory");
}

static void worker_main() {
  for (;;) {   /* one kernel thread per turn; parked here between blocks and launches */
    Thread *t = S.cur;
    S.fn(*S.args);
    t->state = T_DONE;
    yield(t);
  }
}

/* Called by a kernel thread that cannot go on: the launch fails with msg. */
static void fail(const char *msg) {
  Thread *t = S.cur;
  S.fail = msg;
  t->state = T_FAIL;
  yield(t);
  abort();   /* never resumed */
}

static int add_workers(int n, char *err, unsigned long errlen) {
  size_t page = page_bytes();
  size_t bytes = ((size_t)TS_EMU_STACK_BYTES + page - 1) / page * page;
  while (S.nworkers < n) {
    void *p = mmap(NULL, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                   -1, 0);
    if (p == MAP_FAILED) {
      snprintf(err, errlen, "emulator: cannot map a %zu-byte thread stack", bytes + page);
      return -1;
    }
    mprotect(p, page, PROT_NONE);   /* guard page: an overflow faults instead of corrupting a neighbour */
    S.stack[S.nworkers] = (char *)p;
    ctx_init(&S.th[S.nworkers].ctx, (char *)p + page, bytes);
    S.th[S.nworkers].state = T_DONE;
    S.nworkers++;
  }
  return 0;
}

__attribute__((destructor)) static void unmap_workers() {
  size_t page = page_bytes();
  size_t bytes = ((size_t)TS_EMU_STACK_BYTES + page - 1) / page * page;
  for (int i = 0; i < S.nworkers; i++) munmap(S.stack[i], bytes + page);
  S.nworkers = 0;
}

/* Workers stopped inside a kernel (a failed launch) restart from the top. */
static void reset_workers(int n) {
  size_t page = page_bytes();
  size_t bytes = ((size_t)TS_EMU_STACK_BYTES + page - 1) / page * page;
  for (int i = 0; i < n; i++)
    if (S.th[i].state != T_DONE) {
      ctx_init(&S.th[i].ctx, S.stack[i] + page, bytes);
      S.th[i].state = T_DONE;
    }
}

static inline void push(int i) { S.queue[(S.qhead + S.qlen++) % MAX_THREADS] = i; }

static unsigned long long next_rand() {
  S.rng ^= S.rng << 13;
  S.rng ^= S.rng >> 7;
  S.rng ^= S.rng << 17;
  return S.rng;
}

/* Makes threads lo .. lo + n - 1 ready, in the launch's order. */
static void push_range(int lo, int n) {
  int ids[MAX_THREADS];
  for (int k = 0; k < n; k++) ids[k] = S.order == 1 ? lo + n - 1 - k : lo + k;
  if (S.order == 2)
    for (int k = n - 1; k > 0; k--) {
      int j = (int)(next_rand() % (unsigned long long)(k + 1)), t = ids[k];
      ids[k] = ids[j];
      ids[j] = t;
    }
  for (int k = 0; k < n; k++) {
    S.th[ids[k]].state = T_READY;
    push(ids[k]);
  }
}

/* TS_EMU_ORDER at a launch */
static void read_order() {
  const char *e = getenv("TS_EMU_ORDER");
  S.order = 0;
  if (!e || !*e || !strcmp(e, "fifo")) return;
  if (!strcmp(e, "reverse")) S.order = 1;
  else if (!strncmp(e, "random", 6)) {
    S.order = 2;
    S.rng = e[6] == ':' ? strtoull(e + 7, NULL, 10) : 1;
    S.rng = S.rng * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    if (!S.rng) S.rng = 1;
  }
}

/* The b-th block to run of `blocks`: a bijection of 0 .. blocks-1 */
static long long block_at(long long b, long long blocks, unsigned long long mul) {
  if (S.order == 1) return blocks - 1 - b;
  if (S.order == 2) return (long long)(((unsigned __int128)b * mul + 12345) % (unsigned long long)blocks);
  return b;
}

/* Why the threads of block b that have not returned can never go on. */
static void diagnose(long long b, int n, int nsync, int ndone, char *err, unsigned long errlen) {
  for (int w = 0; w < n / WARP; w++) {
    Warp *W = &S.warp[w];
    if (W->arrived > 0 && W->arrived + W->done == WARP) {
      snprintf(err, errlen,
               "emulator: block %lld, warp %d (threads %d..%d): a warp shuffle reached by %d lanes while %d lanes "
               "had returned (every lane of the warp must take part)",
               b, w, w * WARP, w * WARP + WARP - 1, W->arrived, W->done);
      return;
    }
  }
  int first_wait = -1, first_done = -1;
  for (int i = 0; i < n; i++) {
    if (S.th[i].state == T_SYNC && first_wait < 0) first_wait = i;
    if (S.th[i].state == T_DONE && first_done < 0) first_done = i;
  }
  if (nsync > 0 && nsync + ndone == n)
    snprintf(err, errlen,
             "emulator: block %lld: divergent __syncthreads: %d of %d threads wait at it (e.g. thread %d) but %d "
             "returned without reaching it (e.g. thread %d)",
             b, nsync, n, first_wait, ndone, first_done);
  else
    snprintf(err, errlen,
             "emulator: block %lld: deadlock: %d threads wait at __syncthreads, %d at warp shuffles, %d returned",
             b, nsync, n - nsync - ndone, ndone);
}

}  // namespace ts_emu_impl
extern "C" char __start_ts_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_ts_shared[] __attribute__((weak, visibility("hidden")));
namespace ts_emu_impl {

/* Whether threads lo .. lo + n - 1, all waiting, wait at one site; else a
 * message naming two that do not. */
static int one_site(long long b, int lo, int n, const char *what, char *err, unsigned long errlen) {
  for (int j = lo + 1; j < lo + n; j++)
    if (S.th[j].site != S.th[lo].site) {
      snprintf(err, errlen,
               "emulator: block %lld: threads reach different %s (thread %d at line %d of the module, thread %d at "
               "line %d): every thread must wait at the same one",
               b, what, lo, S.th[lo].site, j, S.th[j].site);
      return 0;
    }
  return 1;
}

/* Runs block b of the current launch with n threads.  0, or -1 with a message. */
static int run_block(long long b, int n, char *err, unsigned long errlen) {
  blockIdx.x = (unsigned)b;
  if (__start_ts_shared && __stop_ts_shared > __start_ts_shared)   /* the block's shared memory: garbage */
    memset(__start_ts_shared, 0xff, (size_t)(__stop_ts_shared - __start_ts_shared));
  S.qhead = 0;
  S.qlen = 0;
  for (int i = 0; i < n; i++) S.th[i].parity = 0;
  push_range(0, n);
  for (int w = 0; w < n / WARP; w++) S.warp[w].arrived = S.warp[w].done = 0;
  int nsync = 0, ndone = 0;
  while (S.qlen > 0) {
    int i = S.queue[S.qhead];
    S.qhead = (S.qhead + 1) % MAX_THREADS;
    S.qlen--;
    Thread *t = &S.th[i];
    S.cur = t;
    threadIdx.x = (unsigned)i;
    ctx_swap(&S.sched, &t->ctx);
    switch (t->state) {
    case T_SYNC:
      if (++nsync == n) {   /* every thread is here: none is queued */
        if (!one_site(b, 0, n, "__syncthreads", err, errlen)) return -1;
        S.sync_or = 0;
        for (int j = 0; j < n; j++) S.sync_or |= S.th[j].pred;
        nsync = 0;
        push_range(0, n);
      }
      break;
    case T_WARP: {
      Warp *W = &S.warp[i / WARP];
      if (++W->arrived == WARP) {
        if (!one_site(b, i / WARP * WARP, WARP, "warp shuffles", err, errlen)) return -1;
        W->arrived = 0;
        push_range(i / WARP * WARP, WARP);
      }
      break;
    }
    case T_DONE:
      ndone++;
      S.warp[i / WARP].done++;
      break;
    case T_FAIL:
      snprintf(err, errlen, "emulator: block %lld, thread %d: %s", b, i, S.fail);
      return -1;
    default:
      snprintf(err, errlen, "emulator: block %lld, thread %d: bad scheduler state %d", b, i, t->state);
      return -1;
    }
  }
  if (ndone == n) return 0;
  diagnose(b, n, nsync, ndone, err, errlen);
  return -1;
}

/* ---- warp shuffles ---- */
template <class T> struct shfl_type : std::false_type {};
template <> struct shfl_type<float> : std::true_type {};
template <> struct shfl_type<double> : std::true_type {};
template <> struct shfl_type<int> : std::true_type {};
template <> struct shfl_type<unsigned> : std::true_type {};
template <> struct shfl_type<long long> : std::true_type {};
template <> struct shfl_type<unsigned long long> : std::true_type {};

/* Every lane deposits v and waits for its warp; then reads lane src's
 * value (src < 0: its own). */
template <class T> static inline T exchange(unsigned mask, T v, int src, int width) {
  static_assert(shfl_type<T>::value, "warp shuffles take float, double, int, unsigned, long long, unsigned long long");
  if (mask != 0xffffffffu) fail("a warp shuffle with a partial mask (only 0xffffffff is emulated)");
  if (width < 1 || width > WARP || (width & (width - 1))) fail("a warp shuffle width that is not a power of two <= 32");
  Thread *t = S.cur;
  int id = (int)(t - S.th);
  Warp *W = &S.warp[id / WARP];
  int p = t->parity;
  t->parity ^= 1;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof v);
  W->buf[p][id % WARP] = bits;
  t->state = T_WARP;
  yield(t);
  if (src < 0) return v;
  T r;
  memcpy(&r, &W->buf[p][src], sizeof r);
  return r;
}

}  // namespace ts_emu_impl

template <class T> static inline T ts_emu_shfl_sync(unsigned mask, T v, int srcLane, int width = 32) {
  int lane = (int)(threadIdx.x % 32);
  int src = (lane & ~(width - 1)) + (srcLane & (width - 1));
  return ts_emu_impl::exchange(mask, v, src, width);
}
template <class T> static inline T ts_emu_shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
  int lane = (int)(threadIdx.x % 32);
  int src = lane ^ laneMask;
  if (src < 0 || src >= (lane & ~(width - 1)) + width) src = -1;   /* a later group: own value */
  return ts_emu_impl::exchange(mask, v, src, width);
}
template <class T> static inline T ts_emu_shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  int lane = (int)(threadIdx.x % 32);
  int src = (lane & (width - 1)) + (long long)delta < width ? lane + (int)delta : -1;
  return ts_emu_impl::exchange(mask, v, src, width);
}

static inline int ts_emu_syncthreads(int line, int pred) {
  ts_emu_impl::Thread *t = ts_emu_impl::S.cur;
  t->site = line;
  t->pred = pred != 0;
  t->state = ts_emu_impl::T_SYNC;
  ts_emu_impl::yield(t);
  return ts_emu_impl::S.sync_or;   /* read before any thread can reach the next barrier */
}
/* barriers and shuffles record where they are called (the module's line):
 * the threads released together must all wait at the same one */
#define __syncthreads() ((void)ts_emu_syncthreads(__LINE__, 0))
#define __syncthreads_or(p) ts_emu_syncthreads(__LINE__, (p))
static inline int ts_emu_site(int line) { ts_emu_impl::S.cur->site = line; return 0; }
#define __shfl_sync(...) (ts_emu_site(__LINE__), ts_emu_shfl_sync(__VA_ARGS__))
#define __shfl_xor_sync(...) (ts_emu_site(__LINE__), ts_emu_shfl_xor_sync(__VA_ARGS__))
#define __shfl_down_sync(...) (ts_emu_site(__LINE__), ts_emu_shfl_down_sync(__VA_ARGS__))

/* __syncwarp: every lane of the warp waits for the others (full mask only);
 * __syncwarp(m) reads as ts_emu_syncwarp(line)(m), so that the mask may be
 * left out */
struct ts_emu_syncwarp {
  int line;
  explicit ts_emu_syncwarp(int l) : line(l) {}
  void operator()(unsigned mask = 0xffffffffu) const {
    if (mask != 0xffffffffu) ts_emu_impl::fail("__syncwarp with a partial mask (only 0xffffffff is emulated)");
    ts_emu_impl::Thread *t = ts_emu_impl::S.cur;
    t->site = line;
    t->state = ts_emu_impl::T_WARP;
    ts_emu_impl::yield(t);
  }
};
#define __syncwarp(...) ts_emu_syncwarp(__LINE__)(__VA_ARGS__)
#define __align__(n) __attribute__((aligned(n)))

/* blocks run one after another: every write of an earlier block is seen */
static inline void __threadfence(void) {}

/* ---- atomics: threads switch only at barriers, so a plain read-modify-write is atomic ---- */
static inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
static inline double atomicAdd(double *p, double v) { double o = *p; *p = o + v; return o; }
static inline int atomicAdd(int *p, int v) { int o = *p; *p = (int)((unsigned)o + (unsigned)v); return o; }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  unsigned long long o = *p;
  *p = o + v;
  return o;
}
static inline int atomicMax(int *p, int v) { int o = *p; if (v > o) *p = v; return o; }

template <class T> static inline T __ldg(const T *p) { return *p; }

/* ---- bit casts (the prelude spells NaN and infinity with them) ---- */
static inline double __longlong_as_double(long long x) {
  double d;
  memcpy(&d, &x, sizeof d);
  return d;
}
static inline float __uint_as_float(unsigned x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}
static inline unsigned __float_as_uint(float x) {
  unsigned r;
  memcpy(&r, &x, sizeof r);
  return r;
}
static inline long long __double_as_longlong(double x) {
  long long r;
  memcpy(&r, &x, sizeof r);
  return r;
}

/* ---- 16-bit types and the WMMA subset (nvcuda::wmma) ----
 * __nv_bfloat16 and __half hold their bits (as cuda_bf16.h / cuda_fp16.h
 * do); the conversions are runtime/cpu/half.h's (to nearest even).
 * The WMMA subset the tensor-core kernels use: fragment<matrix_a |
 * matrix_b | accumulator, 16, 16, 16, T, row_major | col_major> for T
 * __nv_bfloat16 or __half (accumulators float), fill_fragment,
 * load_matrix_sync, mma_sync, store_matrix_sync.  Each call is a warp
 * collective, as on a GPU: every lane of the warp must reach the same call
 * (the same module line, checked as for shuffles) with the same pointer and
 * leading dimension, else the launch fails.  Fragment layout is unspecified
 * in CUDA; here every lane holds the whole 16 x 16 tile (so a kernel
 * cannot read elements through x[]: not emulated, as num_elements).  A load
 * or store needs a 32-byte aligned pointer and ldm a multiple of 8 elements
 * (16-bit) or 4 (float), CUDA's rule; mma_sync sums the exact products of
 * the 16-bit values in float, k ascending, into the accumulator. */
struct __nv_bfloat16 {
  unsigned short x;
};
struct __half {
  unsigned short x;
};
typedef __half half;
static inline float __bfloat162float(__nv_bfloat16 h) { return ts_bf16_to_f32(h.x); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{ts_f32_to_bf16(f)}; }
static inline float __half2float(__half h) { return ts_f16_to_f32(h.x); }
static inline __half __float2half(float f) { return __half{ts_f32_to_f16(f)}; }
static inline float ts_emu_to_float(__nv_bfloat16 h) { return __bfloat162float(h); }
static inline float ts_emu_to_float(__half h) { return __half2float(h); }

namespace ts_emu_impl {
/* A warp collective at module line `line` over the value key (a pointer and
 * leading dimension): every lane waits for its warp; then all must have
 * given the same key. */
static inline void wmma_collective(int line, unsigned long long key, const char *what) {
  Thread *t = S.cur;
  int id = (int)(t - S.th);
  Warp *W = &S.warp[id / WARP];
  t->site = line;
  int p = t->parity;
  t->parity ^= 1;
  W->buf[p][id % WARP] = key;
  t->state = T_WARP;
  yield(t);
  for (int l = 0; l < WARP; l++)
    if (W->buf[p][l] != key) fail(what);
}
static inline void wmma_check_ptr(const void *p, unsigned ldm, unsigned mult) {
  if ((uintptr_t)p % 32) fail("a WMMA load or store of a pointer not 32-byte aligned (CUDA requires 256 bits)");
  if (ldm % mult) fail("a WMMA load or store whose leading dimension is not a multiple of 16 bytes");
}
}  // namespace ts_emu_impl

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator's WMMA has the 16x16x16 shape only");
  float e[16][16];   /* element (row, col) of the whole tile in every lane: the layout is unspecified */
};

template <class Use, class T, class L, class V> static inline void ts_wmma_fill(fragment<Use, 16, 16, 16, T, L> &f, V v) {
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.e[r][c] = (float)v;
}
/* fill_fragment: each lane's own registers (no collective) */
template <class T, class L> static inline void ts_wmma_fill_at(int, fragment<accumulator, 16, 16, 16, T, L> &f, float v) {
  ts_wmma_fill(f, v);
}

/* matrix_a / matrix_b from 16-bit memory: element (r, c) at p[r * ldm + c]
 * (row_major) or p[c * ldm + r] (col_major) */
template <class Use, class T, class L>
static inline void ts_wmma_load(int line, fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
  static_assert(std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value, "matrix_a or matrix_b");
  static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value, "bf16 or half inputs");
  static_assert(std::is_same<L, row_major>::value || std::is_same<L, col_major>::value, "a layout");
  ts_emu_impl::wmma_collective(line, (unsigned long long)(uintptr_t)p ^ (unsigned long long)ldm << 48,
                               "load_matrix_sync reached by the lanes of a warp with different pointers or ldm");
  ts_emu_impl::wmma_check_ptr(p, ldm, 8);
  const bool rm = std::is_same<L, row_major>::value;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.e[r][c] = ts_emu_to_float(rm ? p[r * ldm + c] : p[c * ldm + r]);
}
template <class T>
static inline void ts_wmma_load_acc(int line, fragment<accumulator, 16, 16, 16, T, void> &f, const float *p,
                                    unsigned ldm, layout_t lay) {
  ts_emu_impl::wmma_collective(line, (unsigned long long)(uintptr_t)p ^ (unsigned long long)ldm << 48 ^ (unsigned long long)lay << 62,
                               "load_matrix_sync reached by the lanes of a warp with different pointers or ldm");
  ts_emu_impl::wmma_check_ptr(p, ldm, 4);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) f.e[r][c] = lay == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
template <class T>
static inline void ts_wmma_store(int line, float *p, const fragment<accumulator, 16, 16, 16, T, void> &f, unsigned ldm,
                                 layout_t lay) {
  ts_emu_impl::wmma_collective(line, (unsigned long long)(uintptr_t)p ^ (unsigned long long)ldm << 48 ^ (unsigned long long)lay << 62,
                               "store_matrix_sync reached by the lanes of a warp with different pointers or ldm");
  ts_emu_impl::wmma_check_ptr(p, ldm, 4);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) (lay == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.e[r][c];
}
/* d = a b + c: the exact products summed in float, k ascending */
template <class T, class LA, class LB>
static inline void ts_wmma_mma(int line, fragment<accumulator, 16, 16, 16, float, void> &d,
                               const fragment<matrix_a, 16, 16, 16, T, LA> &a, const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                               const fragment<accumulator, 16, 16, 16, float, void> &c) {
  ts_emu_impl::wmma_collective(line, 0, "mma_sync");   /* the key is the same in every lane: the site is checked */
  float r[16][16];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.e[i][j];
      for (int k = 0; k < 16; k++) s += a.e[i][k] * b.e[k][j];
      r[i][j] = s;
    }
  memcpy(d.e, r, sizeof r);
}
}  // namespace wmma
}  // namespace nvcuda
/* the calls record their module line (one collective per call site, as shuffles) */
#define fill_fragment(f, v) ts_wmma_fill_at(__LINE__, f, v)
#define load_matrix_sync(f, ...) ts_wmma_load_sel(__LINE__, f, __VA_ARGS__)
#define store_matrix_sync(...) ts_wmma_store(__LINE__, __VA_ARGS__)
#define mma_sync(...) ts_wmma_mma(__LINE__, __VA_ARGS__)
namespace nvcuda {
namespace wmma {
template <class Use, class T, class L>
static inline void ts_wmma_load_sel(int line, fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
  ts_wmma_load(line, f, p, ldm);
}
template <class T>
static inline void ts_wmma_load_sel(int line, fragment<accumulator, 16, 16, 16, T, void> &f, const float *p, unsigned ldm,
                                    layout_t lay) {
  ts_wmma_load_acc(line, f, p, ldm, lay);
}
}  // namespace wmma
}  // namespace nvcuda

/* ---- the launcher ---- */
extern "C" __attribute__((visibility("default"))) int ts_emu_launch(void (*fn)(TsArgs), const TsArgs *a,
                                                                    long long blocks, int threads, char *err,
                                                                    unsigned long errlen) {
  using namespace ts_emu_impl;
  char scratch[8];
  if (!err || errlen == 0) {
    err = scratch;
    errlen = sizeof scratch;
  }
  if (!fn || !a) {
    snprintf(err, errlen, "emulator: no kernel or no arguments");
    return -1;
  }
  if (threads < WARP || threads > MAX_THREADS || threads % WARP != 0) {
    snprintf(err, errlen, "emulator: %d threads per block (must be a multiple of 32 in 32 .. 1024)", threads);
    return -1;
  }
  if (blocks < 1 || blocks > 2147483647LL) {
    snprintf(err, errlen, "emulator: %lld blocks (must be 1 .. 2^31-1)", blocks);
    return -1;
  }
  pthread_mutex_lock(&mu);
  int rc = add_workers(threads, err, errlen);
  if (rc == 0) {
    S.fn = fn;
    S.args = a;
    blockDim = dim3((unsigned)threads, 1, 1);
    gridDim = dim3((unsigned)blocks, 1, 1);
    threadIdx.y = threadIdx.z = blockIdx.y = blockIdx.z = 0;
    read_order();
    /* random block order: a multiplier coprime to the block count */
    unsigned long long mul = 1;
    if (S.order == 2 && blocks > 1) {
      mul = next_rand() % (unsigned long long)blocks;
      unsigned long long x, y, r;
      for (;; mul = (mul + 1) % (unsigned long long)blocks) {
        if (!mul) continue;
        for (x = mul, y = (unsigned long long)blocks; y; r = x % y, x = y, y = r) {}
        if (x == 1) break;
      }
    }
    for (long long b = 0; b < blocks && rc == 0; b++) rc = run_block(block_at(b, blocks, mul), threads, err, errlen);
    if (rc != 0) reset_workers(threads);
    S.cur = NULL;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

#endif
