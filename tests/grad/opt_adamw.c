/* opt_adamw.c - pass_autodiff + pass_optimizer on a one-parameter model,
 * executed by the runtime for two steps of two micro-batches each, against
 * AdamW computed by hand:
 *   loss(W; X) = sum(W * X) + 0.5 * sumsq(W)      so  dloss/dW = X + W
 *   g = mean over the step's micro-batches of (X_k + W)
 *   norm = |g|, coef = min(1, clip / (norm + 1e-6)) (1 without clipping)
 *   m = b1 m + (1 - b1) coef g,  v = b2 v + (1 - b2) (coef g)^2
 *   W -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd W),  t = step + 1
 * with and without clipping, with and without weight decay (and with decay
 * configured but the param flagged nodecay).  Also checks the reported
 * grad_norm, that the update zeroes the gradient, and the update block's
 * structure (states, attrs, verify, text round trip). */
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/exec/rt.h"
#include <math.h>

#define NX 6            /* W : f64[2, 3] */
#define NMICRO 2
#define STEPS 2

typedef struct { const char *name; double clip, wd; int nodecay; } Config;

static int fails;
static void check(int ok, const Config *c, const char *what, double got, double want) {
  if (ok) return;
  printf("FAIL %s: %s = %.17g, expected %.17g\n", c->name, what, got, want);
  fails++;
}
static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 * (1 + fabs(b)); }

/* The forward module: loss = sum(W * x) + 0.5 * sumsq(W). */
static IrModule *build(const Config *c) {
  IrModule *m = ir_module_new("adamw");
  IrTrain *t = &m->train;
  t->precision = IR_F64;
  t->beta1 = 0.8;
  t->beta2 = 0.9;
  t->eps = 1e-3;           /* large enough to matter in the check */
  t->weight_decay = c->wd;
  t->clip_grad = c->clip;
  t->global_batch = NMICRO;
  t->micro_batch = 1;
  IrType ty = {IR_F64, 2, {2, 3}, {NULL, NULL}};
  IrState s = {0};
  s.name = "w";
  s.type = ty;
  s.kind = IR_STATE_PARAM;
  s.init = IR_INIT_NORMAL;
  s.init_b = 1.0;
  s.of = -1;
  s.flags = c->nodecay ? IR_STATE_NODECAY : 0;
  int ws = ir_state_add(m, &s);
  int b = ir_block_add(m, "forward");
  char err[256];
  int64_t ia_w[1] = {ws};
  int w = ir_emit(m, b, IR_OP_STATE, NULL, 0, ia_w, NULL, NULL, &ty, err, sizeof err);
  int x = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &ty, err, sizeof err);
  int wx = ir_emit(m, b, IR_OP_MUL, (int[]){w, x}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  IrType flat = {IR_F64, 1, {NX}, {NULL}};
  int f = ir_emit(m, b, IR_OP_RESHAPE, &wx, 1, NULL, NULL, NULL, &flat, err, sizeof err);
  int s1 = ir_emit(m, b, IR_OP_SUM, &f, 1, (int64_t[]){0, 0}, NULL, NULL, NULL, err, sizeof err);
  int sq = ir_emit(m, b, IR_OP_SUMSQ, &w, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  int hs = ir_emit(m, b, IR_OP_MULS, &sq, 1, NULL, (double[]){0.5}, NULL, NULL, err, sizeof err);
  int loss = ir_emit(m, b, IR_OP_ADD, (int[]){s1, hs}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  if (ir_emit(m, b, IR_OP_OUTPUT, &loss, 1, NULL, NULL, "loss", NULL, err, sizeof err) < 0) {
    printf("FAIL building the module: %s\n", err);
    exit(1);
  }
  return m;
}

/* The update block: one adamw with the right states and attrs, grad_norm
 * reported, the grad zeroed; verifies and round-trips as text. */
static void check_structure(const Config *c, const IrModule *m) {
  int w = ir_state_find(m, "w"), g = ir_state_find(m, "grad.w");
  int am = ir_state_find(m, "adam_m.w"), av = ir_state_find(m, "adam_v.w");
  int ub = ir_block_find(m, "update");
  if (w < 0 || g < 0 || am < 0 || av < 0 || ub < 0) { printf("FAIL %s: states or update block missing\n", c->name); fails++; return; }
  check(m->states.a[am].kind == IR_STATE_ADAM_M && m->states.a[am].of == w, c, "adam_m kind/of", 0, 0);
  check(m->states.a[av].kind == IR_STATE_ADAM_V && m->states.a[av].of == w, c, "adam_v kind/of", 0, 0);
  const IrBlock *b = &m->blocks.a[ub];
  int adamw = 0, zero = 0, out = 0;
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->op == IR_OP_ADAMW) {
      adamw++;
      check(n->ia[0] == w && n->ia[1] == am && n->ia[2] == av, c, "adamw states", 0, 0);
      const IrNode *gn = &b->nodes[n->in[1]];
      check(gn->op == IR_OP_STATE && gn->ia[0] == g, c, "adamw grad operand is @grad", 0, 0);
      check(n->fa[0] == m->train.beta1 && n->fa[1] == m->train.beta2 && n->fa[2] == m->train.eps, c, "adamw betas/eps", 0, 0);
      check(n->fa[3] == (c->nodecay ? 0.0 : c->wd), c, "adamw wd", n->fa[3], c->nodecay ? 0.0 : c->wd);
    }
    if (n->op == IR_OP_ZERO) { zero++; check(n->ia[0] == g, c, "zero state", (double)n->ia[0], g); }
    if (n->op == IR_OP_OUTPUT) out += n->sa == ts_intern("grad_norm");
    if (n->op == IR_OP_CLIP_COEF) check(c->clip > 0 && n->fa[0] == c->clip, c, "clip_coef max", n->fa[0], c->clip);
    if (n->type.dtype != IR_VOID) check(n->type.dtype == IR_F64, c, "update dtype f64", n->type.dtype, IR_F64);
  }
  check(adamw == 1 && zero == 1 && out == 1, c, "adamw/zero/grad_norm count", adamw * 100 + zero * 10 + out, 111);
  char err[512];
  if (ir_verify(m, err, sizeof err) != 0) { printf("FAIL %s: verify: %s\n", c->name, err); fails++; }
  StrBuf a = {0}, a2 = {0};
  ir_print_module(m, &a);
  sb_putc(&a, 0);
  IrModule *re = ir_parse_module(a.p, "<optimizer>", err, sizeof err);
  if (!re) { printf("FAIL %s: parse: %s\n", c->name, err); fails++; }
  else {
    ir_print_module(re, &a2);
    sb_putc(&a2, 0);
    check(strcmp(a.p, a2.p) == 0, c, "print/parse/print identical", 0, 0);
    ir_module_free(re);
  }
  sb_free(&a);
  sb_free(&a2);
}

