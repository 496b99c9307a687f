/* nvrtc.c - NVRTC, loaded on first use by ir/dl.h (cuda.h): a CUDA module
 * compiled to PTX and to a cubin for sm_80 or sm_90, with ptxas' verbose
 * report parsed per kernel.  Works without a GPU or a driver (FACTS.md):
 * this is how every kernel is checked on our machines.
 *
 * Options: -std=c++17; --fmad=false, so a*b+c is not contracted into one
 * rounding: the CPU backends round after each operation and the tests
 * compare bits (a real run may prefer fmad=true; the generated kernels
 * are memory-bound, so it costs little); -lineinfo for profilers; and
 * -Xptxas -v for the resource report.  One compile for the real arch
 * gives both the cubin and the PTX (the PTX a compile for the virtual arch
 * compute_80 gives, byte for byte; it was two compiles, a third of the
 * time). */
#include "cuda.h"
#include "ir/dl.h"
#include <stdlib.h>

typedef int NvResult;   /* nvrtcResult: 0 = NVRTC_SUCCESS */
typedef struct NvProg *NvProgram;
typedef struct {
  NvResult (*create)(NvProgram *, const char *, const char *, int, const char *const *, const char *const *);
  NvResult (*compile)(NvProgram, int, const char *const *);
  NvResult (*log_size)(NvProgram, size_t *);
  NvResult (*log)(NvProgram, char *);
  NvResult (*ptx_size)(NvProgram, size_t *);
  NvResult (*ptx)(NvProgram, char *);
  NvResult (*cubin_size)(NvProgram, size_t *);
  NvResult (*cubin)(NvProgram, char *);
  NvResult (*destroy)(NvProgram *);
  const char *(*errstr)(NvResult);
  NvResult (*narchs)(int *);
  NvResult (*archs)(int *);
} NvLib;
static NvLib nv;
static struct { int tried; void *h; char why[1024]; } nv_lib;

static const TsDlSym nv_syms[] = {
  TS_DL_SYM(NvLib, create, "nvrtcCreateProgram"),     TS_DL_SYM(NvLib, compile, "nvrtcCompileProgram"),
  TS_DL_SYM(NvLib, log_size, "nvrtcGetProgramLogSize"), TS_DL_SYM(NvLib, log, "nvrtcGetProgramLog"),
  TS_DL_SYM(NvLib, ptx_size, "nvrtcGetPTXSize"),      TS_DL_SYM(NvLib, ptx, "nvrtcGetPTX"),
  TS_DL_SYM(NvLib, cubin_size, "nvrtcGetCUBINSize"),  TS_DL_SYM(NvLib, cubin, "nvrtcGetCUBIN"),
  TS_DL_SYM(NvLib, destroy, "nvrtcDestroyProgram"),   TS_DL_SYM(NvLib, errstr, "nvrtcGetErrorString"),
  TS_DL_SYM(NvLib, narchs, "nvrtcGetNumSupportedArchs"), TS_DL_SYM(NvLib, archs, "nvrtcGetSupportedArchs"),
};

static int load(void) {
  if (nv_lib.tried) return nv_lib.h ? 0 : -1;
  nv_lib.tried = 1;
  static const char *const files[] = {"libnvrtc.so.13", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13",
                                      "/usr/local/cuda/lib64/libnvrtc.so", NULL};
  char detail[900];
  TsDlStatus st;
  nv_lib.h = ts_dl_load(files, nv_syms, (int)(sizeof nv_syms / sizeof nv_syms[0]), &nv, NULL, &st, detail,
                        sizeof detail);
  if (nv_lib.h) return 0;
  if (st == TS_DL_NO_SYMBOL) snprintf(nv_lib.why, sizeof nv_lib.why, "NVRTC has no %s (too old?)", detail);
  else snprintf(nv_lib.why, sizeof nv_lib.why, "NVRTC was not found (libnvrtc.so.13: %s)", detail);
  return -1;
}

int cg_nvrtc_available(char *why, size_t whylen) {
  if (load() == 0) return 1;
  snprintf(why, whylen, "%s", nv_lib.why);
  return 0;
}

/* Every NVRTC call: its name and NVRTC's error string in the message, with
 * a hint. */
#define NVCHECK(call, what, hint)                                                                 \
  do {                                                                                            \
    NvResult r_ = (call);                                                                         \
    if (r_ != 0) {                                                                                \
      ts_errf(err, errlen, "%s: %s (%s)", what, nv.errstr ? nv.errstr(r_) : "error", hint);        \
      goto fail;                                                                                  \
    }                                                                                             \
  } while (0)

