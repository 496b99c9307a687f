/* hw.c - reading hardware descriptions (hw/README.md) and the cost model
 * over them (hw.h; formulas and sources in docs/performance-model.md). */
#include "hw.h"
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>

static const char *fmt_names[HW_FMT_COUNT] = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8"};
const char *hw_format_name(HwFormat f) { return f >= 0 && f < HW_FMT_COUNT ? fmt_names[f] : "?"; }

HwFormat hw_format_of(IrDtype t, int tf32) {
  if (t == IR_F64) return HW_FP64;
  if (t == IR_BF16) return HW_BF16;   /* --precision bf16: GEMMs on bf16 operands, f32 accumulation */
  if (t == IR_F16) return HW_FP16;
  return tf32 ? HW_TF32 : HW_FP32;
}

/* ---- the file ---- */

/* The scalar keys: name, where in HwDesc, and whether it is an int. */
typedef struct { const char *key; size_t off; int is_int; } HwKey;
#define K(k, f, i) {k, offsetof(HwDesc, f), i}
static const HwKey keys[] = {
    K("hbm_bytes", hbm_bytes, 0),           K("hbm_bandwidth", hbm_bw, 0),
    K("memory_efficiency", mem_eff, 0),     K("sms", sms, 1),
    K("gemm_tile_m", tile_m, 1),            K("gemm_tile_n", tile_n, 1),
    K("gemm_tile_k", tile_k, 1),
    K("kernel_overhead", kernel_overhead, 0), K("gpus_per_node", gpus_per_node, 1),
    K("nvlink_bandwidth", nvlink_bw, 0),    K("nvlink_latency", nvlink_latency, 0),
    K("nvlink_efficiency", nvlink_eff, 0),  K("nics_per_node", nics_per_node, 1),
    K("nic_bandwidth", nic_bw, 0),          K("nic_latency", nic_latency, 0),
    K("nic_efficiency", nic_eff, 0),
};
#undef K
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))
/* the per-format keys: `peak fp32 67e12` */
static const char *fmt_keys[] = {"peak", "gemm_efficiency", "attention_efficiency"};
#define NFMTKEYS 3

static double *fmt_slot(HwDesc *h, int k, int f) {
  return k == 0 ? &h->peak[f] : k == 1 ? &h->gemm_eff[f] : &h->attention_eff[f];
}

/* A number: decimal or e-notation, finite, >= 0. */
static int parse_num(const char *s, double *v) {
  char *e;
  errno = 0;
  *v = strtod(s, &e);
  return e != s && !*e && !errno && isfinite(*v) && *v >= 0 ? 0 : -1;
}

/* The next whitespace-separated word of *p into w (NUL-terminated, at most
 * n - 1 bytes); 0 when there is none. */
static int word(const char **p, char *w, size_t n) {
  const char *s = *p;
  while (*s == ' ' || *s == '\t') s++;
  size_t k = 0;
  while (*s && *s != ' ' && *s != '\t') {
    if (k + 1 < n) w[k++] = *s;
    s++;
  }
  w[k] = 0;
  *p = s;
  return k > 0;
}

