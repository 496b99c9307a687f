/* selftest.c - `mrun --selftest` (selftest.h): every kind of device kernel
 * and a tiny training step on a device, each against the CPU backend.
 *
 * The kinds are blocks of one module per dtype, written in IR text by the
 * builders below (each block's states are named "<kind>.<name>", its i32
 * inputs fed from here).  One module per dtype keeps the device's compile
 * to one per dtype.  A device of a known arch (a GPU) gets the module as
 * mrun gets it from a plan: compiled by NVRTC for that arch (cubin and
 * PTX, as mcc --target); the emulator compiles the source itself.  When
 * the device refuses the module, the kind it names is
 * marked "no kernel" if the refusal is a missing CUDA kernel, and the
 * module is rebuilt without it; any other refusal is isolated by trying
 * each kind alone.  The training step runs a model the caller gives as IR
 * text after every pass (mrun: samples/gpt.mdl at toy size, compiled by
 * mcc when mrun is built and embedded in it, so the runtime links no
 * compiler) and writes its corpus and parameter files into a fresh
 * directory under $TMPDIR. */
#include "selftest.h"
#include "runtime/device/device.h"
#include "dev_prog.h"
#include "train.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#define ST_BUDGET_MS 50.0   /* timing runs per block: about this long, 1 to ST_MAX_REPS runs */
#define ST_MAX_REPS 20
#define ST_FLOOR 1e-3       /* |dev - cpu| / max(|cpu|, floor), as tests/codegen; for an f32 state
                               the floor is its largest |cpu| element (see compare) */

/* ---- building a module in IR text ---- */

typedef struct { const char *name; int64_t n; int32_t *v; } StFeed;
typedef VEC(StFeed) StFeeds;

typedef struct {
  const char *dt;      /* "f32" / "f64" */
  const char *kind;    /* block name and state prefix */
  StrBuf *states;      /* the module's state lines */
  StrBuf body;         /* this block's nodes */
  int n, nout;         /* next node index; outputs so far */
  StFeeds *feeds;
} Kb;

/* The type text: dtype + shape ("[6, 40]"), or the shape itself when it
 * names its dtype ("i32[6]"). */
static void kb_type(Kb *k, StrBuf *b, const char *shape) {
  if (shape[0] == '[') sb_printf(b, "%s%s", k->dt, shape);
  else sb_puts(b, shape);
}

/* A state declared with `spec` ("param init=...", "grad of=@x"), not read. */
static void kb_decl(Kb *k, const char *name, const char *shape, const char *spec) {
  sb_printf(k->states, "state @%s.%s : ", k->kind, name);
  kb_type(k, k->states, shape);
  sb_printf(k->states, " %s\n", spec);
}

/* A state read in the block: %N = state @kind.name. */
static int kb_read(Kb *k, const char *name, const char *shape) {
  sb_printf(&k->body, "  %%%d = state @%s.%s : ", k->n, k->kind, name);
  kb_type(k, &k->body, shape);
  sb_putc(&k->body, '\n');
  return k->n++;
}

/* A parameter (the inputs of a kind), declared and read. */
static int kb_param(Kb *k, const char *name, const char *shape, const char *init) {
  char spec[128];
  snprintf(spec, sizeof spec, "param init=%s", init);
  kb_decl(k, name, shape, spec);
  return kb_read(k, name, shape);
}

/* An i32 input "kind.name" of n ids in [0, vocab) (repeats included), -1 at
 * index `ignore` (< 0: none). */
static int kb_ids(Kb *k, const char *name, const char *shape, int64_t n, int vocab, int64_t ignore) {
  StFeed f = {NULL, n, ts_xmalloc((size_t)n * sizeof(int32_t))};
  char full[96];
  snprintf(full, sizeof full, "%s.%s", k->kind, name);
  f.name = ts_intern(full);
  for (int64_t i = 0; i < n; i++) f.v[i] = i == ignore ? -1 : (int32_t)((i * 7 + 3) % vocab);
  VEC_PUSH(*k->feeds, f);
  sb_printf(&k->body, "  %%%d = input \"%s\" : i32%s\n", k->n, full, shape);
  return k->n++;
}

/* An i32 input "kind.name" holding the n values v. */
static int kb_ints(Kb *k, const char *name, const char *shape, int64_t n, const int32_t *v) {
  int id = kb_ids(k, name, shape, n, 1, -1);
  memcpy(k->feeds->a[k->feeds->n - 1].v, v, (size_t)n * sizeof(int32_t));
  return id;
}

/* A value node: %N = <fmt ...> : TYPE [group=g]. */
__attribute__((format(printf, 4, 5)))
static int kb_op(Kb *k, int group, const char *shape, const char *fmt, ...) {
  char text[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  sb_printf(&k->body, "  %%%d = %s : ", k->n, text);
  kb_type(k, &k->body, shape);
  if (group > 0) sb_printf(&k->body, " group=%d", group);
  sb_putc(&k->body, '\n');
  return k->n++;
}

/* An effect line (accum, zero, adamw, output): takes a node index. */
__attribute__((format(printf, 2, 3)))
static void kb_eff(Kb *k, const char *fmt, ...) {
  char text[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  sb_printf(&k->body, "  %s\n", text);
  k->n++;
}

/* A result: accumulated into a fresh state (starting away from 0, so an
 * accum that overwrites shows too). */
static void kb_out(Kb *k, int v, const char *shape) {
  char name[32];
  snprintf(name, sizeof name, "out%d", k->nout++);
  kb_decl(k, name, shape, "param init=uniform(0.5, 1.5)");
  kb_eff(k, "accum %%%d @%s.%s", v, k->kind, name);
}

/* ---- the kinds (shapes small: the emulator runs them too) ---- */

/* one fused group of 13 elementwise ops with two outputs, and a lone op on
 * an odd length (scalar path) */
static void k_elementwise(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "normal(0.0, 1.0)");
  int y = kb_param(k, "y", "[6, 40]", "uniform(0.5, 1.5)");
  int a = kb_op(k, 1, "[6, 40]", "mul %%%d, %%%d", x, y);
  int b = kb_op(k, 1, "[6, 40]", "adds %%%d c=0.25", a);
  int c = kb_op(k, 1, "[6, 40]", "tanh %%%d", b);
  int d = kb_op(k, 1, "[6, 40]", "div %%%d, %%%d", c, y);
  int e = kb_op(k, 1, "[6, 40]", "sqrt %%%d", y);
  int f = kb_op(k, 1, "[6, 40]", "log %%%d", y);
  int g = kb_op(k, 1, "[6, 40]", "rsqrt %%%d", y);
  int h = kb_op(k, 1, "[6, 40]", "sub %%%d, %%%d", e, f);
  int i = kb_op(k, 1, "[6, 40]", "add %%%d, %%%d", d, h);
  int j = kb_op(k, 1, "[6, 40]", "mul %%%d, %%%d", i, g);
  int l = kb_op(k, 1, "[6, 40]", "exp %%%d", j);
  int m = kb_op(k, 1, "[6, 40]", "neg %%%d", l);
  int o = kb_op(k, 1, "[6, 40]", "muls %%%d c=0.5", m);
  kb_out(k, o, "[6, 40]");
  kb_out(k, d, "[6, 40]");
  int z = kb_param(k, "z", "[37]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[37]", "exp %%%d", z), "[37]");
}