/* One NVRTC run for a real arch: its PTX (the same text a compile for the
 * virtual arch gives: checked with CUDA 13's NVRTC) and its cubin, with
 * ptxas' verbose report in the log. */
static int compile_one(const char *src, const char *arch, CgNvrtcOut *o, char *err, size_t errlen) {
  NvProgram prog = NULL;
  char archopt[64];
  snprintf(archopt, sizeof archopt, "-arch=%s", arch);
  /* 177: a value computed and not used (the printer emits every instruction) */
  const char *opts[] = {archopt, "-std=c++17", "--fmad=false", "-lineinfo", "--diag-suppress=177", "-Xptxas", "-v"};
  NVCHECK(nv.create(&prog, src, "tessera.cu", 0, NULL, NULL), "nvrtcCreateProgram", "out of memory?");
  NvResult rc = nv.compile(prog, (int)(sizeof opts / sizeof *opts), opts);
  size_t ls = 0;
  NVCHECK(nv.log_size(prog, &ls), "nvrtcGetProgramLogSize", "internal NVRTC error");
  o->log = ts_xcalloc(ls + 1, 1);
  if (ls) NVCHECK(nv.log(prog, o->log), "nvrtcGetProgramLog", "internal NVRTC error");
  if (rc != 0) {
    ts_errf(err, errlen, "NVRTC rejected the module for %s: %s", arch, nv.errstr(rc));
    goto fail;
  }
  NVCHECK(nv.ptx_size(prog, &o->ptx_len), "nvrtcGetPTXSize", "internal NVRTC error");
  o->ptx = ts_xcalloc(o->ptx_len + 1, 1);
  NVCHECK(nv.ptx(prog, o->ptx), "nvrtcGetPTX", "internal NVRTC error");
  NVCHECK(nv.cubin_size(prog, &o->cubin_len), "nvrtcGetCUBINSize", "compiled for a virtual arch?");
  o->cubin = ts_xmalloc(o->cubin_len ? o->cubin_len : 1);
  NVCHECK(nv.cubin(prog, o->cubin), "nvrtcGetCUBIN", "internal NVRTC error");
  nv.destroy(&prog);
  return 0;
fail:
  if (prog) nv.destroy(&prog);
  return -1;
}

/* ptxas' report: "Function properties for NAME" then "ptxas . N bytes
 * stack frame, N bytes spill stores, N bytes spill loads", and "Compiling
 * entry function 'NAME'" then "Used N registers, [used N barriers, ][N
 * bytes cumulative stack size, ][N bytes smem, ]N bytes cmem[0]".  Kernels
 * in order of their first mention. */
static CgPtxasInfo *kernel_of(CgNvrtcOut *o, const char *name, size_t len) {
  for (int i = 0; i < o->nkern; i++)
    if (strlen(o->kern[i].name) == len && strncmp(o->kern[i].name, name, len) == 0) return &o->kern[i];
  o->kern = realloc(o->kern, (size_t)(o->nkern + 1) * sizeof *o->kern);
  TS_ASSERT(o->kern);
  CgPtxasInfo *k = &o->kern[o->nkern++];
  memset(k, 0, sizeof *k);
  snprintf(k->name, sizeof k->name, "%.*s", (int)(len < sizeof k->name ? len : sizeof k->name - 1), name);
  return k;
}

static void parse_report(CgNvrtcOut *o) {
  CgPtxasInfo *cur = NULL;
  for (const char *s = o->log; s && *s;) {
    const char *e = strchr(s, '\n');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), s);
    const char *p;
    if ((p = strstr(line, "Compiling entry function '"))) {
      p += 26;
      cur = kernel_of(o, p, strcspn(p, "'"));
    } else if ((p = strstr(line, "Function properties for "))) {
      p += 24;
      cur = kernel_of(o, p, strcspn(p, " \r"));
    } else if (cur && (p = strstr(line, " bytes stack frame"))) {
      /* "ptxas         .     256 bytes stack frame, ...": the number before */
      while (p > line && p[-1] >= '0' && p[-1] <= '9') p--;
      long long a = 0, b = 0, c = 0;
      if (sscanf(p, "%lld bytes stack frame, %lld bytes spill stores, %lld bytes spill loads", &a, &b, &c) == 3) {
        cur->stack = a;
        cur->spill_stores = b;
        cur->spill_loads = c;
      }
    } else if (cur && (p = strstr(line, "Used "))) {
      int regs = 0;
      if (sscanf(p, "Used %d registers", &regs) == 1) cur->registers = regs;
      const char *q = strstr(p, " bytes smem");
      if (q) {
        while (q > p && q[-1] >= '0' && q[-1] <= '9') q--;
        cur->smem = atoll(q);
      }
      if ((q = strstr(p, " bytes cumulative stack size"))) {
        while (q > p && q[-1] >= '0' && q[-1] <= '9') q--;
        cur->cstack = atoll(q);
      }
      if ((q = strstr(p, " bytes cmem[0]"))) {
        while (q > p && q[-1] >= '0' && q[-1] <= '9') q--;
        cur->cmem = atoll(q);
      }
    }
    s = e ? e + 1 : NULL;
  }
}