int hw_parse(const char *text, const char *path, HwDesc *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  snprintf(out->path, sizeof out->path, "%s", path);
  int seen[NKEYS] = {0}, seen_name = 0, seen_fmt[NFMTKEYS][HW_FMT_COUNT] = {{0}};
  int line = 0;
  for (const char *p = text; *p;) {
    line++;
    const char *end = strchr(p, '\n');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    char buf[1024];
    if (n >= sizeof buf) return ts_errf(err, errlen, "%s:%d: error: line longer than %zu bytes", path, line, sizeof buf - 1);
    memcpy(buf, p, n);
    buf[n] = 0;
    p += n + (end != NULL);
    char *hash = strchr(buf, '#');
    if (hash) *hash = 0;
    for (char *c = buf; *c; c++)
      if (*c == '\r') *c = ' ';
    const char *q = buf;
    char key[64], a1[64], a2[64], extra[64];
    if (!word(&q, key, sizeof key)) continue;   /* blank or comment */
    int has1 = word(&q, a1, sizeof a1), has2 = word(&q, a2, sizeof a2), has3 = word(&q, extra, sizeof extra);
    if (!strcmp(key, "name")) {
      if (!has1 || has2) return ts_errf(err, errlen, "%s:%d: error: 'name' takes one word", path, line);
      if (seen_name) return ts_errf(err, errlen, "%s:%d: error: 'name' is given twice", path, line);
      snprintf(out->name, sizeof out->name, "%s", a1);
      seen_name = 1;
      continue;
    }
    int fk = -1;
    for (int k = 0; k < NFMTKEYS; k++)
      if (!strcmp(key, fmt_keys[k])) fk = k;
    if (fk >= 0) {
      int f = -1;
      for (int k = 0; k < HW_FMT_COUNT && has1; k++)
        if (!strcmp(a1, fmt_names[k])) f = k;
      if (f < 0)
        return ts_errf(err, errlen, "%s:%d: error: '%s' needs a format (fp64 fp32 tf32 bf16 fp16 fp8) and a number, "
                                    "got '%s'", path, line, key, has1 ? a1 : "");
      double v;
      if (!has2 || has3 || parse_num(a2, &v) != 0)
        return ts_errf(err, errlen, "%s:%d: error: '%s %s' needs one non-negative number, got '%s'", path, line, key,
                       a1, has2 ? a2 : "");
      if (fk > 0 && v > 1)
        return ts_errf(err, errlen, "%s:%d: error: '%s %s' is a fraction of the peak (0 to 1), got %s", path, line, key,
                       a1, a2);
      if (seen_fmt[fk][f]) return ts_errf(err, errlen, "%s:%d: error: '%s %s' is given twice", path, line, key, a1);
      seen_fmt[fk][f] = 1;
      *fmt_slot(out, fk, f) = v;
      continue;
    }
    int k = 0;
    while (k < NKEYS && strcmp(key, keys[k].key)) k++;
    if (k == NKEYS) return ts_errf(err, errlen, "%s:%d: error: unknown key '%s' (hw/README.md lists the keys)", path, line, key);
    double v;
    if (!has1 || has2 || parse_num(a1, &v) != 0)
      return ts_errf(err, errlen, "%s:%d: error: '%s' needs one non-negative number, got '%s'", path, line, key,
                     has1 ? a1 : "");
    if (seen[k]) return ts_errf(err, errlen, "%s:%d: error: '%s' is given twice", path, line, key);
    seen[k] = 1;
    if (keys[k].is_int) {
      if (v != floor(v) || v < 1 || v > 1e6)
        return ts_errf(err, errlen, "%s:%d: error: '%s' must be a whole number from 1 to 1000000, got %s", path, line,
                       key, a1);
      *(int *)((char *)out + keys[k].off) = (int)v;
    } else {
      if (strstr(key, "efficiency") && (v <= 0 || v > 1))
        return ts_errf(err, errlen, "%s:%d: error: '%s' is a fraction (above 0, at most 1), got %s", path, line, key, a1);
      *(double *)((char *)out + keys[k].off) = v;
    }
  }
  if (!seen_name) return ts_errf(err, errlen, "%s:%d: error: no 'name' key", path, line);
  for (int k = 0; k < NKEYS; k++)
    if (!seen[k]) return ts_errf(err, errlen, "%s:%d: error: the key '%s' is missing", path, line, keys[k].key);
  if (!seen_fmt[0][HW_FP32] || out->peak[HW_FP32] <= 0)
    return ts_errf(err, errlen, "%s:%d: error: 'peak fp32' is missing (every description needs it)", path, line);
  if (out->hbm_bw <= 0 || out->nvlink_bw <= 0 || out->nic_bw <= 0)
    return ts_errf(err, errlen, "%s:%d: error: the bandwidths must be positive", path, line);
  for (int f = 0; f < HW_FMT_COUNT; f++) {
    if (out->gemm_eff[f] <= 0) out->gemm_eff[f] = 1;
    if (out->attention_eff[f] <= 0) out->attention_eff[f] = out->gemm_eff[f];
  }
  return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int hw_load(const char *name, HwDesc *out, char *err, size_t errlen) {
  char path[4096 + 64];
  struct stat st;
  int is_file = strchr(name, '/') || (stat(name, &st) == 0 && S_ISREG(st.st_mode));
  const char *env = getenv("TESSERA_HW");
  char dir[4096];
  if (env && *env) snprintf(dir, sizeof dir, "%s", env);
  else snprintf(dir, sizeof dir, "%s/hw", ts_data_root());
  if (is_file) snprintf(path, sizeof path, "%s", name);
  else {
    for (const char *c = name; *c; c++)
      if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' && *c != '.')
        return ts_errf(err, errlen, "--hw '%s': not a file, and not a description's name", name);
    snprintf(path, sizeof path, "%s/%s.hw", dir, name);
  }
  size_t len;
  char *text = ts_read_file_max(path, 1 << 20, &len);
  if (!text) {
    if (is_file) return ts_errf(err, errlen, "--hw: cannot read '%s': %s", path, strerror(errno));
    StrBuf names = {0};
    VEC(char *) found = {0};
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
      size_t n = strlen(e->d_name);
      if (n > 3 && !strcmp(e->d_name + n - 3, ".hw")) {
        char *s = ts_xmalloc(n - 2);
        memcpy(s, e->d_name, n - 3);
        s[n - 3] = 0;
        VEC_PUSH(found, s);
      }
    }
    if (d) closedir(d);
    qsort(found.a, (size_t)found.n, sizeof *found.a, cmp_str);
    for (int i = 0; i < found.n; i++) { sb_printf(&names, " %s", found.a[i]); free(found.a[i]); }
    free(found.a);
    int rc = ts_errf(err, errlen, "--hw: no description named '%s' in %s (known:%s; or give a file's path)", name, dir,
                     names.p ? names.p : " none");
    sb_free(&names);
    return rc;
  }
  if (memchr(text, 0, len)) {
    free(text);
    return ts_errf(err, errlen, "%s:1: error: the description is not text (a NUL byte)", path);
  }
  int rc = hw_parse(text, path, out, err, errlen);
  free(text);
  return rc;
}

