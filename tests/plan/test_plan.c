/* test_plan.c - the plan file (plan/plan.c): binary and text round
 * trips of a hand-made module, the refusals of plan_read (bad magic,
 * truncation at many cut points, checksum, newer version), a bogus huge
 * count, and a fuzz loop over corrupted payloads with valid checksums
 * (must fail cleanly or decode to something that re-encodes; ASan-clean).
 *
 * usage: test_plan TMPDIR */
#include "ir/ir.h"
#include "plan/plan.h"
#include <math.h>
#include <sys/stat.h>
#include "../check.h"

static const char *tmpdir;

/* A module exercising every part of the format: consts of both kinds,
 * non-default train/parallel, states of every kind with dim names, string
 * attrs needing escapes, a list attr (perm), a -0.0 float attr, effects
 * with state refs, two blocks.
 *   micro: x[batch:2, in:4] @ w[in:4, out:3] -> permute -> muls -> sumsq -> output,
 *          and x^T (x w) accumulated into the gradient of w
 *   update:  adamw on w, zero grad. */
static IrModule *make_module(void) {
  IrModule *m = ir_module_new("tiny");
  IrConst c1 = {ts_intern("vocab"), 0, 8, 0.0}, c2 = {ts_intern("dropout"), 1, 0, 0.25};
  VEC_PUSH(m->consts, c1);
  VEC_PUSH(m->consts, c2);
  m->train.lr = 1e-3;
  m->train.schedule = IR_SCHED_COSINE;
  m->train.warmup = 3;
  m->train.clip_grad = 1.0;
  m->train.global_batch = m->train.micro_batch = 2;   /* the input's batch dim (ir_verify_training checks it) */
  m->train.seed = 0xfedcba9876543210ull;
  m->par = (IrParallel){.tp = 1, .pp = 1, .cp = 1, .ep = 1, .zero = 1};

  IrType tw = {IR_F32, 2, {4, 3}, {ts_intern("in"), ts_intern("out")}};
  IrState w = {"w.in_proj", tw, IR_STATE_PARAM, IR_INIT_NORMAL, 0.0, 0.02, -1, 0, {{0}, 0, 0}, {0}};
  int sw = ir_state_add(m, &w);
  IrType tb = {IR_F32, 1, {3}, {NULL}};
  IrState b = {"b", tb, IR_STATE_PARAM, IR_INIT_ONES, 0, 0, -1, IR_STATE_NODECAY, {{0}, 0, 0}, {0}};
  ir_state_add(m, &b);
  IrState g = {"grad.w.in_proj", tw, IR_STATE_GRAD, IR_INIT_ZEROS, 0, 0, sw, 0, {{0}, 0, 0}, {0}};
  int sg = ir_state_add(m, &g);
  IrState am = {"adam_m.w.in_proj", tw, IR_STATE_ADAM_M, IR_INIT_ZEROS, 0, 0, sw, 0, {{0}, 0, 0}, {0}};
  int sm = ir_state_add(m, &am);
  IrState av = {"adam_v.w.in_proj", tw, IR_STATE_ADAM_V, IR_INIT_ZEROS, 0, 0, sw, 0, {{0}, 0, 0}, {0}};
  int sv = ir_state_add(m, &av);

  char err[512];
  int fb = ir_block_add(m, "micro");
  IrType tx = {IR_F32, 2, {2, 4}, {ts_intern("batch"), ts_intern("in")}};
  int x = ir_emit(m, fb, IR_OP_INPUT, NULL, 0, NULL, NULL, "x \"quoted\" \\ #not a comment", &tx, err, sizeof err);
  int64_t ia_w[1] = {sw};
  int ws = ir_emit(m, fb, IR_OP_STATE, NULL, 0, ia_w, NULL, NULL, &tw, err, sizeof err);
  int in2[2] = {x, ws};
  int mm = ir_emit(m, fb, IR_OP_MATMUL, in2, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  int64_t perm[2] = {1, 0};
  int pm = ir_emit(m, fb, IR_OP_PERMUTE, &mm, 1, perm, NULL, NULL, NULL, err, sizeof err);
  double negzero[1] = {-0.0};
  int ms = ir_emit(m, fb, IR_OP_MULS, &pm, 1, NULL, negzero, NULL, NULL, err, sizeof err);
  int sq = ir_emit(m, fb, IR_OP_SUMSQ, &ms, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  int o = ir_emit(m, fb, IR_OP_OUTPUT, &sq, 1, NULL, NULL, "loss", NULL, err, sizeof err);
  /* a gradient for @w.in_proj, x^T (x w): the module is a complete training
   * module (ir_verify_training) */
  int in_g[2] = {x, mm};
  int64_t ta[2] = {1, 0};
  int gw = ir_emit(m, fb, IR_OP_MATMUL, in_g, 2, ta, NULL, NULL, NULL, err, sizeof err);
  int64_t ia_acc[1] = {sg};
  int acc = ir_emit(m, fb, IR_OP_ACCUM, &gw, 1, ia_acc, NULL, NULL, NULL, err, sizeof err);
  TS_ASSERT(x >= 0 && ws >= 0 && mm >= 0 && pm >= 0 && ms >= 0 && sq >= 0 && o >= 0 && gw >= 0 && acc >= 0);

  int ub = ir_block_add(m, "update");
  IrType scalar = {IR_F32, 0, {0}, {NULL}};
  double one[1] = {1.0};
  int c = ir_emit(m, ub, IR_OP_FULL, NULL, 0, NULL, one, NULL, &scalar, err, sizeof err);
  int64_t ia_adam[3] = {sw, sm, sv};
  double fa_adam[4] = {0.9, 0.95, 1e-8, 0.1};
  int64_t ia_gs[1] = {sg};
  int gv = ir_emit(m, ub, IR_OP_STATE, NULL, 0, ia_gs, NULL, NULL, &tw, err, sizeof err);
  int cg[2] = {c, gv};
  int ad = ir_emit(m, ub, IR_OP_ADAMW, cg, 2, ia_adam, fa_adam, NULL, NULL, err, sizeof err);
  int64_t ia_g[1] = {sg};
  int z = ir_emit(m, ub, IR_OP_ZERO, NULL, 0, ia_g, NULL, NULL, NULL, err, sizeof err);
  if (c < 0 || ad < 0 || z < 0) TS_DIE("make_module: %s", err);
  TS_ASSERT(ir_verify(m, err, sizeof err) == 0);
  return m;
}

static Plan *make_plan(void) {
  Plan *p = plan_new();
  p->source = ts_intern("tests/plan/\"tiny\".mdl");
  p->nprograms = 1;
  p->programs = ts_xmalloc(sizeof *p->programs);
  p->programs[0] = make_module();
  p->nranks = 1;
  p->rank_program = ts_xcalloc(1, sizeof *p->rank_program);
  return p;
}

static int same(const StrBuf *a, const StrBuf *b) { return a->n == b->n && memcmp(a->p, b->p, a->n) == 0; }

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  TS_ASSERT(f);
  TS_ASSERT(fwrite(p, 1, n, f) == n);
  fclose(f);
}

/* Reads `bytes` as the file `path`; expects failure with exactly `want`
 * (or, if want starts with '~', a message containing the rest). */
static void expect_refusal(const char *path, const void *bytes, size_t n, const char *want) {
  write_bytes(path, bytes, n);
  char err[1024] = "";
  Plan *p = plan_read(path, err, sizeof err);
  CHECK(!p, "plan %s (%zu bytes) was accepted", path, n);
  plan_free(p);
  if (want[0] == '~') CHECK(strstr(err, want + 1), "message '%s' lacks '%s'", err, want + 1);
  else CHECK(strcmp(err, want) == 0, "message '%s', expected '%s'", err, want);
}

static void put_le(unsigned char *q, uint64_t v, int n) {
  for (int i = 0; i < n; i++) q[i] = (unsigned char)(v >> (8 * i));
}
/* Fixes the header's payload length and checksum after an edit. */
static void reseal(StrBuf *b) {
  put_le((unsigned char *)b->p + 16, b->n - 32, 8);
  put_le((unsigned char *)b->p + 24, ts_hash64(b->p + 32, b->n - 32, 0), 8);
}

static void test_roundtrips(void) {
  Plan *p = make_plan();
  StrBuf bin = {0}, bin2 = {0}, text = {0}, text2 = {0}, text3 = {0}, bin3 = {0};
  char err[1024] = "";

  plan_encode(p, &bin);
  Plan *q = plan_decode(bin.p, bin.n, err, sizeof err);
  CHECK(q, "decode failed: %s", err);
  if (q) {
    plan_encode(q, &bin2);
    CHECK(same(&bin, &bin2), "encode(decode(b)) differs (%zu vs %zu bytes)", bin.n, bin2.n);
    const IrModule *m = q->programs[0];
    CHECK(m->blocks.n == 2 && m->blocks.a[0].n == 9 && m->states.n == 5, "decoded shape of the module");
    CHECK(signbit(m->blocks.a[0].nodes[4].fa[0]), "-0.0 attr lost its sign");
    CHECK(m->train.seed == 0xfedcba9876543210ull, "seed %llx", (unsigned long long)m->train.seed);
    CHECK(strcmp(q->source, p->source) == 0, "source '%s'", q->source);
  }

  plan_print_text(p, &text);
  CHECK(strncmp(text.p, "tessera-plan 4\nmesh dp=1 pp=1 cp=1 ep=1 tp=1\nsource \"tests/plan/\\\"tiny\\\".mdl\"\n"
                        "ranks 1\nrank 0 program 0\nprogram 0\nmodule tiny\n", 125) == 0,
        "text header:\n%.200s", text.p);
  Plan *t = plan_parse_text(text.p, "tiny.plan.txt", err, sizeof err);
  CHECK(t, "text parse failed: %s", err);
  if (t) {
    plan_print_text(t, &text2);
    CHECK(same(&text, &text2), "print(parse(print(p))) differs:\n%s\n---\n%s", text.p, text2.p);
    plan_encode(t, &bin3);
    CHECK(same(&bin, &bin3), "encode(parse_text(print_text(p))) differs from encode(p)");
  }
  if (q) {
    plan_print_text(q, &text3);
    CHECK(same(&text, &text3), "text of the decoded plan differs");
  }
  /* a program without its train or parallel line is refused (it would
   * train with the defaults), naming the line that is missing */
  for (int k = 0; k < 2; k++) {
    const char *key = k ? "\nparallel " : "\ntrain ";
    const char *at = strstr(text.p, key);
    CHECK(at != NULL, "the text has no%s line", key);
    if (!at) continue;
    const char *eol = strchr(at + 1, '\n');
    StrBuf cut = {0};
    sb_printf(&cut, "%.*s%s", (int)(at - text.p), text.p, eol);
    Plan *bad = plan_parse_text(cut.p, "cut.plan.txt", err, sizeof err);
    CHECK(!bad && strstr(err, k ? "has no 'parallel' line" : "has no 'train' line"), "a program without%s: %s", key,
          bad ? "accepted" : err);
    plan_free(bad);
    sb_free(&cut);
  }

  /* files: binary and text both load through plan_read */
  char path[1024];
  snprintf(path, sizeof path, "%s/tiny.plan", tmpdir);
  CHECK(plan_write(p, path, err, sizeof err) == 0, "write: %s", err);
  Plan *f = plan_read(path, err, sizeof err);
  CHECK(f, "read: %s", err);
  if (f) {
    StrBuf b = {0};
    plan_encode(f, &b);
    CHECK(same(&bin, &b), "file round trip differs");
    sb_free(&b);
  }
  snprintf(path, sizeof path, "%s/tiny.plan.txt", tmpdir);
  write_bytes(path, text.p, text.n);
  Plan *ft = plan_read(path, err, sizeof err);
  CHECK(ft, "read text: %s", err);
  if (ft) {
    StrBuf b = {0};
    plan_encode(ft, &b);
    CHECK(same(&bin, &b), "text file round trip differs");
    sb_free(&b);
  }
  snprintf(path, sizeof path, "%s/nonexistent/x.plan", tmpdir);
  CHECK(plan_write(p, path, err, sizeof err) != 0 && strstr(err, "cannot write '") && strstr(err, "No such file"), "write into a missing dir: %s", err);

  plan_free(f);
  plan_free(ft);
  plan_free(t);
  plan_free(q);
  plan_free(p);
  sb_free(&bin); sb_free(&bin2); sb_free(&bin3);
  sb_free(&text); sb_free(&text2); sb_free(&text3);
}

static void test_refusals(void) {
  Plan *p = make_plan();
  StrBuf bin = {0};
  plan_encode(p, &bin);
  plan_free(p);
  char path[1024], want[2048];
  snprintf(path, sizeof path, "%s/bad.plan", tmpdir);
  size_t pay = bin.n - 32;

  /* truncated at many points */
  size_t cuts[] = {0, 1, 7, 8, 12, 31, 32, 33, 40, bin.n / 2, bin.n - 8, bin.n - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    size_t c = cuts[i];
    if (c < 8) snprintf(want, sizeof want, "'%s' is not a Tessera plan (bad magic)", path);
    else if (c < 32) snprintf(want, sizeof want, "~plan '%s' is truncated", path);
    else snprintf(want, sizeof want, "plan '%s' is truncated: header says %zu payload bytes, file has %zu", path, pay, c - 32);
    expect_refusal(path, bin.p, c, want);
  }

  /* one flipped bit anywhere in the payload: checksum */
  StrBuf b = {0};
  sb_write(&b, bin.p, bin.n);
  size_t flips[] = {32, 33, 40, bin.n / 2, bin.n - 1};
  snprintf(want, sizeof want, "plan '%s' is corrupted: checksum mismatch", path);
  for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
    b.p[flips[i]] ^= 0x10;
    expect_refusal(path, b.p, b.n, want);
    b.p[flips[i]] ^= 0x10;
  }

  /* newer versions (the checksum covers only the payload: still valid) */
  unsigned vers[] = {PLAN_VERSION + 1, 7};
  for (int i = 0; i < 2; i++) {
    put_le((unsigned char *)b.p + 8, vers[i], 4);
    snprintf(want, sizeof want,
             "plan '%s' has format version %u; this mrun reads up to version %d: rebuild mrun or recompile the plan",
             path, vers[i], PLAN_VERSION);
    expect_refusal(path, b.p, b.n, want);
  }
  /* an older version (1 predates sharding, 2 the optimizer fields of the train record) */
  put_le((unsigned char *)b.p + 8, 1, 4);
  snprintf(want, sizeof want,
           "plan '%s' has format version 1, older than this mrun's %d: recompile the plan",
           path, PLAN_VERSION);
  expect_refusal(path, b.p, b.n, want);
  expect_refusal(path, "tessera-plan 1\n", 15, want);
  put_le((unsigned char *)b.p + 8, PLAN_VERSION, 4);

  /* bad magic: text that is not a plan, and a damaged magic */
  snprintf(want, sizeof want, "'%s' is not a Tessera plan (bad magic)", path);
  expect_refusal(path, "hello, world\n", 13, want);
  b.p[0] = 'X';
  expect_refusal(path, b.p, b.n, want);
  b.p[0] = 'T';

  /* trailing bytes after the payload */
  sb_write(&b, "junk", 4);
  expect_refusal(path, b.p, b.n, "~is corrupted: header says");

  /* a broken text plan names file and line */
  expect_refusal(path, "tessera-plan 4\nmesh dp=1 pp=1\n", 30, "~bad.plan:2: error: expected 'mesh");
  snprintf(want, sizeof want,
           "plan '%s' has format version 9; this mrun reads up to version %d: rebuild mrun or recompile the plan", path,
           PLAN_VERSION);
  expect_refusal(path, "tessera-plan 9\n", 15, want);
  /* errors inside a program carry the line number within the whole file */
  static const char bad_module[] = "tessera-plan 4\nmesh dp=1 pp=1 cp=1 ep=1 tp=1\nsource \"\"\nranks 1\n"
                                   "rank 0 program 0\n# a comment\n\nprogram 0\nmodule x\nbogus line\n";
  expect_refusal(path, bad_module, sizeof bad_module - 1, "~bad.plan:10:");
  static const char bad_rank[] = "tessera-plan 4\nmesh dp=1 pp=1 cp=1 ep=1 tp=1\nsource \"\"\nranks 1\nrank 0 program 3\n";
  expect_refusal(path, bad_rank, sizeof bad_rank - 1, "~no programs");
  /* a rank table that does not match the mesh */
  Plan *p2 = make_plan();
  p2->mesh.tp = 2;
  StrBuf b2 = {0};
  plan_encode(p2, &b2);
  expect_refusal(path, b2.p, b2.n, "~has 2 ranks, the rank table 1");
  b2.n = 0;
  plan_print_text(p2, &b2);
  expect_refusal(path, b2.p, b2.n, "~has 2 ranks, the rank table 1");
  plan_free(p2);
  sb_free(&b2);
  sb_free(&b);
  sb_free(&bin);
}