/* softmax alone, scaled + causal-masked + softmax fused (attention's
 * composed form), softmax_bwd */
static void k_softmax(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "normal(0.0, 2.0)");
  int s = kb_op(k, 0, "[6, 40]", "softmax %%%d", x);
  kb_out(k, s, "[6, 40]");
  int x2 = kb_param(k, "x2", "[2, 8, 8]", "normal(0.0, 2.0)");
  int a = kb_op(k, 1, "[2, 8, 8]", "muls %%%d c=0.35355339059327373", x2);
  int b = kb_op(k, 1, "[2, 8, 8]", "causal_mask %%%d fill=-inf", a);
  kb_out(k, kb_op(k, 1, "[2, 8, 8]", "softmax %%%d", b), "[2, 8, 8]");
  int dy = kb_param(k, "dy", "[6, 40]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[6, 40]", "softmax_bwd %%%d, %%%d", s, dy), "[6, 40]");
}

static void k_log_softmax(Kb *k) {
  int x = kb_param(k, "x", "[5, 29]", "normal(0.0, 2.0)");
  int y = kb_op(k, 0, "[5, 29]", "log_softmax %%%d", x);
  kb_out(k, y, "[5, 29]");
  int dy = kb_param(k, "dy", "[5, 29]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[5, 29]", "log_softmax_bwd %%%d, %%%d", y, dy), "[5, 29]");
}

/* layernorm alone, with its affine fused (the models' form), backward */
static void k_layernorm(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "normal(0.5, 1.0)");
  kb_out(k, kb_op(k, 0, "[6, 40]", "layernorm %%%d eps=1e-05", x), "[6, 40]");
  int g = kb_param(k, "g", "[40]", "uniform(0.5, 1.5)");
  int b = kb_param(k, "b", "[40]", "normal(0.0, 1.0)");
  int n = kb_op(k, 1, "[6, 40]", "layernorm %%%d eps=1e-05", x);
  int gb = kb_op(k, 1, "[6, 40]", "broadcast %%%d", g);
  int ng = kb_op(k, 1, "[6, 40]", "mul %%%d, %%%d", n, gb);
  int bb = kb_op(k, 1, "[6, 40]", "broadcast %%%d", b);
  kb_out(k, kb_op(k, 1, "[6, 40]", "add %%%d, %%%d", ng, bb), "[6, 40]");
  int dy = kb_param(k, "dy", "[6, 40]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[6, 40]", "layernorm_bwd %%%d, %%%d eps=1e-05", x, dy), "[6, 40]");
}

static void k_rmsnorm(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "normal(0.5, 1.0)");
  kb_out(k, kb_op(k, 0, "[6, 40]", "rmsnorm %%%d eps=1e-05", x), "[6, 40]");
  int dy = kb_param(k, "dy", "[6, 40]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[6, 40]", "rmsnorm_bwd %%%d, %%%d eps=1e-05", x, dy), "[6, 40]");
}

/* per-token loss (one target ignored) and its backward */
static void k_cross_entropy(Kb *k) {
  int l = kb_param(k, "logits", "[6, 40]", "normal(0.0, 2.0)");
  int t = kb_ids(k, "targets", "[6]", 6, 40, 4);
  kb_out(k, kb_op(k, 0, "[6]", "cross_entropy %%%d, %%%d ignore=-1", l, t), "[6]");
  int dl = kb_param(k, "dloss", "[6]", "uniform(0.5, 1.5)");
  kb_out(k, kb_op(k, 0, "[6, 40]", "cross_entropy_bwd %%%d, %%%d, %%%d ignore=-1", l, t, dl), "[6, 40]");
}

/* sum / mean / max along axes (positive inputs: no cancellation) */
static void k_reduce(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "uniform(0.5, 1.5)");
  kb_out(k, kb_op(k, 0, "[6]", "sum %%%d axis=1 keepdim=0", x), "[6]");
  kb_out(k, kb_op(k, 0, "[40]", "mean %%%d axis=0 keepdim=0", x), "[40]");
  kb_out(k, kb_op(k, 0, "[6, 1]", "max %%%d axis=1 keepdim=1", x), "[6, 1]");
  int x3 = kb_param(k, "x3", "[4, 5, 6]", "uniform(0.5, 1.5)");
  kb_out(k, kb_op(k, 0, "[4, 6]", "sum %%%d axis=1 keepdim=0", x3), "[4, 6]");
}

