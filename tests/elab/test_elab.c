/* test_elab.c - the MDL elaborator on whole programs:
 *   - samples/gpt.mdl and samples/llama.mdl elaborate at full size (GPT-2
 *     124M, Llama-2-7B with GQA): the parameter count equals the closed
 *     formula for each architecture, a few state names follow the naming
 *     rule, and the time is reported (and bounded);
 *   - at tiny sizes (-D) the module verifies and round-trips through text,
 *     and two compilations print identically;
 *   - dropout > 0 gives each dropout its own stream id;
 *   - --precision f64 makes every float f64; --tp overrides the block;
 *   - a shape error inside a fn carries notes at both operands' origins and
 *     at the call site;
 *   - the elaborator stops after 20 errors. */
#include "frontend/mdl.h"
#include <math.h>
#include <time.h>
#include "../check.h"

static const char *root;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Compiles samples/<name>.mdl with -D defines ("k=v" strings); diagnostics
 * go to *diag_out (malloc'd) when given, else stderr. */
static IrModule *compile(const char *name, const char *const *defs, int ndefs, MdlOptions *opt_in, char **diag_out) {
  char path[4096];
  snprintf(path, sizeof path, "%s/samples/%s.mdl", root, name);
  MdlDefine d[16];
  char buf[16][64];
  for (int i = 0; i < ndefs; i++) {
    snprintf(buf[i], sizeof buf[i], "%s", defs[i]);
    char *eq = strchr(buf[i], '=');
    *eq = 0;
    d[i].name = buf[i];
    d[i].value = eq + 1;
  }
  MdlOptions opt;
  if (opt_in) opt = *opt_in;
  else mdl_options_init(&opt);
  opt.defines = d;
  opt.ndefines = ndefs;
  char *out = NULL;
  size_t n = 0;
  FILE *f = diag_out ? open_memstream(&out, &n) : NULL;
  opt.diag = f;
  IrModule *m = mdl_compile_file(path, &opt);
  if (f) { fclose(f); *diag_out = out; }
  return m;
}

static int64_t param_count(const IrModule *m) {
  int64_t n = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_PARAM) n += ir_type_numel(&m->states.a[i].type);
  return n;
}

static const IrState *state(const IrModule *m, const char *name) {
  int i = ir_state_find(m, name);
  return i < 0 ? NULL : &m->states.a[i];
}

static void test_gpt_full(void) {
  double t0 = now_s();
  IrModule *m = compile("gpt", NULL, 0, NULL, NULL);
  double dt = now_s() - t0;
  CHECK(m, "gpt.mdl does not compile");
  if (!m) return;
  printf("gpt.mdl (GPT-2 124M): frontend %.1f ms, %d nodes, %d states\n", dt * 1e3, m->blocks.a[0].n, m->states.n);
  /* GPT-2 small with the vocab padded to 50304: embeddings, 12 pre-LN blocks
   * (qkv + proj with biases, 4x MLP with biases, two LayerNorms), final LN */
  int64_t V = 50304, T = 1024, C = 768, L = 12, F = 4 * C;
  int64_t block = 2 * C + (4 * C * C + 4 * C) + 2 * C + (2 * C * F + F + C);
  int64_t want = V * C + T * C + L * block + 2 * C;
  CHECK(param_count(m) == want, "gpt params %lld, want %lld", (long long)param_count(m), (long long)want);
  CHECK(want == 124475904, "formula");
  const IrState *s = state(m, "layers.11.attention.wq");
  CHECK(s && s->type.rank == 3 && s->type.dim[1] == 12 && s->type.dim[2] == 64 && !(s->flags & IR_STATE_NODECAY),
        "layers.11.attention.wq");
  s = state(m, "layers.0.layernorm_1.g");
  CHECK(s && s->type.rank == 1 && (s->flags & IR_STATE_NODECAY) && s->init == IR_INIT_ONES, "layers.0.layernorm_1.g");
  s = state(m, "layers.3.mlp.w_out");   /* scaled_normal(0.02, 12) */
  CHECK(s && s->init == IR_INIT_NORMAL && s->init_b > 0.02 / sqrt(24.0) - 1e-12 && s->init_b < 0.02 / sqrt(24.0) + 1e-12,
        "scaled init %g", s ? s->init_b : 0);
  CHECK(state(m, "token_embedding.wte") && !state(m, "layers.12.mlp.w_in"), "names");
  const IrBlock *b = &m->blocks.a[0];
  CHECK(b->n > 0 && b->nodes[b->n - 1].op == IR_OP_OUTPUT, "ends in output");
  CHECK(m->train.global_batch == 8 && m->train.micro_batch == 4 && m->train.decay_steps == 200, "train block");
  CHECK(dt < 2.0, "full-size gpt took %.3f s", dt);
  ir_module_free(m);
}