/* ---- the cost model ---- */

static double peak_of(const HwDesc *h, HwFormat f) {
  double p = h->peak[f];
  return p > 0 ? p : h->peak[HW_FP32];   /* a format without a peak: the CUDA cores' (documented) */
}

double hw_mem_time(const HwDesc *h, double bytes) {
  return h->kernel_overhead + bytes / (h->hbm_bw * h->mem_eff);
}

double hw_gemm_time(const HwDesc *h, HwFormat f, double batch, double M, double N, double K, double esize) {
  double flops = 2 * batch * M * N * K;
  /* work units: output tiles times K chunks (split-K / stream-K kernels
   * spread the K loop over SMs when there are few output tiles) */
  double tiles = batch * ceil(M / h->tile_m) * ceil(N / h->tile_n) * ceil(K / h->tile_k);
  double waves = ceil(tiles / h->sms);
  double q = tiles > 0 ? tiles / (waves * h->sms) : 1;   /* the last wave's idle SMs */
  double tc = flops / (peak_of(h, f) * h->gemm_eff[f] * q);
  double tm = batch * (M * K + K * N + M * N) * esize / (h->hbm_bw * h->mem_eff);
  return h->kernel_overhead + (tc > tm ? tc : tm);
}

double hw_attention_time(const HwDesc *h, HwFormat f, double flops, double bytes) {
  double tc = flops / (peak_of(h, f) * h->attention_eff[f]);
  double tm = bytes / (h->hbm_bw * h->mem_eff);
  return h->kernel_overhead + (tc > tm ? tc : tm);
}

HwLink hw_link(const HwDesc *h, int n, int64_t stride) {
  HwLink l;
  if ((double)stride * n <= h->gpus_per_node) {
    l.bw = h->nvlink_bw * h->nvlink_eff;
    l.latency = h->nvlink_latency;
    l.inter = 0;
  } else {
    /* every GPU's share of the node's NICs (rail-optimized: a NIC per GPU
     * on the machines described); a ring that also has NVLink hops is
     * still as slow as its slowest hop */
    l.bw = h->nic_bw * h->nics_per_node / h->gpus_per_node * h->nic_eff;
    l.latency = h->nic_latency;
    l.inter = 1;
  }
  return l;
}

double hw_coll_time(const HwLink *l, HwColl c, int n, double S) {
  if (n < 2 && c != HW_SEND) return 0;
  double a = l->latency, B = l->bw;
  switch (c) {
  case HW_ALL_REDUCE: {
    double ring = 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * S / B;
    double tree = 2.0 * ceil(log2((double)n)) * a + 2.0 * S / B;
    return ring < tree ? ring : tree;
  }
  case HW_ALL_GATHER:
  case HW_REDUCE_SCATTER:
  case HW_ALL_TO_ALL: return (n - 1) * a + (double)(n - 1) / n * S / B;
  case HW_SEND: return a + S / B;
  }
  return 0;
}
