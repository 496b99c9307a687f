/* kreport.c - `mcc --report kernels` (kreport.h).
 *
 * The rows come from the runtime's own planning of the program for a
 * device (rt_cuda_kernel_uses: the kernels a GPU rank launches, fusion
 * groups and library kernels alike), so the table is what mrun would
 * launch, not a second model of it.  Sites that run the same kernel (the
 * same group in every layer) are one row.  Bytes count each operand and
 * result once per launch (what a kernel that streams them moves at best);
 * FLOPs are attention's own (causal skipping included) and one per element
 * per fused node elsewhere, so the intensity of everything but attention
 * is a fraction of a FLOP per byte: memory-bound, as it should be.
 * GEMMs are cuBLASLt's and not listed (--report time costs them). */
#include "kreport.h"
#include "codegen/cuda.h"
#include "runtime/exec/dev_prog.h"
#include <math.h>

/* The SM limits of an arch (CUDA programming guide, "compute capabilities"). */
typedef struct { int threads, blocks, regs; int64_t smem; } SmLimits;
static SmLimits sm_limits(int sm) {
  if (sm >= 90) return (SmLimits){2048, 32, 65536, 228 * 1024};
  if (sm == 86 || sm == 87 || sm == 89) return (SmLimits){1536, sm == 89 ? 24 : 16, 65536, 100 * 1024};
  if (sm >= 80) return (SmLimits){2048, 32, 65536, 164 * 1024};
  return (SmLimits){2048, 16, 65536, 96 * 1024};
}

int kreport_occupancy(int sm, int threads, int regs, int64_t smem, double *occ) {
  SmLimits L = sm_limits(sm);
  int warps = (threads + 31) / 32;
  int by_threads = L.threads / (warps * 32);
  int per_warp = ((regs > 0 ? regs : 1) * 32 + 255) / 256 * 256;
  int by_regs = L.regs / per_warp / warps;
  int by_smem = smem > 0 ? (int)(L.smem / (smem + 1024)) : L.blocks;
  int b = L.blocks;
  if (by_threads < b) b = by_threads;
  if (by_regs < b) b = by_regs;
  if (by_smem < b) b = by_smem;
  if (b < 0) b = 0;
  *occ = (double)(b * warps) / (double)(L.threads / 32);
  return b;
}

/* The roofline's two rates: FLOP/s for the plan's dtype (FP32 CUDA cores where the
 * description has no peak for it) and streamed bytes/s. */
static void roof_rates(const HwDesc *hw, IrDtype dt, double *peak, double *bw) {
  HwFormat f = hw_format_of(dt, 0);
  *peak = hw->peak[f] > 0 ? hw->peak[f] : hw->peak[HW_FP32];
  *bw = hw->hbm_bw * (hw->mem_eff > 0 ? hw->mem_eff : 1);
}

typedef struct {
  RtCudaKernelUse u;   /* the first site; launches, bytes and flops summed over all */
  int sites;
  double t;            /* the roofline's seconds, all launches */
} Row;

static int by_time(const void *x, const void *y) {
  const Row *a = x, *b = y;
  double ka = a->t > 0 ? a->t : a->u.bytes, kb = b->t > 0 ? b->t : b->u.bytes;
  return ka < kb ? 1 : ka > kb ? -1 : strcmp(a->u.name, b->u.name);
}

