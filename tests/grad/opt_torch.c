/* opt_torch.c - the optimizers other than AdamW (sgd, lion, muon; docs/cli.md
 * "Optimizers") through pass_autodiff + pass_optimizer and the runtime, for
 * a few steps, written out for opt_torch.py to replay in PyTorch (f64:
 * torch.optim.SGD, Lion and Muon written out from their papers' reference
 * code, torch.optim.AdamW for Muon's AdamW group).
 *
 *   opt_torch OUT_DIR      writes OUT_DIR/<config>.txt for every config
 *
 * The model has five parameters with gradients that depend on them:
 *   W1 [4, 6], W2 [6, 3]  hidden matrices (Muon's; W2 tall: transposed NS)
 *   H [3, 5]              the head: the last matmul before the loss (Muon: AdamW by its role)
 *   b [6]                 a bias, flagged nodecay (Muon: AdamW, not a matmul's)
 *   E [5, 4]              an embedding table (Muon: AdamW by its role)
 *   loss = sum((A W1 W2 H) Y) + sum(b xb) + sum(E[ids] Z) + 0.5 sum of squares of all
 * (A [3, 4], Y [3, 5], xb [6], Z [3, 4], ids: each micro batch's inputs).
 * Each file holds the config,
 * the initial parameters, every micro batch's inputs, the lr of each step
 * and the parameters after each step.  Also checks here that the states
 * are the rule's (momentum.<p>, lion_m.<p>, muon_m.<p> / adam_m.<p>), the
 * module verifies and round-trips as text. */
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/exec/rt.h"
#include <math.h>

#define NMICRO 2
#define STEPS 4
#define NIDS 3

typedef struct {
  const char *name;
  IrOptimizer opt;
  double clip, wd, momentum, b1, b2, muon_momentum;
  int nesterov, ns_steps;
  double adamw_lr_ratio;   /* muon: the AdamW group's lr over Muon's (--muon-adamw-lr); 0: the same lr */
} Config;

static int fails;
#define FAIL(...) do { printf("FAIL "); printf(__VA_ARGS__); printf("\n"); fails++; } while (0)

static int emit(IrModule *m, int b, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
                const char *sa, const IrType *t) {
  char err[256];
  int id = ir_emit(m, b, op, in, nin, ia, fa, sa, t, err, sizeof err);
  if (id < 0) {
    printf("FAIL building the module: %s\n", err);
    exit(1);
  }
  return id;
}
static int add_param(IrModule *m, const char *name, IrType t, unsigned flags) {
  IrState s = {0};
  s.name = name;
  s.type = t;
  s.kind = IR_STATE_PARAM;
  s.init = IR_INIT_ZEROS;
  s.of = -1;
  s.flags = flags;
  return ir_state_add(m, &s);
}
/* sum of all elements of x (any rank) as a scalar */
static int sum_all(IrModule *m, int b, int x, int64_t n) {
  IrType flat = {IR_F64, 1, {n}, {NULL}};
  int f = emit(m, b, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &flat);
  return emit(m, b, IR_OP_SUM, &f, 1, (int64_t[]){0, 0}, NULL, NULL, NULL);
}

static const struct { const char *name; int rank; int64_t d0, d1; } P[] = {
    {"W1", 2, 4, 6}, {"W2", 2, 6, 3}, {"H", 2, 3, 5}, {"b", 1, 6, 0}, {"E", 2, 5, 4}};
enum { NP = 5, NX = 4 };
static const struct { const char *name; int rank; int64_t d0, d1; } X[] = {
    {"A", 2, 3, 4}, {"Y", 2, 3, 5}, {"xb", 1, 6, 0}, {"Z", 2, NIDS, 4}};
static int64_t numel(int rank, int64_t d0, int64_t d1) { return rank == 1 ? d0 : d0 * d1; }

