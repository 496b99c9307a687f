// test_emu_kernels.cu - hand-written CUDA kernels for tests/cuda/test_emu.c:
// every built-in of the emulation header (docs/cuda.md, "The kernel ABI")
// exercised once, in the Tessera kernel ABI (one TsArgs by value, run block
// words in a.run).  Valid CUDA: the test also compiles this file with nvcc
// for sm_80 when nvcc is present.  Buffers and run words per kernel are
// described at each kernel; the test checks the results against plain C.
#ifndef TS_ARGS_DEFINED
#define TS_ARGS_DEFINED 1
typedef struct {
  void *b[32];
  const long long *run;
} TsArgs;
#endif

// b0: int4[blocks*threads] (threadIdx.x, blockIdx.x, blockDim.x, gridDim.x);
// b1: int[blocks*threads] the sum of the y/z parts (0 for a 1-D launch:
// threadIdx.y/z, blockIdx.y/z, blockDim.y/z - 1, gridDim.y/z - 1).
extern "C" __global__ void k_builtins(TsArgs a) {
  int4 *out = (int4 *)a.b[0];
  int *yz = (int *)a.b[1];
  long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  out[gid] = make_int4((int)threadIdx.x, (int)blockIdx.x, (int)blockDim.x, (int)gridDim.x);
  yz[gid] = (int)(threadIdx.y + threadIdx.z + blockIdx.y + blockIdx.z + (blockDim.y - 1) + (blockDim.z - 1) +
                  (gridDim.y - 1) + (gridDim.z - 1));
}

// Grid-stride loop: y[i] = alpha * x[i] + y[i] for i < run[0]; alpha is
// the double stored in run[1].  b0 x, b1 y (double).
extern "C" __global__ void __launch_bounds__(256) k_axpy(TsArgs a) {
  const double *__restrict__ x = (const double *)a.b[0];
  double *__restrict__ y = (double *)a.b[1];
  long long n = a.run[0];
  double alpha = *(const double *)&a.run[1];
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = alpha * __ldg(&x[i]) + y[i];
}

// Block reduction with shared memory: block r sums row r of x (run[0]
// columns, double) into out[r], a tree over shared memory with
// __syncthreads between levels; also the row maximum by a second tree in
// float.  b0 x, b1 out sum (double), b2 out max (float).
extern "C" __global__ void k_block_sum(TsArgs a) {
  const double *x = (const double *)a.b[0];
  double *sum = (double *)a.b[1];
  float *mx = (float *)a.b[2];
  long long cols = a.run[0];
  __shared__ double s[1024];
  __shared__ float m[1024];
  double acc = 0;
  float best = -INFINITY;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    double v = x[blockIdx.x * cols + c];
    acc += v;
    best = fmaxf(best, (float)v);
  }
  s[threadIdx.x] = acc;
  m[threadIdx.x] = best;
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (threadIdx.x < stride) {
      s[threadIdx.x] += s[threadIdx.x + stride];
      m[threadIdx.x] = fmaxf(m[threadIdx.x], m[threadIdx.x + stride]);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sum[blockIdx.x] = s[0];
    mx[blockIdx.x] = m[0];
  }
}

// Warp shuffles of every kind on type T, thread g = global index, lane l,
// v = value(g):
//   out[6g+0] xor-butterfly sum of the warp (every lane)
//   out[6g+1] shfl_down tree sum (lane 0 meaningful)
//   out[6g+2] __shfl_sync(v, (l*7+3) % 32)
//   out[6g+3] __shfl_down_sync(v, 3)          out[6g+4] __shfl_down_sync(v, 3, width 8)
//   out[6g+5] __shfl_xor_sync(v, 8, width 8) + __shfl_sync(v, 21, width 16)
template <class T> __device__ __forceinline__ void shuffles(T *out, T v, long long g) {
  unsigned full = 0xffffffffu;
  T s = v;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(full, s, o);
  out[6 * g + 0] = s;
  T d = v;
  for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(full, d, o);
  out[6 * g + 1] = d;
  int lane = (int)(threadIdx.x % 32);
  out[6 * g + 2] = __shfl_sync(full, v, (lane * 7 + 3) % 32);
  out[6 * g + 3] = __shfl_down_sync(full, v, 3);
  out[6 * g + 4] = __shfl_down_sync(full, v, 3, 8);
  out[6 * g + 5] = __shfl_xor_sync(full, v, 8, 8) + __shfl_sync(full, v, 21, 16);
}
#define SHFL_KERNEL(NAME, T)                                             \
  extern "C" __global__ void NAME(TsArgs a) {                            \
    const T *in = (const T *)a.b[0];                                     \
    long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;      \
    shuffles<T>((T *)a.b[1], in[g], g);                                  \
  }