static void k_sum_to(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "uniform(0.5, 1.5)");
  kb_out(k, kb_op(k, 0, "[40]", "sum_to %%%d", x), "[40]");
  int x3 = kb_param(k, "x3", "[3, 4, 5]", "uniform(0.5, 1.5)");
  kb_out(k, kb_op(k, 0, "[4, 1]", "sum_to %%%d", x3), "[4, 1]");
}

/* sum of squares, the scalar also reported by `output` */
static void k_sumsq(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "normal(0.0, 1.0)");
  int s = kb_op(k, 0, "[]", "sumsq %%%d", x);
  kb_out(k, s, "[]");
  kb_eff(k, "output \"sumsq\" %%%d", s);
  int y = kb_param(k, "y", "[300]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[]", "sumsq %%%d", y), "[]");
}

static void k_activations(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "normal(0.0, 1.5)");
  int dy = kb_param(k, "dy", "[6, 40]", "normal(0.0, 1.0)");
  static const char *const ops[] = {"gelu_tanh", "gelu_erf", "silu", "relu"};
  for (int i = 0; i < 4; i++) {
    kb_out(k, kb_op(k, 0, "[6, 40]", "%s %%%d", ops[i], x), "[6, 40]");
    kb_out(k, kb_op(k, 0, "[6, 40]", "%s_bwd %%%d, %%%d", ops[i], x, dy), "[6, 40]");
  }
}

/* the mask hashes the seed, stream, step and micro batch of the run */
static void k_dropout(Kb *k) {
  int x = kb_param(k, "x", "[6, 40]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[6, 40]", "dropout %%%d stream=2 p=0.25", x), "[6, 40]");
}

/* GEMMs: plain, transposed a / b, batched, a shared right operand */
static void k_matmul(Kb *k) {
  int a = kb_param(k, "a", "[6, 16]", "normal(0.0, 1.0)");
  int w = kb_param(k, "w", "[16, 12]", "normal(0.0, 1.0)");
  int at = kb_param(k, "at", "[16, 6]", "normal(0.0, 1.0)");
  int wt = kb_param(k, "wt", "[12, 16]", "normal(0.0, 1.0)");
  int a3 = kb_param(k, "a3", "[2, 6, 16]", "normal(0.0, 1.0)");
  int b3 = kb_param(k, "b3", "[2, 16, 12]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[6, 12]", "matmul %%%d, %%%d ta=0 tb=0", a, w), "[6, 12]");
  kb_out(k, kb_op(k, 0, "[6, 12]", "matmul %%%d, %%%d ta=1 tb=0", at, w), "[6, 12]");
  kb_out(k, kb_op(k, 0, "[6, 12]", "matmul %%%d, %%%d ta=0 tb=1", a, wt), "[6, 12]");
  kb_out(k, kb_op(k, 0, "[2, 6, 12]", "matmul %%%d, %%%d ta=0 tb=0", a3, b3), "[2, 6, 12]");
  kb_out(k, kb_op(k, 0, "[2, 6, 12]", "matmul %%%d, %%%d ta=0 tb=0", a3, w), "[2, 6, 12]");
}

/* x @ W + b as one group: a GEMM with the bias epilogue */
static void k_gemm_bias(Kb *k) {
  int a = kb_param(k, "a", "[2, 6, 16]", "normal(0.0, 1.0)");
  int w = kb_param(k, "w", "[16, 12]", "normal(0.0, 1.0)");
  int b = kb_param(k, "b", "[12]", "normal(0.0, 1.0)");
  int mm = kb_op(k, 1, "[2, 6, 12]", "matmul %%%d, %%%d ta=0 tb=0", a, w);
  int bb = kb_op(k, 1, "[2, 6, 12]", "broadcast %%%d", b);
  kb_out(k, kb_op(k, 1, "[2, 6, 12]", "add %%%d, %%%d", mm, bb), "[2, 6, 12]");
}

/* the fused op, causal, grouped-query (4 query heads on 2 kv heads), and
 * the three parts of its backward */
static void k_attention(Kb *k) {
  int q = kb_param(k, "q", "[1, 4, 8, 8]", "normal(0.0, 1.0)");
  int kk = kb_param(k, "k", "[1, 2, 8, 8]", "normal(0.0, 1.0)");
  int v = kb_param(k, "v", "[1, 2, 8, 8]", "normal(0.0, 1.0)");
  const char *sc = "scale=0.35355339059327373";
  int o = kb_op(k, 0, "[1, 4, 8, 8]", "attention %%%d, %%%d, %%%d causal=1 window=0 alibi=0 bias=0 %s", q, kk, v, sc);
  kb_out(k, o, "[1, 4, 8, 8]");
  int d = kb_param(k, "do", "[1, 4, 8, 8]", "normal(0.0, 1.0)");
  static const char *const shp[] = {"[1, 4, 8, 8]", "[1, 2, 8, 8]", "[1, 2, 8, 8]"};
  for (int part = 0; part < 3; part++)
    kb_out(k, kb_op(k, 0, shp[part], "attention_bwd %%%d, %%%d, %%%d, %%%d, %%%d causal=1 part=%d window=0 alibi=0 bias=0 %s", q, kk, v, o,
                    d, part, sc), shp[part]);
}

/* packed sequences and a sliding window: the same op and backward with a
 * document-ids operand (three documents in a row of 12, one of them split
 * around another) and window=3, not causal for the first output */