static void test_llama_full(void) {
  double t0 = now_s();
  IrModule *m = compile("llama", NULL, 0, NULL, NULL);
  double dt = now_s() - t0;
  CHECK(m, "llama.mdl does not compile");
  if (!m) return;
  printf("llama.mdl (Llama-2-7B sizes, GQA): frontend %.1f ms, %d nodes, %d states\n", dt * 1e3, m->blocks.a[0].n,
         m->states.n);
  int64_t V = 32000, C = 4096, H = 32, KV = 8, D = C / H, L = 32, F = 11008;
  int64_t block = C + (C * H * D + 2 * C * KV * D + H * D * C) + C + 3 * C * F;
  int64_t want = V * C + L * block + C + V * C;
  CHECK(param_count(m) == want, "llama params %lld, want %lld", (long long)param_count(m), (long long)want);
  const IrState *s = state(m, "layers.31.attention.wk");
  CHECK(s && s->type.dim[1] == KV && s->type.dname[1] && !strcmp(s->type.dname[1], "kv_heads"), "kv_heads dim name");
  CHECK(!state(m, "layers.0.attention.bq"), "llama has no biases");
  CHECK(dt < 2.0, "full-size llama took %.3f s", dt);
  ir_module_free(m);
}

static const char *tiny[] = {"layers=2", "d_model=64", "heads=4", "seq_len=16", "vocab=128"};

static void print_m(const IrModule *m, StrBuf *out) { ir_print_module(m, out); }

static void test_tiny_roundtrip(void) {
  const char *names[] = {"gpt", "llama"};
  for (int k = 0; k < 2; k++) {
    IrModule *m = compile(names[k], tiny, 5, NULL, NULL), *m2 = compile(names[k], tiny, 5, NULL, NULL);
    CHECK(m && m2, "%s tiny does not compile", names[k]);
    if (!m || !m2) { ir_module_free(m); ir_module_free(m2); continue; }
    char err[1024];
    CHECK(ir_verify(m, err, sizeof err) == 0, "%s: %s", names[k], err);
    StrBuf a = {0}, b = {0}, c = {0};
    print_m(m, &a);
    print_m(m2, &c);
    CHECK(a.n == c.n && !memcmp(a.p, c.p, a.n), "%s: two compilations differ", names[k]);
    IrModule *p = ir_parse_module(a.p, "<printed>", err, sizeof err);
    CHECK(p, "%s: parse: %s", names[k], err);
    if (p) {
      print_m(p, &b);
      CHECK(a.n == b.n && !memcmp(a.p, b.p, a.n), "%s: round trip differs", names[k]);
      ir_module_free(p);
    }
    /* every config constant is kept, with the -D value */
    int found = 0;
    for (int i = 0; i < m->consts.n; i++)
      if (!strcmp(m->consts.a[i].name, "d_model")) found = !m->consts.a[i].is_float && m->consts.a[i].i == 64;
    CHECK(found, "%s: const d_model = 64", names[k]);
    sb_free(&a); sb_free(&b); sb_free(&c);
    ir_module_free(m);
    ir_module_free(m2);
  }
}