SHFL_KERNEL(k_shfl_f32, float)
SHFL_KERNEL(k_shfl_f64, double)
SHFL_KERNEL(k_shfl_i32, int)
SHFL_KERNEL(k_shfl_u32, unsigned)
SHFL_KERNEL(k_shfl_i64, long long)
SHFL_KERNEL(k_shfl_u64, unsigned long long)

// Atomics from every thread of every block, grid-stride over run[0]
// values v = in[i] (int, >= 0): hist[v % run[1]] += 1 (int);
// fsum += (float)(v % 64); dsum += v * 0.5; ucount += v; imax = max(v);
// tickets: t = atomicAdd(counter, 1), order[t] = i (every t once).
// b0 in, b1 hist, b2 fsum, b3 dsum, b4 ucount (u64), b5 imax, b6 counter, b7 order.
extern "C" __global__ void k_atomics(TsArgs a) {
  const int *in = (const int *)a.b[0];
  int *hist = (int *)a.b[1];
  float *fsum = (float *)a.b[2];
  double *dsum = (double *)a.b[3];
  unsigned long long *ucount = (unsigned long long *)a.b[4];
  int *imax = (int *)a.b[5];
  int *counter = (int *)a.b[6];
  int *order = (int *)a.b[7];
  long long n = a.run[0], nb = a.run[1];
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    int v = in[i];
    atomicAdd(&hist[v % nb], 1);
    atomicAdd(fsum, (float)(v % 64));
    atomicAdd(dsum, v * 0.5);
    atomicAdd(ucount, (unsigned long long)v);
    atomicMax(imax, v);
    int t = atomicAdd(counter, 1);
    order[t] = (int)i;
  }
}

// Vector loads and stores, grid-stride over run[0] vectors:
// f4 = x4 * 2 + 1 (float4), d2 = (x.y, x.x + x.y) (double2),
// f2 = (x.x - x.y, x.x * x.y) (float2), i4 = (w, z, y, x) (int4).
// b0 float4 in, b1 float4 out, b2 double2 in, b3 double2 out, b4 float2 in,
// b5 float2 out, b6 int4 in, b7 int4 out.
extern "C" __global__ void k_vectors(TsArgs a) {
  long long n = a.run[0];
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float4 f = __ldg(&((const float4 *)a.b[0])[i]);
    ((float4 *)a.b[1])[i] = make_float4(f.x * 2 + 1, f.y * 2 + 1, f.z * 2 + 1, f.w * 2 + 1);
    double2 d = ((const double2 *)a.b[2])[i];
    ((double2 *)a.b[3])[i] = make_double2(d.y, d.x + d.y);
    float2 h = ((const float2 *)a.b[4])[i];
    ((float2 *)a.b[5])[i] = make_float2(h.x - h.y, h.x * h.y);
    int4 k = ((const int4 *)a.b[6])[i];
    ((int4 *)a.b[7])[i] = make_int4(k.w, k.z, k.y, k.x);
  }
}