static void run_config(const Config *c) {
  int fails0 = fails;
  IrModule *m = build(c);
  PassCtx cx;
  memset(&cx, 0, sizeof cx);
  arena_init(&cx.scratch);
  if (pass_autodiff(m, &cx) != 0 || pass_optimizer(m, &cx) != 0) {
    printf("FAIL %s: %s\n", c->name, cx.err);
    fails++;
    goto out;
  }
  check_structure(c, m);
  char err[512];
  RtProgram *p = rt_program_new(m, err, sizeof err);
  if (!p) { printf("FAIL %s: %s\n", c->name, err); fails++; goto out; }
  int ws = ir_state_find(m, "w"), gs = ir_state_find(m, "grad.w");
  int ms = ir_state_find(m, "adam_m.w"), vs = ir_state_find(m, "adam_v.w");
  int mb = ir_block_find(m, "micro"), ub = ir_block_find(m, "update");
  double *W = rt_state_data(p, ws), *G = rt_state_data(p, gs), *M = rt_state_data(p, ms), *V = rt_state_data(p, vs);
  double w[NX], mm[NX] = {0}, vv[NX] = {0}, xs[STEPS][NMICRO][NX];
  for (int i = 0; i < NX; i++) w[i] = W[i] = 0.3 * (i - 2.5);
  for (int s = 0; s < STEPS; s++)
    for (int k = 0; k < NMICRO; k++)
      for (int i = 0; i < NX; i++) xs[s][k][i] = sin(1.0 + i + 7.0 * k + 13.0 * s) * (1.5 + s);
  const IrTrain *t = &m->train;
  double lr = 0.05;
  for (int s = 0; s < STEPS; s++) {
    RtRunInfo info = {s, 0, lr, 0};
    for (int k = 0; k < NMICRO; k++) {
      RtFeed feed = {"x", xs[s][k]};
      info.micro = k;
      if (rt_run_block(p, mb, &feed, 1, &info, err, sizeof err) != 0) { printf("FAIL %s: %s\n", c->name, err); fails++; goto free_p; }
    }
    double g[NX], nrm2 = 0;
    for (int i = 0; i < NX; i++) {
      g[i] = w[i];
      for (int k = 0; k < NMICRO; k++) g[i] += xs[s][k][i] / NMICRO;
      nrm2 += g[i] * g[i];
      check(close_to(G[i], g[i]), c, "accumulated grad", G[i], g[i]);
    }
    if (rt_run_block(p, ub, NULL, 0, &info, err, sizeof err) != 0) { printf("FAIL %s: %s\n", c->name, err); fails++; goto free_p; }
    double norm = sqrt(nrm2), got_norm = NAN;
    rt_output(p, "grad_norm", &got_norm);
    check(close_to(got_norm, norm), c, "grad_norm", got_norm, norm);
    double coef = 1.0;
    if (c->clip > 0 && c->clip / (norm + 1e-6) < 1) coef = c->clip / (norm + 1e-6);
    if (c->clip > 0 && s == 0 && coef == 1.0) { printf("FAIL %s: the test's clip does not bind\n", c->name); fails++; }
    double wd = c->nodecay ? 0.0 : c->wd, tt = s + 1;
    for (int i = 0; i < NX; i++) {
      double gi = coef * g[i];
      mm[i] = t->beta1 * mm[i] + (1 - t->beta1) * gi;
      vv[i] = t->beta2 * vv[i] + (1 - t->beta2) * gi * gi;
      double mh = mm[i] / (1 - pow(t->beta1, tt)), vh = vv[i] / (1 - pow(t->beta2, tt));
      w[i] = w[i] - lr * (mh / (sqrt(vh) + t->eps) + wd * w[i]);
      check(close_to(M[i], mm[i]), c, "adam_m", M[i], mm[i]);
      check(close_to(V[i], vv[i]), c, "adam_v", V[i], vv[i]);
      check(close_to(W[i], w[i]), c, "param", W[i], w[i]);
      check(G[i] == 0.0, c, "grad zeroed after update", G[i], 0.0);
    }
  }
  if (fails == fails0) printf("ok   %s\n", c->name);
free_p:
  rt_program_free(p);
out:
  arena_free(&cx.scratch);
  ir_module_free(m);
}

int main(void) {
  static const Config configs[] = {
    {"no clip, no decay", 0.0, 0.0, 0},
    {"clip, no decay", 0.5, 0.0, 0},
    {"no clip, decay", 0.0, 0.1, 0},
    {"clip, decay", 0.5, 0.1, 0},
    {"clip, decay, param nodecay", 0.5, 0.1, 1},
  };
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) run_config(&configs[i]);
  printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
  return fails ? 1 : 0;
}