static void k_attention_packed(Kb *k) {
  static const int32_t doc[12] = {0, 0, 0, 0, 1, 1, 1, 2, 2, 0, 0, 2};
  int q = kb_param(k, "q", "[1, 4, 12, 8]", "normal(0.0, 1.0)");
  int kk = kb_param(k, "k", "[1, 2, 12, 8]", "normal(0.0, 1.0)");
  int v = kb_param(k, "v", "[1, 2, 12, 8]", "normal(0.0, 1.0)");
  int d = kb_ints(k, "docs", "[1, 12]", 12, doc);
  const char *sc = "scale=0.35355339059327373";
  kb_out(k, kb_op(k, 0, "[1, 4, 12, 8]", "attention %%%d, %%%d, %%%d, %%%d causal=0 window=3 alibi=0 bias=0 %s", q, kk, v, d, sc),
         "[1, 4, 12, 8]");
  int o = kb_op(k, 0, "[1, 4, 12, 8]", "attention %%%d, %%%d, %%%d, %%%d causal=1 window=3 alibi=0 bias=0 %s", q, kk, v, d, sc);
  kb_out(k, o, "[1, 4, 12, 8]");
  int dy = kb_param(k, "do", "[1, 4, 12, 8]", "normal(0.0, 1.0)");
  static const char *const shp[] = {"[1, 4, 12, 8]", "[1, 2, 12, 8]", "[1, 2, 12, 8]"};
  for (int part = 0; part < 3; part++)
    kb_out(k, kb_op(k, 0, shp[part], "attention_bwd %%%d, %%%d, %%%d, %%%d, %%%d, %%%d causal=1 part=%d window=3 alibi=0 bias=0 %s", q,
                    kk, v, o, dy, d, part, sc), shp[part]);
}

/* the three parts of one attention's backward as the executor groups them
 * (plan_attn_grad_runs: one after another, on values): one launch group
 * on a device, the statistics once and dk with dv in one kernel; causal,
 * 4 query heads on 2 kv heads, a sliding window */
static void k_attention_grads(Kb *k) {
  static const char *const shp[] = {"[1, 4, 8, 8]", "[1, 2, 8, 8]", "[1, 2, 8, 8]"};
  int q = kb_param(k, "q", shp[0], "normal(0.0, 1.0)");
  int kk = kb_param(k, "k", shp[1], "normal(0.0, 1.0)");
  int v = kb_param(k, "v", shp[1], "normal(0.0, 1.0)");
  int d = kb_param(k, "do", shp[0], "normal(0.0, 1.0)");
  q = kb_op(k, 0, shp[0], "muls %%%d c=1.0", q);   /* values, not states (the group's condition) */
  kk = kb_op(k, 0, shp[1], "muls %%%d c=1.0", kk);
  v = kb_op(k, 0, shp[1], "muls %%%d c=1.0", v);
  d = kb_op(k, 0, shp[0], "muls %%%d c=1.0", d);
  const char *sc = "scale=0.35355339059327373";
  int o = kb_op(k, 0, shp[0], "attention %%%d, %%%d, %%%d causal=1 window=6 alibi=0 bias=0 %s", q, kk, v, sc);
  int g[3];
  for (int part = 0; part < 3; part++)
    g[part] = kb_op(k, 0, shp[part], "attention_bwd %%%d, %%%d, %%%d, %%%d, %%%d causal=1 part=%d window=6 alibi=0 bias=0 %s", q, kk,
                    v, o, d, part, sc);
  for (int part = 0; part < 3; part++) kb_out(k, g[part], shp[part]);
}

/* lookup and its scatter-add backward (ids repeat) */
static void k_embedding(Kb *k) {
  int t = kb_param(k, "table", "[20, 12]", "normal(0.0, 1.0)");
  int ids = kb_ids(k, "ids", "[2, 5]", 10, 4, -1);
  kb_out(k, kb_op(k, 0, "[2, 5, 12]", "embedding %%%d, %%%d", t, ids), "[2, 5, 12]");
  int dy = kb_param(k, "dy", "[2, 5, 12]", "normal(0.0, 1.0)");
  char typ[32];
  snprintf(typ, sizeof typ, "%s[20, 12]", k->dt);
  kb_out(k, kb_op(k, 0, typ, "embedding_bwd %%%d, %%%d", ids, dy), "[20, 12]");
}

static void k_rope(Kb *k) {
  int x = kb_param(k, "x", "[2, 8, 4, 16]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[2, 8, 4, 16]", "rope %%%d axis=1 inverse=0 base=10000.0", x), "[2, 8, 4, 16]");
  kb_out(k, kb_op(k, 0, "[2, 8, 4, 16]", "rope %%%d axis=1 inverse=1 base=10000.0", x), "[2, 8, 4, 16]");
}

/* gradients accumulated, clipped by their norm (sumsq, sqrt, clip_coef),
 * then one AdamW run over two tensors (weight decay on one) */
static void k_adamw(Kb *k) {
  static const char *const shp[2] = {"[40]", "[7, 9]"};
  int gx[2], gr[2];
  for (int t = 0; t < 2; t++) {
    char w[8], g[8], m[8], v[8], of[40];
    snprintf(w, sizeof w, "w%d", t);
    snprintf(g, sizeof g, "g%d", t);
    snprintf(m, sizeof m, "m%d", t);
    snprintf(v, sizeof v, "v%d", t);
    snprintf(of, sizeof of, "grad of=@%s.%s", k->kind, w);
    kb_decl(k, w, shp[t], "param init=normal(0.0, 1.0)");
    kb_decl(k, g, shp[t], of);
    snprintf(of, sizeof of, "adam_m of=@%s.%s", k->kind, w);
    kb_decl(k, m, shp[t], of);
    snprintf(of, sizeof of, "adam_v of=@%s.%s", k->kind, w);
    kb_decl(k, v, shp[t], of);
    char src[8];
    snprintf(src, sizeof src, "gsrc%d", t);
    gx[t] = kb_param(k, src, shp[t], "normal(0.0, 0.5)");
    kb_eff(k, "accum %%%d @%s.%s", gx[t], k->kind, g);
  }
  for (int t = 0; t < 2; t++) {
    char g[8];
    snprintf(g, sizeof g, "g%d", t);
    gr[t] = kb_read(k, g, shp[t]);
  }
  int s0 = kb_op(k, 0, "[]", "sumsq %%%d", gr[0]);
  int s1 = kb_op(k, 0, "[]", "sumsq %%%d", gr[1]);
  int s = kb_op(k, 0, "[]", "add %%%d, %%%d", s0, s1);
  int nrm = kb_op(k, 0, "[]", "sqrt %%%d", s);
  int coef = kb_op(k, 0, "[]", "clip_coef %%%d max=1.0", nrm);
  for (int t = 0; t < 2; t++)
    kb_eff(k, "adamw %%%d, %%%d @%s.w%d @%s.m%d @%s.v%d b1=0.9 b2=0.95 eps=1e-08 wd=%s", coef, gr[t], k->kind, t,
           k->kind, t, k->kind, t, t == 0 ? "0.1" : "0.0");
}