// Math functions, one input x per thread (run[0] of them):
// b0 double in, b1 double out[13 per x]: exp log sqrt rsqrt tanh erf fabs
//   fmax(x, 0.5) fmin(x, 0.5) floor isnan isinf, and exp of (float)x as
//   the float overload (its result must be a float: stored as double);
// b2 float out[13 per x]: expf logf sqrtf rsqrtf tanhf erff fabsf
//   fmaxf(x, 0.5f) fminf(x, 0.5f) floorf __expf __logf __fdividef(x, 3).
extern "C" __global__ void k_math(TsArgs a) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.run[0]) return;
  double x = ((const double *)a.b[0])[i];
  double *o = (double *)a.b[1] + 13 * i;
  o[0] = exp(x);
  o[1] = log(x);
  o[2] = sqrt(x);
  o[3] = rsqrt(x);
  o[4] = tanh(x);
  o[5] = erf(x);
  o[6] = fabs(x);
  o[7] = fmax(x, 0.5);
  o[8] = fmin(x, 0.5);
  o[9] = floor(x);
  o[10] = isnan(x) ? 1 : 0;
  o[11] = isinf(x) ? 1 : 0;
  float xf = (float)x;
  auto ef = exp(xf);
  static_assert(sizeof(ef) == sizeof(float), "exp(float) is the float overload, as in CUDA");
  o[12] = ef;
  float *p = (float *)a.b[2] + 13 * i;
  p[0] = expf(xf);
  p[1] = logf(xf);
  p[2] = sqrtf(xf);
  p[3] = rsqrtf(xf);
  p[4] = tanhf(xf);
  p[5] = erff(xf);
  p[6] = fabsf(xf);
  p[7] = fmaxf(xf, 0.5f);
  p[8] = fminf(xf, 0.5f);
  p[9] = floorf(xf);
  p[10] = __expf(xf);
  p[11] = __logf(xf);
  p[12] = __fdividef(xf, 3.0f);
}

// Bit casts: b0 long long in -> b1 double out (__longlong_as_double),
// b1 -> b2 long long (__double_as_longlong), run[0] values.
extern "C" __global__ void k_bits(TsArgs a) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.run[0]) return;
  double d = __longlong_as_double(((const long long *)a.b[0])[i]);
  ((double *)a.b[1])[i] = d;
  ((long long *)a.b[2])[i] = __double_as_longlong(d);
}

// out[block, t] = __syncthreads_or(t == who[block]): who[0] = 37 gives 1
// everywhere in block 0, who[1] = -1 gives 0 in block 1.
extern "C" __global__ void k_sync_or(TsArgs a) {
  int *out = (int *)a.b[0];
  const int *who = (const int *)a.b[1];
  out[blockIdx.x * blockDim.x + threadIdx.x] = __syncthreads_or((int)threadIdx.x == who[blockIdx.x]);
}

// ---- kernels that must be refused at run time ----