static IrModule *build(const Config *c) {
  IrModule *m = ir_module_new("opt_torch");
  IrTrain *t = &m->train;
  t->precision = IR_F64;
  t->optimizer = c->opt;
  t->beta1 = c->b1;
  t->beta2 = c->b2;
  t->eps = 1e-8;
  t->weight_decay = c->wd;
  t->clip_grad = c->clip;
  t->momentum = c->momentum;
  t->nesterov = c->nesterov;
  t->muon_momentum = c->muon_momentum;
  t->muon_ns_steps = c->ns_steps;
  t->lr = 0.02;   /* the base of the per-step lrs below: muon_adamw_lr / lr is the AdamW group's ratio */
  t->muon_adamw_lr = c->adamw_lr_ratio * t->lr;
  t->global_batch = NMICRO;
  t->micro_batch = 1;
  int b = ir_block_add(m, "forward");
  int w[NP], x[NX], sq = -1;
  for (int k = 0; k < NP; k++) {
    IrType pt = {IR_F64, P[k].rank, {P[k].d0, P[k].d1}, {NULL, NULL}};
    int s = add_param(m, P[k].name, pt, k == 3 ? IR_STATE_NODECAY : 0);
    w[k] = emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){s}, NULL, NULL, &pt);
    int q = emit(m, b, IR_OP_SUMSQ, &w[k], 1, NULL, NULL, NULL, NULL);
    sq = sq < 0 ? q : emit(m, b, IR_OP_ADD, (int[]){sq, q}, 2, NULL, NULL, NULL, NULL);
  }
  for (int k = 0; k < NX; k++) {
    IrType xt = {IR_F64, X[k].rank, {X[k].d0, X[k].d1}, {NULL, NULL}};
    x[k] = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, X[k].name, &xt);
  }
  /* A W1 W2 H [3, 5] against Y */
  int h = w[0];
  for (int k = 0; k < 3; k++) h = emit(m, b, IR_OP_MATMUL, (int[]){k ? h : x[0], w[k]}, 2, (int64_t[]){0, 0}, NULL, NULL, NULL);
  int prod = emit(m, b, IR_OP_MUL, (int[]){h, x[1]}, 2, NULL, NULL, NULL, NULL);
  int loss = sum_all(m, b, prod, 15);
  prod = emit(m, b, IR_OP_MUL, (int[]){w[3], x[2]}, 2, NULL, NULL, NULL, NULL);
  loss = emit(m, b, IR_OP_ADD, (int[]){loss, sum_all(m, b, prod, 6)}, 2, NULL, NULL, NULL, NULL);
  IrType it = {IR_I32, 1, {NIDS}, {NULL}};   /* the embedding: rows E[ids] against Z */
  int ids = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "ids", &it);
  int rows = emit(m, b, IR_OP_EMBEDDING, (int[]){w[4], ids}, 2, NULL, NULL, NULL, NULL);
  prod = emit(m, b, IR_OP_MUL, (int[]){rows, x[3]}, 2, NULL, NULL, NULL, NULL);
  loss = emit(m, b, IR_OP_ADD, (int[]){loss, sum_all(m, b, prod, NIDS * 4)}, 2, NULL, NULL, NULL, NULL);
  int hs = emit(m, b, IR_OP_MULS, &sq, 1, NULL, (double[]){0.5}, NULL, NULL);
  loss = emit(m, b, IR_OP_ADD, (int[]){loss, hs}, 2, NULL, NULL, NULL, NULL);
  emit(m, b, IR_OP_OUTPUT, &loss, 1, NULL, NULL, "loss", NULL);
  return m;
}

/* The states the rule gives each parameter. */
static void check_states(const Config *c, const IrModule *m) {
  for (int k = 0; k < NP; k++) {
    char want[64];
    const char *prefix = c->opt == IR_OPT_SGD ? "momentum" : c->opt == IR_OPT_LION ? "lion_m"
                         : k < 2 ? "muon_m" : "adam_m";
    snprintf(want, sizeof want, "%s.%s", prefix, P[k].name);
    if (ir_state_find(m, want) < 0) FAIL("%s: no state %s (parameter %s's rule)", c->name, want, P[k].name);
  }
  char err[512];
  if (ir_verify(m, err, sizeof err) != 0 || ir_verify_training(m, err, sizeof err) != 0)
    FAIL("%s: verify: %s", c->name, err);
  StrBuf a = {0}, a2 = {0};
  ir_print_module(m, &a);
  sb_putc(&a, 0);
  IrModule *re = ir_parse_module(a.p, "<optimizer>", err, sizeof err);
  if (!re) FAIL("%s: parse: %s", c->name, err);
  else {
    ir_print_module(re, &a2);
    sb_putc(&a2, 0);
    if (strcmp(a.p, a2.p) != 0) FAIL("%s: print/parse/print differ", c->name);
    if (re->train.optimizer != c->opt) FAIL("%s: the optimizer did not round-trip", c->name);
    ir_module_free(re);
  }
  sb_free(&a);
  sb_free(&a2);
}

static void put_vec(FILE *f, const char *tag, const double *v, int64_t n) {
  fprintf(f, "%s", tag);
  for (int64_t i = 0; i < n; i++) fprintf(f, " %.17g", v[i]);
  fprintf(f, "\n");
}