/* zero, accum, assign on states */
static void k_accum_zero(Kb *k) {
  kb_decl(k, "s", "[6, 40]", "param init=uniform(0.5, 1.5)");
  kb_decl(k, "t", "[6, 40]", "param init=uniform(0.5, 1.5)");
  kb_decl(k, "u", "[37]", "param init=uniform(0.5, 1.5)");
  int x = kb_param(k, "x", "[6, 40]", "normal(0.0, 1.0)");
  int y = kb_param(k, "y", "[6, 40]", "normal(0.0, 1.0)");
  kb_eff(k, "zero @%s.s", k->kind);
  kb_eff(k, "accum %%%d @%s.s", x, k->kind);
  kb_eff(k, "accum %%%d @%s.s", y, k->kind);
  kb_eff(k, "assign %%%d @%s.t", y, k->kind);
  kb_eff(k, "zero @%s.u", k->kind);
}

/* layout ops alone: copy kernels on a device */
static void k_layout(Kb *k) {
  int x = kb_param(k, "x", "[2, 3, 8]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[8, 2, 3]", "permute %%%d perm=[2, 0, 1]", x), "[8, 2, 3]");
  int b = kb_param(k, "b", "[8]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[2, 3, 8]", "broadcast %%%d", b), "[2, 3, 8]");
  int c = kb_param(k, "c", "[3, 1]", "normal(0.0, 1.0)");
  kb_out(k, kb_op(k, 0, "[2, 3, 8]", "broadcast %%%d", c), "[2, 3, 8]");
  kb_out(k, kb_op(k, 0, "[2, 3, 5]", "slice %%%d axis=2 start=2 end=7", x), "[2, 3, 5]");
  kb_out(k, kb_op(k, 0, "[2, 6, 8]", "pad %%%d axis=1 before=1 after=2", x), "[2, 6, 8]");
  kb_out(k, kb_op(k, 0, "[4, 3, 8]", "concat %%%d, %%%d axis=0", x, x), "[4, 3, 8]");
  int r = kb_op(k, 0, "[6, 8]", "reshape %%%d", x);
  kb_out(k, kb_op(k, 0, "[8, 6]", "permute %%%d perm=[1, 0]", r), "[8, 6]");
}

typedef struct { const char *name; void (*build)(Kb *k); } StKind;
static const StKind kinds[] = {
  {"elementwise", k_elementwise}, {"softmax", k_softmax}, {"log_softmax", k_log_softmax},
  {"layernorm", k_layernorm}, {"rmsnorm", k_rmsnorm}, {"cross_entropy", k_cross_entropy},
  {"reduce", k_reduce}, {"sum_to", k_sum_to}, {"sumsq", k_sumsq}, {"activations", k_activations},
  {"dropout", k_dropout}, {"matmul", k_matmul}, {"gemm_bias", k_gemm_bias}, {"attention", k_attention},
  {"attention_packed", k_attention_packed}, {"attention_grads", k_attention_grads},
  {"embedding", k_embedding}, {"rope", k_rope}, {"adamw", k_adamw}, {"accum_zero", k_accum_zero},
  {"layout", k_layout},
};
enum { NKINDS = sizeof kinds / sizeof kinds[0] };

/* ---- results ---- */

enum { ST_PASS, ST_FAIL, ST_NOKERNEL };
typedef struct {
  const char *kind, *dt;
  double err, limit, ms;
  int status;
  int measured;      /* err holds a comparison */
  char note[400];    /* FAIL: where or why; no kernel: the refusal */
} StRow;

static void row_fail(StRow *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void row_fail(StRow *r, const char *fmt, ...) {
  r->status = ST_FAIL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->note, sizeof r->note, fmt, ap);
  va_end(ap);
}

/* The module text of kinds sel[0..n) in dtype dt; feeds appended to *fv. */
static char *module_text(const char *dt, const int *sel, int n, StFeeds *fv) {
  StrBuf states = {0}, text = {0}, blocks = {0};
  for (int i = 0; i < n; i++) {
    Kb k = {.dt = dt, .kind = kinds[sel[i]].name, .states = &states, .feeds = fv};
    kinds[sel[i]].build(&k);
    sb_printf(&blocks, "block %s {\n%s}\n", k.kind, k.body.p ? k.body.p : "");
    sb_free(&k.body);
  }
  sb_printf(&text, "module selftest_%s\n", dt);
  sb_printf(&text, "train lr=0.01 seed=4321 precision=%s\n", dt);
  sb_printf(&text, "parallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0\n%s%send\n", states.p ? states.p : "", blocks.p);
  sb_free(&states);
  sb_free(&blocks);
  return text.p;
}

static void feeds_free(StFeeds *fv) {
  for (int i = 0; i < fv->n; i++) free(fv->a[i].v);
  free(fv->a);
  fv->a = NULL;
  fv->n = fv->cap = 0;
}