// Threads from 40 on return before a __syncthreads the others wait at.
extern "C" __global__ void k_divergent_sync(TsArgs a) {
  int *out = (int *)a.b[0];
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// The upper half of each warp returns before a shuffle.
extern "C" __global__ void k_partial_warp(TsArgs a) {
  int *out = (int *)a.b[0];
  int v = (int)threadIdx.x;
  if (threadIdx.x % 32 >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 1);
}

// Half of warp 0 waits at a shuffle, everyone else at __syncthreads.
extern "C" __global__ void k_deadlock(TsArgs a) {
  int *out = (int *)a.b[0];
  int v = (int)threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else __syncthreads();
  out[threadIdx.x] = v;
}

// Every thread reaches a __syncthreads, but warp 0 and warp 1 different ones.
extern "C" __global__ void k_two_barriers(TsArgs a) {
  int *out = (int *)a.b[0];
  if (threadIdx.x < 32) {
    out[threadIdx.x] = 1;
    __syncthreads();
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

// Every lane reaches a shuffle, but lanes 0-15 and 16-31 different ones.
extern "C" __global__ void k_two_shuffles(TsArgs a) {
  int *out = (int *)a.b[0];
  int v = (int)threadIdx.x;
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else v = __shfl_xor_sync(0xffffffffu, v, 2);
  out[threadIdx.x] = v;
}

// Reads shared memory its block has not written (then writes it): every
// block must see garbage, not zeros nor the previous block's 7s.
extern "C" __global__ void k_shared_unwritten(TsArgs a) {
  __shared__ int s[64];
  int *out = (int *)a.b[0];
  out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];
  __syncthreads();
  s[threadIdx.x] = 7;
}

// A shuffle with a partial mask (not emulated: reported).
extern "C" __global__ void k_partial_mask(TsArgs a) {
  int *out = (int *)a.b[0];
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (int)threadIdx.x, 1);
}

// ---- WMMA (tensor cores): the emulator's nvcuda::wmma subset ----
#ifndef TS_CUDA_EMU_H
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif

// C[M, N] = A[M, K] B[K, N] (+ C when run[3]), 16-bit A row-major and B
// stored as B^T [N, K] (col_major: as attention's keys), f32
// accumulation; one warp per 16 x 16 tile of C, 4 warps per block, the
// A and B^T panels staged through shared memory (32-byte aligned rows of
// K + 8 elements).  run: M, N, K (multiples of 16, K <= 128), accumulate.
// b0 A, b1 B^T, b2 C (float).
template <class T> static __device__ void wmma_gemm(TsArgs a) {
  using namespace nvcuda;
  const int M = (int)a.run[0], N = (int)a.run[1], K = (int)a.run[2], acc = (int)a.run[3];
  const T *A = (const T *)a.b[0], *Bt = (const T *)a.b[1];
  float *C = (float *)a.b[2];
  __shared__ __align__(32) T sa[4][16 * 136], sb[4][16 * 136];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, tilesN = N / 16;
  const int tile = blockIdx.x * 4 + w;
  if (tile >= (M / 16) * tilesN) return;   // a whole warp returns together
  const int i0 = tile / tilesN * 16, j0 = tile % tilesN * 16, ld = K + 8;
  for (int x = lane; x < 16 * K; x += 32) {
    sa[w][x / K * ld + x % K] = A[(long long)(i0 + x / K) * K + x % K];
    sb[w][x / K * ld + x % K] = Bt[(long long)(j0 + x / K) * K + x % K];
  }
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  if (acc) wmma::load_matrix_sync(c, C + (long long)i0 * N + j0, N, wmma::mem_row_major);
  else wmma::fill_fragment(c, 0.0f);
  for (int k = 0; k < K; k += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::load_matrix_sync(fa, &sa[w][k], ld);
    wmma::load_matrix_sync(fb, &sb[w][k], ld);
    wmma::mma_sync(c, fa, fb, c);
  }
  wmma::store_matrix_sync(C + (long long)i0 * N + j0, c, N, wmma::mem_row_major);
}
extern "C" __global__ void k_wmma_bf16(TsArgs a) { wmma_gemm<__nv_bfloat16>(a); }
extern "C" __global__ void k_wmma_f16(TsArgs a) { wmma_gemm<__half>(a); }

// C[16, 16] = A B with the B tile row-major ([K, N], b1), one warp: the
// other layout.  b0 A [16, 16], b1 B [16, 16], b2 C.
extern "C" __global__ void k_wmma_rowb(TsArgs a) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 0.0f);
  wmma::load_matrix_sync(fa, (const __nv_bfloat16 *)a.b[0], 16);
  wmma::load_matrix_sync(fb, (const __nv_bfloat16 *)a.b[1], 16);
  wmma::mma_sync(c, fa, fb, c);
  wmma::store_matrix_sync((float *)a.b[2], c, 16, wmma::mem_col_major);
}

// Refused: lanes of a warp loading from different pointers (lane-dependent
// offset), and a pointer not 32-byte aligned.  b0 A, b2 C.
extern "C" __global__ void k_wmma_divergent(TsArgs a) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, (const __nv_bfloat16 *)a.b[0] + 16 * (threadIdx.x % 2), 16);
}
extern "C" __global__ void k_wmma_misaligned(TsArgs a) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, (const __nv_bfloat16 *)a.b[0] + 8, 16);
}
