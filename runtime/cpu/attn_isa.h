/* attn_isa.h - the f32 and f64 instances of the tile loops (attn_t.h) for
 * one instruction set: ops_attn.c includes it once per ISA it builds
 * (ISA = base, and v3 under `#pragma GCC target("arch=x86-64-v3")`). */
#ifndef ISA
#error "include attn_isa.h from ops_attn.c with ISA defined"
#endif
#define T float
#define SUF f32
#define GEMM cblas_sgemm
#define EXPROW attn_exp_row_f32
#include "attn_t.h"
#undef T
#undef SUF
#undef GEMM
#undef EXPROW
#define T double
#define SUF f64
#define GEMM cblas_dgemm
#define EXPROW attn_exp_row_f64
#include "attn_t.h"
#undef T
#undef SUF
#undef GEMM
#undef EXPROW