/* Element i of state / value data as double. */
static double at(const void *p, IrDtype t, int64_t i) {
  return t == IR_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

/* |a - ref| / max(|ref|, floor); a NaN on one side only is infinite. */
static double rel_err(double a, double ref, double floor) {
  if (isnan(a) || isnan(ref)) return isnan(a) && isnan(ref) ? 0 : INFINITY;
  if (a == ref) return 0;
  return fabs(a - ref) / fmax(fabs(ref), floor);
}

/* Compares every state of kind `kind` and every output the block reported:
 * the worst error into r->err, where into r->note. */
static void compare(const IrModule *m, RtProgram *cpu, RtProgram *dev, const char *kind, StRow *r) {
  size_t kl = strlen(kind);
  char where[200] = "";
  double worst = 0;
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (strncmp(st->name, kind, kl) != 0 || st->name[kl] != '.') continue;
    const void *a = rt_state_data(dev, s), *b = rt_state_data(cpu, s);
    int64_t n = ir_type_numel(&st->type);
    /* f32: relative to the state's largest element.  The CPU computes f32
     * in f32 where it must be fast (sgemm; the fused attention's tiles) and
     * a device may order its sums otherwise, so entries that are sums
     * cancelling to small values differ by roundings of the large terms */
    double floor = ST_FLOOR;
    for (int64_t i = 0; st->type.dtype == IR_F32 && i < n; i++) floor = fmax(floor, fabs(at(b, st->type.dtype, i)));
    for (int64_t i = 0; i < n; i++) {
      double e = rel_err(at(a, st->type.dtype, i), at(b, st->type.dtype, i), floor);
      if (!(e <= worst)) {
        worst = e;
        snprintf(where, sizeof where, "@%s[%lld]: device %.9g, cpu %.9g", st->name, (long long)i,
                 at(a, st->type.dtype, i), at(b, st->type.dtype, i));
      }
    }
  }
  for (int i = 0; i < rt_output_count(cpu); i++) {
    double vc = 0, vd = NAN;
    const char *name = rt_output_at(cpu, i, &vc);
    if (rt_output(dev, name, &vd) != 0) vd = NAN;
    double e = rel_err(vd, vc, ST_FLOOR);
    if (!(e <= worst)) {
      worst = e;
      snprintf(where, sizeof where, "output \"%s\": device %.9g, cpu %.9g", name, vd, vc);
    }
  }
  r->err = worst;
  r->measured = 1;
  if (!(worst <= r->limit)) row_fail(r, "worst at %s", where);
}

/* Runs block `kind` of both programs once, compares, then times the
 * device's runs. */
static void run_kind(const IrModule *m, RtProgram *cpu, RtProgram *dev, RtDev *d, const RtFeed *feeds, int nf,
                     StRow *r) {
  char err[1024];
  int bi = ir_block_find(m, r->kind);
  RtRunInfo info = {3, 1, 0.01, 0};   /* step 3, micro 1: dropout's and AdamW's run words are not all zero */
  rt_outputs_clear(cpu);
  rt_outputs_clear(dev);
  if (bi < 0) { row_fail(r, "internal error: no block %s", r->kind); return; }
  if (rt_run_block(cpu, bi, feeds, nf, &info, err, sizeof err) != 0) { row_fail(r, "on the CPU: %s", err); return; }
  double t0 = (ts_now_s() * 1e3);
  if (rt_run_block(dev, bi, feeds, nf, &info, err, sizeof err) != 0) { row_fail(r, "on the device: %s", err); return; }
  r->ms = (ts_now_s() * 1e3) - t0;
  if (rt_program_sync_states(dev, err, sizeof err) != 0) { row_fail(r, "copying the states back: %s", err); return; }
  compare(m, cpu, dev, r->kind, r);
  /* timing: the first run may include one-time work, so time the next */
  int reps = r->ms > 0 ? (int)(ST_BUDGET_MS / r->ms) : ST_MAX_REPS;
  reps = reps < 1 ? 1 : reps > ST_MAX_REPS ? ST_MAX_REPS : reps;
  t0 = (ts_now_s() * 1e3);
  for (int i = 0; i < reps; i++)
    if (rt_run_block(dev, bi, feeds, nf, &info, err, sizeof err) != 0) {
      row_fail(r, "on the device (timing run %d): %s", i + 2, err);
      return;
    }
  if (d->ops->sync(d, RT_STREAM_COMPUTE, err, sizeof err) != 0) { row_fail(r, "device sync: %s", err); return; }
  r->ms = ((ts_now_s() * 1e3) - t0) / reps;
}

/* What a device program is loaded from.  A device of a known arch (a GPU)
 * gets what mrun would give it from a plan: the module compiled by NVRTC
 * for its arch, cubin and PTX (as mcc --target makes them), with the
 * source.  A device of no known arch (the emulator), or a machine without
 * NVRTC, gets no image: the device compiles the source itself. */
typedef struct {
  RtCudaModule cm;
  CgNvrtcOut o;
  RtDevImage img;
  int used;
} StImage;

static int st_image(RtDev *d, const IrModule *m, StImage *si, char *err, size_t errlen) {
  memset(si, 0, sizeof *si);
  char why[256], arch[16];
  if (d->sm <= 0 || !cg_nvrtc_available(why, sizeof why)) return 0;
  if (rt_cuda_module_build(m, &si->cm, err, errlen) != 0) return -1;
  snprintf(arch, sizeof arch, "sm_%d", d->sm);
  if (cg_nvrtc_compile(si->cm.src.p, arch, &si->o, why, sizeof why) != 0)
    return ts_errf(err, errlen, "NVRTC for %s: %s", arch, why);
  si->img = (RtDevImage){si->cm.src.p, si->o.ptx, si->o.cubin, si->o.cubin_len, d->sm};
  si->used = 1;
  return 0;
}

static void st_image_free(StImage *si) {
  rt_cuda_module_free(&si->cm);
  cg_nvrtc_out_free(&si->o);
}

/* The kind a device refusal names ("block NAME, %i = op: no CUDA kernel
 * ..."), among sel[0..n): its position, or -1. */
static int refused_kind(const char *msg, const int *sel, int n) {
  if (!strstr(msg, "no CUDA kernel")) return -1;
  const char *b = strstr(msg, "block ");
  if (!b) return -1;
  b += 6;
  size_t len = strcspn(b, ",");
  for (int i = 0; i < n; i++)
    if (strlen(kinds[sel[i]].name) == len && strncmp(kinds[sel[i]].name, b, len) == 0) return i;
  return -1;
}