static void run_config(const Config *c, const char *dir) {
  IrModule *m = build(c);
  PassCtx cx;
  pass_ctx_init(&cx);
  char err[512];
  RtProgram *p = NULL;
  FILE *f = NULL;
  if (pass_autodiff(m, &cx) != 0 || pass_optimizer(m, &cx) != 0) { FAIL("%s: %s", c->name, cx.err); goto out; }
  check_states(c, m);
  if (!(p = rt_program_new(m, err, sizeof err))) { FAIL("%s: %s", c->name, err); goto out; }
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.txt", dir, c->name);
  if (!(f = fopen(path, "w"))) { FAIL("cannot write %s", path); goto out; }
  fprintf(f, "config opt=%s clip=%.17g wd=%.17g momentum=%.17g nesterov=%d b1=%.17g b2=%.17g eps=%.17g "
          "muon_momentum=%.17g ns_steps=%d nmicro=%d steps=%d adamw_lr_ratio=%.17g\n", ir_optimizer_name(c->opt),
          c->clip, c->wd, c->momentum, c->nesterov, c->b1, c->b2, m->train.eps, c->muon_momentum, c->ns_steps, NMICRO,
          STEPS, c->adamw_lr_ratio);
  double *W[NP];
  for (int k = 0; k < NP; k++) {
    int64_t n = numel(P[k].rank, P[k].d0, P[k].d1);
    W[k] = rt_state_data(p, ir_state_find(m, P[k].name));
    for (int64_t i = 0; i < n; i++) W[k][i] = 0.4 * sin(0.7 * (double)i + 1.3 * k) + 0.05 * k;
    char tag[64];
    snprintf(tag, sizeof tag, "param %s %d %lld %lld", P[k].name, P[k].rank, (long long)P[k].d0, (long long)P[k].d1);
    put_vec(f, tag, W[k], n);
  }
  int mb = ir_block_find(m, "micro"), ub = ir_block_find(m, "update");
  double xs[NX][4 * 6];
  int32_t ids[NIDS];
  for (int s = 0; s < STEPS; s++) {
    double lr = 0.02 * (1.0 + 0.25 * s);   /* a different lr every step */
    fprintf(f, "lr %d %.17g\n", s, lr);
    RtRunInfo info = {s, 0, lr, 0};
    for (int mi = 0; mi < NMICRO; mi++) {
      RtFeed feeds[NX + 1];
      for (int k = 0; k < NX; k++) {
        int64_t n = numel(X[k].rank, X[k].d0, X[k].d1);
        for (int64_t i = 0; i < n; i++) xs[k][i] = sin(1.0 + (double)i + 7.0 * mi + 13.0 * s + 3.0 * k) * (1.5 + s);
        feeds[k].name = X[k].name;
        feeds[k].data = xs[k];
        char tag[64];
        snprintf(tag, sizeof tag, "input %d %d %s", s, mi, X[k].name);
        put_vec(f, tag, xs[k], n);
      }
      double idv[NIDS];
      for (int i = 0; i < NIDS; i++) idv[i] = ids[i] = (int32_t)((i * 2 + s + mi) % 5);
      feeds[NX].name = "ids";
      feeds[NX].data = ids;
      char tag[64];
      snprintf(tag, sizeof tag, "input %d %d ids", s, mi);
      put_vec(f, tag, idv, NIDS);
      info.micro = mi;
      if (rt_run_block(p, mb, feeds, NX + 1, &info, err, sizeof err) != 0) { FAIL("%s: %s", c->name, err); goto out; }
    }
    if (rt_run_block(p, ub, NULL, 0, &info, err, sizeof err) != 0) { FAIL("%s: %s", c->name, err); goto out; }
    double gn = NAN;
    rt_output(p, "grad_norm", &gn);
    fprintf(f, "grad_norm %d %.17g\n", s, gn);
    for (int k = 0; k < NP; k++) {
      char tag[64];
      snprintf(tag, sizeof tag, "after %d %s", s, P[k].name);
      put_vec(f, tag, W[k], numel(P[k].rank, P[k].d0, P[k].d1));
    }
  }
  printf("wrote %s\n", path);
out:
  if (f) fclose(f);
  if (p) rt_program_free(p);
  pass_ctx_free(&cx);
  ir_module_free(m);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: opt_torch OUT_DIR\n");
    return 2;
  }
  /* name, optimizer, clip, wd, momentum, b1, b2, muon momentum, nesterov, ns steps, AdamW-group lr ratio */
  static const Config configs[] = {
      {"sgd", IR_OPT_SGD, 0.0, 0.0, 0.9, 0.9, 0.95, 0.95, 0, 5, 0},
      {"sgd_nesterov_decay_clip", IR_OPT_SGD, 2.0, 0.1, 0.8, 0.9, 0.95, 0.95, 1, 5, 0},
      {"sgd_plain", IR_OPT_SGD, 0.0, 0.05, 0.0, 0.9, 0.95, 0.95, 0, 5, 0},
      {"lion", IR_OPT_LION, 0.0, 0.0, 0.9, 0.9, 0.99, 0.95, 0, 5, 0},
      {"lion_decay_clip", IR_OPT_LION, 2.0, 0.3, 0.9, 0.8, 0.95, 0.95, 0, 5, 0},
      {"muon", IR_OPT_MUON, 2.0, 0.1, 0.9, 0.9, 0.95, 0.95, 1, 5, 0},
      {"muon_plain_momentum", IR_OPT_MUON, 0.0, 0.0, 0.9, 0.8, 0.9, 0.9, 0, 3, 0},
      /* the AdamW group (b, E) at a quarter of Muon's lr, every step (--muon-adamw-lr) */
      {"muon_adamw_lr", IR_OPT_MUON, 2.0, 0.1, 0.9, 0.9, 0.95, 0.95, 1, 5, 0.25},
  };
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) run_config(&configs[i], argv[1]);
  printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
  return fails ? 1 : 0;
}