static void fmt_si(char *buf, size_t n, double v) {
  const char *suf[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (fabs(v) >= 1000 && i < 4) v /= 1000, i++;
  snprintf(buf, n, i ? "%.1f%s" : "%.0f%s", v, suf[i]);
}

int kreport_program(const IrModule *m, int prog, int sm, const HwDesc *hw, StrBuf *out, char *err, size_t errlen) {
  RtCudaModule mod;
  RtCudaKernelUse *u;
  int n;
  if (rt_cuda_kernel_uses(m, &mod, &u, &n, err, errlen) != 0) return -1;
  CgNvrtcOut o;
  memset(&o, 0, sizeof o);
  char arch[16] = "";
  if (sm > 0) {
    snprintf(arch, sizeof arch, "sm_%d", sm);
    if (cg_nvrtc_compile(mod.src.p, arch, &o, err, errlen) != 0) {
      cg_nvrtc_out_free(&o);
      rt_cuda_module_free(&mod);
      free(u);
      return -1;
    }
  }
  VEC(Row) rows = {0};
  for (int i = 0; i < n; i++) {
    int r = 0;
    while (r < rows.n && strcmp(rows.a[r].u.name, u[i].name) != 0) r++;
    if (r == rows.n) {
      Row z = {u[i], 0, 0};
      z.u.launches = 0, z.u.bytes = 0, z.u.flops = 0;
      VEC_PUSH(rows, z);
    }
    Row *w = &rows.a[r];
    w->sites++;
    w->u.launches += u[i].launches;
    w->u.bytes += u[i].bytes;
    w->u.flops += u[i].flops;
    if (hw) {   /* memory or compute, whichever is longer */
      double peak, bw;
      roof_rates(hw, m->train.precision, &peak, &bw);
      double tm = u[i].bytes / bw, tf = peak > 0 ? u[i].flops / peak : 0;
      w->t += (tm > tf ? tm : tf) + u[i].launches * hw->kernel_overhead;
    }
  }
  qsort(rows.a, (size_t)rows.n, sizeof *rows.a, by_time);
  sb_printf(out, "# program %d: %d launch sites, %d distinct kernels%s%s%s%s\n", prog, n, rows.n,
            sm ? "; ptxas for " : "", arch, hw ? "; roofline on " : "", hw ? hw->name : "");
  sb_printf(out, "%-40s %5s %6s %10s %5s %7s %6s %5s %10s %10s %7s %10s %-7s %s\n", "kernel", "sites", "launch",
            "grid", "regs", "smem", "spill", "occ", "bytes", "flops", "flop/B", "time_us", "bound", "first site");
  double tb = 0, tfl = 0, tt = 0;
  for (int r = 0; r < rows.n; r++) {
    const Row *w = &rows.a[r];
    const CgPtxasInfo *q = NULL;
    for (int j = 0; j < o.nkern; j++)
      if (strcmp(o.kern[j].name, w->u.name) == 0) q = &o.kern[j];
    char grid[32], regs[16] = "-", smem[16] = "-", spill[16] = "-", occ[16] = "-", by[16], fl[16], t[24] = "-";
    char bound[8] = "-";
    snprintf(grid, sizeof grid, "%lldx%d", (long long)w->u.blocks, w->u.threads);
    if (q) {
      double oc;
      kreport_occupancy(sm, w->u.threads, q->registers, q->smem, &oc);
      snprintf(regs, sizeof regs, "%d", q->registers);
      fmt_si(smem, sizeof smem, (double)q->smem);
      snprintf(spill, sizeof spill, "%lld", (long long)(q->spill_stores + q->spill_loads));
      snprintf(occ, sizeof occ, "%.0f%%", 100 * oc);
    }
    fmt_si(by, sizeof by, w->u.bytes);
    fmt_si(fl, sizeof fl, w->u.flops);
    double ai = w->u.bytes > 0 ? w->u.flops / w->u.bytes : 0;
    if (hw) {
      snprintf(t, sizeof t, "%.2f", w->t * 1e6);
      double peak, bw;
      roof_rates(hw, m->train.precision, &peak, &bw);
      double ridge = peak / bw;
      snprintf(bound, sizeof bound, "%s", ai >= ridge ? "compute" : "memory");
    }
    char name[41];
    snprintf(name, sizeof name, "%s", w->u.name);
    sb_printf(out, "%-40s %5d %6d %10s %5s %7s %6s %5s %10s %10s %7.3f %10s %-7s %s\n", name, w->sites,
              w->u.launches, grid, regs, smem, spill, occ, by, fl, ai, t, bound, w->u.where);
    tb += w->u.bytes, tfl += w->u.flops, tt += w->t;
  }
  char by[16], fl[16];
  fmt_si(by, sizeof by, tb);
  fmt_si(fl, sizeof fl, tfl);
  sb_printf(out, "# total: %s bytes, %s flops per run of every block once", by, fl);
  if (hw) sb_printf(out, "; %.1f us of generated and library kernels on %s", tt * 1e6, hw->name);
  sb_puts(out, "\n");
  free(rows.a);
  cg_nvrtc_out_free(&o);
  rt_cuda_module_free(&mod);
  free(u);
  return 0;
}