/* Kinds sel[0..n) in dtype dt as one module; rows[k] is kind k's row. */
static void run_set(RtDev *d, const char *dt, const int *sel0, int n, StRow *rows) {
  int *sel = ts_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *sel);
  memcpy(sel, sel0, (size_t)n * sizeof *sel);
  char err[2048];
  RtRank rank = rt_rank_single();
  RtExecOpts oc = {.backend = RT_BACKEND_LLVM}, od = {.backend = RT_BACKEND_LLVM, .dev = d};
  while (n > 0) {
    StFeeds fv = {0};
    char *text = module_text(dt, sel, n, &fv);
    IrModule *m = ir_parse_module(text, "<selftest>", err, sizeof err);
    free(text);
    RtProgram *cpu = NULL, *dev = NULL;
    StImage si;
    memset(&si, 0, sizeof si);
    const char *side = "the module";
    if (m && !(cpu = rt_program_new_opts(m, &rank, &oc, err, sizeof err))) side = "the CPU program";
    if (cpu && st_image(d, m, &si, err, sizeof err) != 0) side = "the device's module";
    else if (cpu) {
      od.image = si.used ? &si.img : NULL;
      if (!(dev = rt_program_new_opts(m, &rank, &od, err, sizeof err))) side = "the device program";
    }
    if (dev) {
      RtFeed *f = ts_xcalloc((size_t)(fv.n > 0 ? fv.n : 1), sizeof *f);
      for (int i = 0; i < fv.n; i++) f[i] = (RtFeed){fv.a[i].name, fv.a[i].v};
      for (int i = 0; i < n; i++) run_kind(m, cpu, dev, d, f, fv.n, &rows[sel[i]]);
      free(f);
      n = 0;
    } else {
      int k = refused_kind(err, sel, n);
      if (k >= 0) {   /* drop it and try the rest again */
        row_fail(&rows[sel[k]], "%s", err);
        rows[sel[k]].status = ST_NOKERNEL;
        sel[k] = sel[--n];
      } else if (n > 1) {   /* isolate whichever kind it is */
        for (int i = 0; i < n; i++) run_set(d, dt, &sel[i], 1, rows);
        n = 0;
      } else {
        row_fail(&rows[sel[0]], "%s: %s", side, err);
        n = 0;
      }
    }
    rt_program_free(dev);
    rt_program_free(cpu);
    st_image_free(&si);
    ir_module_free(m);
    feeds_free(&fv);
  }
  free(sel);
}

/* ---- the training step ---- */

/* A byte corpus of pseudo-words (the trainer's byte-level tokens). */
static int write_corpus(const char *path) {
  static const char *const words[] = {"the", "of", "and", "light", "waters", "was", "day", "said", "unto", "earth",
                                      "heaven", "good", "night", "made", "in", "form"};
  StrBuf b = {0};
  uint64_t h = 88172645463325252ull;
  while (b.n < 6000) {
    h ^= h << 13;
    h ^= h >> 7;
    h ^= h << 17;
    sb_puts(&b, words[h % 16]);
    sb_putc(&b, h % 11 == 0 ? '\n' : ' ');
  }
  int rc = ts_write_file(path, b.p, b.n);
  sb_free(&b);
  return rc;
}

/* The training row's model in dtype dt: its IR text parsed and verified.
 * NULL with a message. */
static IrModule *train_module(const RtSelftestTrain *tm, IrDtype dt, char *err, size_t errlen) {
  const char *text = dt == IR_F64 ? tm->f64 : tm->f32;
  char why[1024];
  IrModule *m = text ? ir_parse_module(text, tm->name, why, sizeof why) : NULL;
  if (!text) snprintf(why, sizeof why, "no %s module", ir_dtype_name(dt));
  else if (m && ir_verify(m, why, sizeof why) != 0) {
    ir_module_free(m);
    m = NULL;
  }
  if (!m) ts_errf(err, errlen, "the training model %s: %s", tm->name, why);
  return m;
}

/* Trains gpt 2 steps on the CPU and on d; compares losses and parameters. */
static void train_row(RtDev *d, const RtSelftestTrain *tm, const char *dir, IrDtype dt, StRow *r) {
  char err[2048], corpus[1100], pc[1100], pd[1100];   /* dir is at most 1024 bytes */
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
  snprintf(pc, sizeof pc, "%s/cpu_%s.params", dir, r->dt);
  snprintf(pd, sizeof pd, "%s/dev_%s.params", dir, r->dt);
  if (access(corpus, R_OK) != 0 && write_corpus(corpus) != 0) {
    row_fail(r, "cannot write %s: %s", corpus, strerror(errno));
    return;
  }
  IrModule *m = train_module(tm, dt, err, sizeof err);
  if (!m) { row_fail(r, "%s", err); return; }
  m->train.steps = 2;
  StImage si;
  if (st_image(d, m, &si, err, sizeof err) != 0) { row_fail(r, "the device's module: %s", err); goto out; }
  RtTrainResult rc_, rd_;
  RtTrainOpts to = {.data_path = corpus, .quiet = 1, .save_params_path = pc};
  RtExecOpts oc = {.backend = RT_BACKEND_LLVM};
  RtExecOpts od = {.backend = RT_BACKEND_LLVM, .dev = d, .image = si.used ? &si.img : NULL};
  rt_exec_set_default(&oc);
  if (rt_train(m, &to, &rc_, err, sizeof err) != 0) { row_fail(r, "training on the CPU: %s", err); goto out; }
  rt_exec_set_default(&od);
  to.save_params_path = pd;
  double t0 = (ts_now_s() * 1e3);
  if (rt_train(m, &to, &rd_, err, sizeof err) != 0) { row_fail(r, "training on the device: %s", err); goto out; }
  r->ms = (ts_now_s() * 1e3) - t0;
  /* the worst of the two losses and the parameters */
  char where[256];
  double e0 = rel_err(rd_.first_loss, rc_.first_loss, ST_FLOOR), e1 = rel_err(rd_.last_loss, rc_.last_loss, ST_FLOOR);
  r->err = fmax(e0, e1);
  snprintf(where, sizeof where, "the loss: device %.9g -> %.9g, cpu %.9g -> %.9g", rd_.first_loss, rd_.last_loss,
           rc_.first_loss, rc_.last_loss);
  RtParams *a = rt_params_read(pd, err, sizeof err), *b = a ? rt_params_read(pc, err, sizeof err) : NULL;
  char wp[200] = "";
  double ep = b ? rt_params_max_rel_diff(a, b, wp, sizeof wp) : -1;
  if (!b) row_fail(r, "reading the parameters: %s", err);
  else if (ep < 0) row_fail(r, "the parameters differ in names or shapes: %s", wp);
  else {
    r->measured = 1;
    if (!(ep <= r->err)) {   /* NaN too */
      r->err = ep;
      snprintf(where, sizeof where, "parameter %s after 2 steps", wp);
    }
    if (!(r->err <= r->limit)) row_fail(r, "worst at %s", where);
  }
  rt_params_free(a);
  rt_params_free(b);
out:
  unlink(pc);
  unlink(pd);
  st_image_free(&si);
  ir_module_free(m);
}