static void test_dropout_streams(void) {
  const char *defs[] = {"layers=2", "d_model=64", "heads=4", "seq_len=16", "vocab=128", "dropout=0.1"};
  IrModule *m = compile("gpt", defs, 6, NULL, NULL);
  CHECK(m, "gpt with dropout");
  if (!m) return;
  const IrBlock *b = &m->blocks.a[0];
  int n = 0;
  for (int i = 0; i < b->n; i++) {
    if (b->nodes[i].op != IR_OP_DROPOUT) continue;
    CHECK(b->nodes[i].ia[0] == n, "dropout %d has stream %lld", n, (long long)b->nodes[i].ia[0]);
    CHECK(b->nodes[i].fa[0] == 0.1, "p");
    n++;
  }
  CHECK(n == 2 * 3, "2 layers x 3 dropouts, got %d", n);   /* attention probs, attention out, mlp out */
  ir_module_free(m);
}

static void test_options(void) {
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.precision = IR_F64;
  opt.tp = 2;
  IrModule *m = compile("llama", tiny, 5, &opt, NULL);
  CHECK(m, "llama f64");
  if (!m) return;
  CHECK(m->train.precision == IR_F64 && m->par.tp == 2 && m->par.pp == 1, "options");
  const IrBlock *b = &m->blocks.a[0];
  for (int i = 0; i < b->n; i++) {
    IrDtype t = b->nodes[i].type.dtype;
    CHECK(t == IR_F64 || t == IR_I32 || t == IR_VOID, "node %d is %s", i, ir_dtype_name(t));
  }
  for (int i = 0; i < m->states.n; i++) CHECK(m->states.a[i].type.dtype == IR_F64, "state %d", i);
  ir_module_free(m);
}

static IrModule *compile_src(const char *src, char **diag) {
  MdlOptions opt;
  mdl_options_init(&opt);
  char *out = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&out, &n);
  opt.diag = f;
  IrModule *m = mdl_compile_string(src, "t.mdl", &opt);
  fclose(f);
  *diag = out;
  return m;
}

static int count(const char *s, const char *sub) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, sub)); p++) n++;
  return n;
}

static void test_notes(void) {
  const char *src =
      "fn proj(x: [..., d], out: int) {\n"
      "  w = param [out, d] init normal(0.02)\n"
      "  return x @ w\n"
      "}\n"
      "model m(x: [b=4, d=8]) {\n"
      "  return sum(proj(x, 16))\n"
      "}\n";
  char *diag;
  IrModule *m = compile_src(src, &diag);
  CHECK(!m, "should fail");
  CHECK(strstr(diag, "t.mdl:3:12: error: matmul contraction mismatch: f32[b:4, d:8] @ f32[out:16, d:8]"), "%s", diag);
  CHECK(strstr(diag, "t.mdl:5:9: note: f32[b:4, d:8] comes from here"), "%s", diag);
  CHECK(strstr(diag, "t.mdl:2:7: note: f32[out:16, d:8] comes from here"), "%s", diag);
  CHECK(strstr(diag, "t.mdl:6:14: note: in the call of 'proj' here"), "%s", diag);
  CHECK(count(diag, ": error: ") == 1, "one error: %s", diag);
  free(diag);
  ir_module_free(m);
}

static void test_error_limit(void) {
  StrBuf s = {0};
  sb_puts(&s, "model m(x: [b=4, d=8]) {\n");
  for (int i = 0; i < 40; i++) sb_printf(&s, "  y%d = x * nope%d\n", i, i);
  sb_puts(&s, "  return sum(x)\n}\n");
  char *diag;
  IrModule *m = compile_src(s.p, &diag);
  CHECK(!m, "should fail");
  CHECK(count(diag, ": error: ") == 20, "%d errors", count(diag, ": error: "));
  CHECK(strstr(diag, "unknown name 'nope0'") && !strstr(diag, "nope20'"), "first 20");
  free(diag);
  sb_free(&s);
}

int main(int argc, char **argv) {
  root = argc > 1 ? argv[1] : TS_SOURCE_DIR;
  test_gpt_full();
  test_llama_full();
  test_tiny_roundtrip();
  test_dropout_streams();
  test_options();
  test_notes();
  test_error_limit();
  return check_exit("test_elab");
}