/* "sm_N" -> N (two or three digits), else 0 */
int cg_cuda_arch_number(const char *arch) {
  if (strncmp(arch, "sm_", 3) != 0) return 0;
  size_t n = strspn(arch + 3, "0123456789");
  if ((n != 2 && n != 3) || arch[3 + n] || arch[3] == '0') return 0;
  return atoi(arch + 3);
}

int cg_nvrtc_archs(int *archs, int max, char *why, size_t whylen) {
  if (load() != 0) return ts_errf(why, whylen, "%s", nv_lib.why);
  int n = 0;
  if (nv.narchs(&n) != 0 || n <= 0) return ts_errf(why, whylen, "nvrtcGetNumSupportedArchs failed");
  int *all = ts_xcalloc((size_t)n, sizeof *all);
  if (nv.archs(all) != 0) {
    free(all);
    return ts_errf(why, whylen, "nvrtcGetSupportedArchs failed");
  }
  int k = n < max ? n : max;
  memcpy(archs, all, (size_t)k * sizeof *archs);
  free(all);
  return k;
}

int cg_nvrtc_compile(const char *src, const char *arch, CgNvrtcOut *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  int sm = cg_cuda_arch_number(arch);
  if (!sm) return ts_errf(err, errlen, "CUDA target '%s' is not of the form sm_XX (sm_80, sm_90, sm_120, ...)", arch);
  if (load() != 0) return ts_errf(err, errlen, "%s", nv_lib.why);
  /* the archs this NVRTC compiles for (sm_75 .. sm_121 for CUDA 13.0) */
  int archs[64], na = cg_nvrtc_archs(archs, 64, err, errlen), ok = 0;
  if (na < 0) return -1;
  for (int i = 0; i < na; i++) ok |= archs[i] == sm;
  if (!ok) {
    char list[400] = "";
    size_t w = 0;
    for (int i = 0; i < na && w < sizeof list; i++)
      w += (size_t)snprintf(list + w, sizeof list - w, "%ssm_%d", i ? ", " : "", archs[i]);
    return ts_errf(err, errlen, "this NVRTC cannot compile for %s (it supports %s)", arch, list);
  }
  if (compile_one(src, arch, out, err, errlen) != 0) return -1;
  parse_report(out);
  return 0;
}

void cg_nvrtc_out_free(CgNvrtcOut *o) {
  free(o->ptx);
  free(o->cubin);
  free(o->log);
  free(o->kern);
  memset(o, 0, sizeof *o);
}

int cg_ptxas_check(const CgPtxasInfo *k, const char *arch, char *err, size_t errlen) {
  if (k->spill_stores > CG_PTXAS_MATH_SLACK || k->spill_loads > CG_PTXAS_MATH_SLACK)
    return ts_errf(err, errlen, "kernel %s spills registers on %s (%lld bytes stored, %lld loaded; at most %d)", k->name,
                   arch, (long long)k->spill_stores, (long long)k->spill_loads, CG_PTXAS_MATH_SLACK);
  if (k->stack > CG_PTXAS_MATH_SLACK)
    return ts_errf(err, errlen, "kernel %s needs a %lld-byte stack frame on %s (local memory; at most %d)", k->name,
                   (long long)k->stack, arch, CG_PTXAS_MATH_SLACK);
  if (k->cstack > CG_PTXAS_MATH_SLACK)   /* the frames of what it calls: a non-inlined device function's locals */
    return ts_errf(err, errlen, "kernel %s needs %lld bytes of stack with the functions it calls on %s (local memory; "
                   "at most %d)", k->name, (long long)k->cstack, arch, CG_PTXAS_MATH_SLACK);
  if (k->registers > 255)
    return ts_errf(err, errlen, "kernel %s uses %d registers on %s (at most 255)", k->name, k->registers, arch);
  if (k->smem > 48 * 1024)
    return ts_errf(err, errlen, "kernel %s uses %lld bytes of static shared memory on %s (at most 48 KiB)", k->name,
                   (long long)k->smem, arch);
  return 0;
}