/* A record body with a count of 0xFFFFFFFF must be refused by the count
 * check, not met with a 4-billion-entry allocation. */
static void test_huge_count(void) {
  StrBuf b = {0};
  sb_write(&b, "TSPLAN\0\0", 8);
  unsigned char h[24] = {PLAN_VERSION};
  sb_write(&b, h, 24);
  unsigned char rec[64];
  /* MESH */
  sb_write(&b, "MESH", 4); put_le(rec, 20, 4); sb_write(&b, rec, 4);
  for (int i = 0; i < 5; i++) { put_le(rec, 1, 4); sb_write(&b, rec, 4); }
  /* SRC "" */
  sb_write(&b, "SRC ", 4); put_le(rec, 4, 4); put_le(rec + 4, 0, 4); sb_write(&b, rec, 8);
  /* PROG { NAME "m", CNST count=0xFFFFFFFF } */
  sb_write(&b, "PROG", 4); put_le(rec, 8 + 5 + 8 + 4, 4); sb_write(&b, rec, 4);
  sb_write(&b, "NAME", 4); put_le(rec, 5, 4); put_le(rec + 4, 1, 4); rec[8] = 'm'; sb_write(&b, rec, 9);
  sb_write(&b, "CNST", 4); put_le(rec, 4, 4); put_le(rec + 4, 0xFFFFFFFFu, 4); sb_write(&b, rec, 8);
  reseal(&b);
  char err[1024] = "";
  Plan *p = plan_decode(b.p, b.n, err, sizeof err);
  CHECK(!p && strstr(err, "is corrupted") && strstr(err, "const count 4294967295 does not fit"),
        "huge count: '%s'", err);
  plan_free(p);
  sb_free(&b);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Corrupted payloads with valid checksums: decode must fail with a message
 * or succeed with a plan that encodes and decodes again. */
static void test_fuzz(void) {
  Plan *p = make_plan();
  StrBuf bin = {0}, text = {0};
  plan_encode(p, &bin);
  plan_print_text(p, &text);
  plan_free(p);
  int rejected = 0, accepted = 0;
  for (int it = 0; it < 1000; it++) {
    StrBuf b = {0};
    int mode = (int)(rnd() % 4);
    if (mode == 3) {                              /* random garbage of random length */
      sb_write(&b, bin.p, 32);
      size_t n = rnd() % 512;
      for (size_t i = 0; i < n; i++) sb_putc(&b, (char)rnd());
    } else {
      sb_write(&b, bin.p, bin.n);
      int k = 1 + (int)(rnd() % 8);
      for (int j = 0; j < k; j++) {
        size_t at = 32 + rnd() % (b.n - 32);
        if (mode == 0) b.p[at] = (char)rnd();                 /* any byte */
        else if (mode == 1) b.p[at] ^= (char)(1u << (rnd() % 8)); /* one bit */
        else b.p[at] = (char)(rnd() & 1 ? 0xff : 0x00);        /* extremes: counts, lengths */
      }
      if (rnd() % 4 == 0) b.n = 32 + rnd() % (b.n - 32);     /* and a cut payload */
    }
    reseal(&b);
    char err[1024] = "";
    Plan *q = plan_decode(b.p, b.n, err, sizeof err);
    if (!q) {
      rejected++;
      CHECK(err[0], "iteration %d: refused without a message", it);
    } else {
      accepted++;
      StrBuf again = {0};
      plan_encode(q, &again);
      Plan *r = plan_decode(again.p, again.n, err, sizeof err);
      CHECK(r, "iteration %d: accepted plan does not re-decode: %s", it, err);
      plan_free(r);
      sb_free(&again);
      plan_free(q);
    }
    sb_free(&b);
  }
  CHECK(rejected > 500, "only %d of 1000 corrupted payloads were refused", rejected);

  /* The text form, damaged: must parse or refuse, never crash. */
  int trejected = 0;
  for (int it = 0; it < 300; it++) {
    StrBuf t = {0};
    sb_write(&t, text.p, text.n);
    int k = 1 + (int)(rnd() % 4);
    static const char pool[] = "%@#\"\\=:,[]() 0123456789-.eaz\n";
    for (int j = 0; j < k; j++) t.p[rnd() % t.n] = pool[rnd() % (sizeof pool - 1)];
    char err[1024] = "";
    Plan *q = plan_parse_text(t.p, "fuzz.plan", err, sizeof err);
    if (!q) { trejected++; CHECK(err[0], "text iteration %d: refused without a message", it); }
    plan_free(q);
    sb_free(&t);
  }
  fprintf(stderr, "fuzz: %d refused, %d accepted; text: %d of 300 refused\n", rejected, accepted, trejected);
  sb_free(&bin);
  sb_free(&text);
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: test_plan TMPDIR\n"); return 2; }
  tmpdir = argv[1];
  mkdir(tmpdir, 0777);
  test_roundtrips();
  test_refusals();
  test_huge_count();
  test_fuzz();
  return check_exit("test_plan");
}