/* ---- the table ---- */

/* Whether TS_SELFTEST_ONLY selects `name`, a kind ("train": the
 * training step) or a dtype (dtype != 0).  The variable lists names,
 * comma-separated; a category (kinds, dtypes) none of whose names is
 * listed is not restricted: "f32" runs every kind in f32 only. */
static int selected(const char *name, int dtype) {
  const char *e = getenv("TS_SELFTEST_ONLY");
  if (!e || !*e) return 1;
  size_t nl = strlen(name);
  int any = 0;
  for (const char *s = e; *s;) {
    size_t l = strcspn(s, ",");
    int is_dtype = (l == 3 && (strncmp(s, "f32", 3) == 0 || strncmp(s, "f64", 3) == 0));
    if (is_dtype == (dtype != 0)) {
      any = 1;
      if (l == nl && strncmp(s, name, l) == 0) return 1;
    }
    s += l + (s[l] == ',');
  }
  return !any;
}

static void print_row(FILE *out, const StRow *r) {
  char e[32], ms[32];
  if (!r->measured) snprintf(e, sizeof e, "-");
  else snprintf(e, sizeof e, "%.2e", r->err);
  if (r->ms > 0) snprintf(ms, sizeof ms, "%.3f", r->ms);
  else snprintf(ms, sizeof ms, "-");
  const char *res = r->status == ST_PASS ? "pass" : r->status == ST_FAIL ? "FAIL" : "no kernel";
  fprintf(out, "%-20s %-5s %10s %8.0e %12s  %s\n", r->kind, r->dt, e, r->limit, ms, res);
  if (r->status != ST_PASS) fprintf(out, "    %s\n", r->note);
}

int rt_selftest(RtDev *dev, const RtSelftestTrain *train, FILE *out, int *failures, char *err, size_t errlen) {
  *failures = 0;
  const char *tmp = getenv("TMPDIR");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/ts_selftest_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return ts_errf(err, errlen, "cannot create a directory like %s: %s", dir, strerror(errno));
  RtExecOpts saved = rt_exec_default();
  fprintf(out, "self-test on %s: every kernel kind and a 2-step training run of gpt (toy size), device vs the "
               "CPU (LLVM backend)\n", dev->label);
  fprintf(out, "error: max over state elements of |device - cpu| / max(|cpu|, 1e-3) (f32: max(|cpu|, the state's largest |cpu|)); ms: per run of the block "
               "(training: both steps, setup included)\n");
  const char *only = getenv("TS_SELFTEST_ONLY");
  if (only && *only) fprintf(out, "only the rows TS_SELFTEST_ONLY=%s selects\n", only);
  fprintf(out, "%-20s %-5s %10s %8s %12s  %s\n", "kind", "dtype", "max error", "limit", "device ms", "result");
  static const struct { const char *name; IrDtype t; double limit; } dts[] = {{"f32", IR_F32, 1e-5},
                                                                               {"f64", IR_F64, 1e-10}};
  int nk = 0, nrows = 0;
  for (int di = 0; di < 2; di++) {
    if (!selected(dts[di].name, 1)) continue;
    StRow rows[NKINDS];
    int sel[NKINDS];
    memset(rows, 0, sizeof rows);
    int n = 0;
    for (int k = 0; k < NKINDS; k++) {
      rows[k] = (StRow){.kind = kinds[k].name, .dt = dts[di].name, .limit = dts[di].limit, .status = ST_PASS};
      if (selected(kinds[k].name, 0)) sel[n++] = k;
    }
    run_set(dev, dts[di].name, sel, n, rows);
    for (int i = 0; i < n; i++) {
      int k = sel[i];
      print_row(out, &rows[k]);
      *failures += rows[k].status == ST_FAIL;
      nk += rows[k].status == ST_NOKERNEL;
      nrows++;
    }
    fflush(out);
  }
  for (int di = 0; di < 2 && train && selected("train", 0); di++) {
    if (!selected(dts[di].name, 1)) continue;
    StRow r = {.kind = "train gpt 2 steps", .dt = dts[di].name, .limit = dts[di].limit, .status = ST_PASS};
    train_row(dev, train, dir, dts[di].t, &r);
    print_row(out, &r);
    *failures += r.status == ST_FAIL;
    nrows++;
    fflush(out);
  }
  rt_exec_set_default(&saved);
  char corpus[1100];
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
  unlink(corpus);
  rmdir(dir);
  fprintf(out, "self-test: %d of %d rows pass, %d FAIL", nrows - *failures - nk, nrows, *failures);
  if (nk) fprintf(out, ", %d without a CUDA kernel yet (mcc --target refuses plans using them)", nk);
  fprintf(out, "\n");
  return 0;
}
