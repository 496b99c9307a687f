/* test_ir_text.c - the IR text form and the verifier:
 *   - a module using every op parses and prints back byte for byte, and
 *     print(parse(print(m))) == print(m) for a module built with ir_emit;
 *   - clone prints identically; modules embedded one after another parse
 *     with ir_parse_module_at;
 *   - parse errors carry the right file:line:col;
 *   - mangled text (every truncation, byte flips) never crashes the parser;
 *   - the verifier rejects a forward reference, a wrong stored type and a
 *     bad state reference;
 *   - docs/ir.md contains the op table exactly as ir_ops_markdown prints it;
 *   - the graphviz output has a cluster per block and state boxes. */
#include "ir/ir.h"
#include "../check.h"

/* Canonical text (exactly what ir_print_module writes) using every op. */
static const char *all_ops =
    "module all_ops\n"
    "const vocab = 16\n"
    "const dropout = 0.1\n"
    "const neg = -3\n"
    "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=cosine warmup=20 decay_steps=200 "
    "min_lr=0.0001 clip_grad=1.0 global_batch=8 micro_batch=4 seq_len=4 steps=200 seed=1234 precision=f32\n"
    "parallel tp=2 pp=1 cp=1 ep=1 dp=0 sp=0 zero=1\n"
    "rule vocab = tp\n"
    "rule seq = cp tp\n"
    "state @wte : f32[vocab:16, dim:8] {0:tp} param init=normal(0.0, 0.02) logical=[31, 0]\n"
    "state @layers.0.ln.g : f32[dim:8] param init=ones nodecay\n"
    "state @w : f32[8, 8] param init=uniform(-0.125, 0.125)\n"
    "state @grad.wte : f32[vocab:16, dim:8] {0:tp, partial:dp} grad of=@wte\n"
    "state @adam_m.wte : f32[vocab:16, dim:8] {0:tp} adam_m of=@wte\n"
    "state @adam_v.wte : f32[vocab:16, dim:8] {0:tp} adam_v of=@wte\n"
    "state @cache.0.k : f32[1, 2, seq:4, 8] {1:tp} cache\n"
    "state @loss_scale : f32[] scaler start=4294967296.0\n"
    "state @loss_scale.good : f32[] scaler start=0.0\n"
    "state @loss_scale.hyst : f32[] scaler start=2.0\n"
    "state @loss_scale.skipped : f32[] scaler start=0.0\n"
    "state @fp8.t.amax : f32[] fp8 start=0.0\n"
    "state @fp8.t.amax_history : f32[1024] fp8 start=0.0\n"
    "state @fp8.t.scale : f32[] fp8 start=1.0\n"
    "state @fp8.t.scale_inv : f32[] fp8 start=1.0\n"
    "block micro {\n"
    "  %0 = input \"tokens\" : i32[batch:2, seq:4]\n"
    "  %1 = input \"tar\\\"g\\\\ets\" : i32[batch:2, seq:4]\n"
    "  %2 = state @wte : f32[vocab:16, dim:8] {0:tp}\n"
    "  %3 = embedding %2, %0 : f32[batch:2, seq:4, dim:8]\n"
    "  %4 = full value=0.5 : f32[2, 4, 8]\n"
    "  %5 = add %3, %4 : f32[batch:2, seq:4, dim:8]\n"
    "  %6 = sub %5, %4 : f32[batch:2, seq:4, dim:8]\n"
    "  %7 = mul %6, %4 : f32[batch:2, seq:4, dim:8]\n"
    "  %8 = div %7, %4 : f32[batch:2, seq:4, dim:8]\n"
    "  %9 = adds %8 c=1.0 : f32[batch:2, seq:4, dim:8]\n"
    "  %10 = muls %9 c=-2.5e-07 : f32[batch:2, seq:4, dim:8]\n"
    "  %11 = neg %10 : f32[batch:2, seq:4, dim:8]\n"
    "  %12 = exp %11 : f32[batch:2, seq:4, dim:8]\n"
    "  %13 = log %12 : f32[batch:2, seq:4, dim:8]\n"
    "  %14 = sqrt %12 : f32[batch:2, seq:4, dim:8]\n"
    "  %15 = rsqrt %12 : f32[batch:2, seq:4, dim:8]\n"
    "  %16 = tanh %15 : f32[batch:2, seq:4, dim:8]\n"
    "  %17 = gelu_tanh %16 : f32[batch:2, seq:4, dim:8]\n"
    "  %18 = gelu_erf %17 : f32[batch:2, seq:4, dim:8]\n"
    "  %19 = silu %18 : f32[batch:2, seq:4, dim:8]\n"
    "  %20 = relu %19 : f32[batch:2, seq:4, dim:8]\n"
    "  %21 = gelu_tanh_bwd %16, %20 : f32[batch:2, seq:4, dim:8]\n"
    "  %22 = gelu_erf_bwd %17, %21 : f32[batch:2, seq:4, dim:8]\n"
    "  %23 = silu_bwd %18, %22 : f32[batch:2, seq:4, dim:8]\n"
    "  %24 = relu_bwd %19, %23 : f32[batch:2, seq:4, dim:8]\n"
    "  %25 = eq %24, %13 : f32[batch:2, seq:4, dim:8]\n"
    "  %26 = ne_scalar %1 c=-1.0 : f32[batch:2, seq:4]\n"
    "  %27 = cast %25 : f64[batch:2, seq:4, dim:8]\n"
    "  %28 = reshape %14 : f32[8, 8]\n"
    "  %29 = permute %14 perm=[0, 2, 1] : f32[batch:2, dim:8, seq:4]\n"
    "  %30 = slice %29 axis=2 start=1 end=3 : f32[batch:2, dim:8, 2]\n"
    "  %31 = pad %30 axis=2 before=1 after=1 : f32[batch:2, dim:8, 4]\n"
    "  %32 = concat %29, %31 axis=1 : f32[batch:2, 16, seq:4]\n"
    "  %33 = broadcast %26 : f32[3, batch:2, seq:4]\n"
    "  %34 = sum_to %33 : f32[1, 4]\n"
    "  %35 = sum %32 axis=1 keepdim=0 : f32[batch:2, seq:4]\n"
    "  %36 = mean %32 axis=2 keepdim=1 : f32[batch:2, 16, 1]\n"
    "  %37 = max %35 axis=0 keepdim=0 : f32[seq:4]\n"
    "  %38 = matmul %24, %28 ta=0 tb=1 : f32[batch:2, seq:4, 8]\n"
    "  %39 = matmul %38, %38 ta=0 tb=1 : f32[batch:2, seq:4, 4]\n"
    "  %40 = causal_mask %39 fill=-inf : f32[batch:2, seq:4, 4]\n"
    "  %41 = softmax %40 : f32[batch:2, seq:4, 4]\n"
    "  %42 = softmax_bwd %41, %39 : f32[batch:2, seq:4, 4] group=3\n"
    "  %43 = log_softmax %42 : f32[batch:2, seq:4, 4] group=3\n"
    "  %44 = log_softmax_bwd %43, %42 : f32[batch:2, seq:4, 4]\n"
    "  %45 = layernorm %38 eps=1e-05 : f32[batch:2, seq:4, 8]\n"
    "  %46 = layernorm_bwd %38, %45 eps=1e-05 : f32[batch:2, seq:4, 8]\n"
    "  %47 = rmsnorm %46 eps=1e-06 : f32[batch:2, seq:4, 8]\n"
    "  %48 = rmsnorm_bwd %46, %47 eps=1e-06 : f32[batch:2, seq:4, 8]\n"
    "  %49 = masked_fill %48, %38 fill=nan : f32[batch:2, seq:4, 8]\n"
    "  %50 = dropout %49 stream=7 p=0.1 : f32[batch:2, seq:4, 8]\n"
    "  %51 = rope %50 axis=1 inverse=1 base=1e+04 : f32[batch:2, seq:4, 8]\n"
    "  %52 = matmul %51, %2 ta=0 tb=1 : f32[batch:2, seq:4, vocab:16]\n"
    "  %53 = cross_entropy %52, %1 ignore=-1 : f32[batch:2, seq:4]\n"
    "  %54 = cross_entropy_bwd %52, %1, %53 ignore=-1 : f32[batch:2, seq:4, vocab:16]\n"
    "  %55 = matmul %54, %52 ta=1 tb=0 : f32[batch:2, vocab:16, vocab:16]\n"
    "  %56 = embedding_bwd %0, %51 : f32[vocab:16, dim:8] {0:tp}\n"
    "  accum %56 @grad.wte\n"        /* effects are nodes too: this is node 57 */
    "  %58 = sumsq %53 : f32[]\n"
    "  output \"loss\" %58\n"
    "  %60 = sumsq %27 : f64[]\n"
    "  %61 = take %52, %1 ignore=-1 : f32[batch:2, seq:4] {partial:tp}\n"
    "  %62 = onehot %1 ignore=-1 : f32[batch:2, seq:4, vocab:16] {2:tp}\n"
    "  %63 = pad_fill %52 dim=2 limit=10 fill=-inf : f32[batch:2, seq:4, vocab:16] {2:tp}\n"
    "  %64 = topk_mask %52 k=3 : f32[batch:2, seq:4, vocab:16]\n"
    "  %65 = reshape %52 : f32[batch:2, heads:2, seq:4, 8]\n"
    "  %66 = reshape %51 : f32[batch:2, 1, seq:4, 8]\n"
    "  %67 = attention %65, %66, %66 causal=1 window=0 alibi=0 bias=0 scale=0.35 : f32[batch:2, heads:2, seq:4, 8]\n"
    "  %68 = attention_bwd %65, %66, %66, %67, %65 causal=1 part=1 window=3 alibi=0 bias=0 scale=0.35 : f32[batch:2, 1, seq:4, 8]\n"
    "  %69 = capacity_mask %64 cap=2 : f32[batch:2, seq:4, vocab:16]\n"
    "  %70 = reshape %64 : f32[8, 16]\n"          /* token dispatch: 8 tokens, 16 experts */
    "  %71 = moe_counts %70 : i32[1, 16]\n"
    "  %72 = reshape %51 : f32[8, 8]\n"
    "  %73 = moe_perm %72, %70, %70 rows=24 : f32[24, 8]\n"
    "  %74 = moe_unperm %73, %70, %70 : f32[8, 8]\n"
    "  %75 = moe_gate_grad %73, %72, %70 : f32[8, 16]\n"
    "  %76 = reshape %55 : f32[16, 8, 4]\n"
    "  %77 = gmm %73, %76, %71 tb=0 : f32[24, 4]\n"
    "  %78 = gmm_dw %73, %77, %71 : f32[16, 8, 4]\n"
    "  %79 = all_to_all %71 axis=tp split=1 concat=0 : i32[2, 8]\n"
    "  %80 = all_to_all_v %73, %71, %79 axis=tp rev=1 : f32[40, 8]\n"
    "  %81 = full value=0.0 : f32[batch:2, heads:2, seq:4, 10]\n"   /* ring attention steps */
    "  %82 = ring_shift %66 axis=cp : f32[batch:2, 1, seq:4, 8]\n"
    "  %83 = attn_acc %65, %66, %66, %81 causal=1 src=0 window=0 alibi=0 scale=0.35 : f32[batch:2, heads:2, seq:4, 10]\n"
    "  %84 = ring_wait %82 : f32[batch:2, 1, seq:4, 8]\n"
    "  %85 = attn_finish %83 : f32[batch:2, heads:2, seq:4, 8]\n"
    "  %86 = attn_lse %83 : f32[batch:2, heads:2, seq:4]\n"
    "  %87 = attn_bwd_q %65, %84, %84, %65, %86, %86, %65 causal=1 src=1 window=0 alibi=0 scale=0.35 : f32[batch:2, heads:2, seq:4, 8]\n"
    "  %88 = attn_bwd_kv %65, %84, %84, %65, %86, %86, %66 causal=0 src=1 part=2 window=2 alibi=0 scale=0.35 : f32[batch:2, 1, seq:4, 8]\n"
    "}\n"
    "block update {\n"
    "  %0 = state @grad.wte : f32[vocab:16, dim:8] {0:tp, partial:dp}\n"
    "  %1 = sumsq %0 : f32[]\n"
    "  %2 = sqrt %1 : f32[]\n"
    "  %3 = clip_coef %2 max=1.0 : f32[]\n"
    "  adamw %3, %0 @wte @adam_m.wte @adam_v.wte b1=0.9 b2=0.95 eps=1e-08 wd=0.1\n"
    "  zero @grad.wte\n"
    "  %6 = all_reduce %0 axis=dp red=0 : f32[vocab:16, dim:8] {0:tp}\n"
    "  %7 = all_gather %6 axis=tp dim=0 : f32[vocab:32, dim:8] {partial:cp}\n"
    "  %8 = reduce_scatter %7 axis=cp dim=1 : f32[vocab:32, dim:8] {1:cp}\n"
    "  %9 = shard_slice %8 axis=tp dim=0 : f32[vocab:16, dim:8] {0:tp, 1:cp}\n"
    "  assign %6 @wte\n"
    "  %11 = group_sum %6 axis=pp ranks=3 : f32[vocab:16, dim:8] {0:tp}\n"
    "  sgd %3, %0 @wte @adam_m.wte mom=0.9 nesterov=1.0 wd=0.1\n"
    "  lion %3, %0 @wte @adam_m.wte b1=0.9 b2=0.99 wd=0.0\n"
    "  lr_step %6 @wte scale=1.5 wd=0.1\n"
    "  %15 = nonfinite %0 : f32[]\n"
    "  scale_update %15 @loss_scale @loss_scale.good @loss_scale.hyst @loss_scale.skipped window=1000 hysteresis=2 "
    "dynamic=1 min=1.0\n"
    "  %17 = state @fp8.t.scale : f32[]\n"
    "  %18 = quant8 %0, %17 : f8e4m3[vocab:16, dim:8] {0:tp, partial:dp}\n"
    "  %19 = quant8 %0, %17 : f8e5m2[vocab:16, dim:8] {0:tp, partial:dp}\n"
    "  %20 = matmul8 %18, %19, %17, %17 ta=1 tb=0 : f32[dim:8, dim:8]\n"
    "  amax_acc %0 @fp8.t.amax\n"
    "  fp8_scale %17 @fp8.t.amax_history @fp8.t.scale @fp8.t.scale_inv algo=1 margin=0.5 fmax=57344.0\n"
    "}\n"
    "block fwd.0 {\n"
    "  %0 = state @w : f32[8, 8]\n"
    "  %1 = exp %0 : f32[8, 8] stage=1\n"
    "  send %1 axis=pp peer=1 tag=0\n"
    "  stash %1 slot=0\n"
    "}\n"
    "block fwd.1 {\n"
    "  %0 = recv axis=pp peer=-1 tag=0 : f32[8, 8] stage=3\n"
    "}\n"
    "block bwd.0 {\n"
    "  %0 = unstash slot=0 : f32[8, 8]\n"
    "}\n"
    "block step {\n"
    "  %0 = input \"pos\" : i32[]\n"
    "  %1 = input \"k\" : f32[1, 2, seq:1, 8] {1:tp}\n"
    "  kv_write %1, %0 @cache.0.k axis=2\n"
    "  %3 = state @cache.0.k : f32[1, 2, seq:4, 8] {1:tp}\n"
    "  %4 = rope_at %1, %0 axis=2 inverse=0 base=1e+04 : f32[1, 2, seq:1, 8] {1:tp}\n"
    "  %5 = attn_cached %4, %3, %3, %0 window=0 scale=0.25 : f32[1, 2, seq:1, 8] {1:tp}\n"
    "  %6 = slice_at %3, %0 axis=2 size=1 : f32[1, 2, seq:1, 8] {1:tp}\n"
    "}\n"
    "block ints {\n"
    "  %0 = arange axis=1 start=0.0 step=2.0 : i32[2, seq:4]\n"
    "  %1 = rand stream=3 lo=-1.0 hi=7.0 : i32[2, seq:4]\n"
    "  %2 = cmp %0, %1 pred=3 : i32[2, seq:4]\n"
    "  %3 = floordiv %0, %1 : i32[2, seq:4]\n"
    "  %4 = mod %3, %1 : i32[2, seq:4]\n"
    "  %5 = where %2, %3, %4 : i32[2, seq:4]\n"
    "  %6 = rand stream=4 lo=0.0 hi=1.0 : f32[2, 6]\n"
    "  %7 = gather %6, %5 axis=1 : f32[2, seq:4]\n"
    "  %8 = gather_bwd %5, %7 axis=1 : f32[2, 6]\n"
    "}\n"
    "end\n";

static char *print_module(const IrModule *m) {
  StrBuf b = {0};
  ir_print_module(m, &b);
  return b.p;
}

static void test_all_ops_roundtrip(void) {
  char err[512] = "";
  IrModule *m = ir_parse_module(all_ops, "all_ops.ir", err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  int seen[IR_OP_COUNT] = {0};
  for (int b = 0; b < m->blocks.n; b++)
    for (int i = 0; i < m->blocks.a[b].n; i++) seen[m->blocks.a[b].nodes[i].op] = 1;
  for (int op = 0; op < IR_OP_COUNT; op++) CHECK(seen[op], "op %s not used by the round-trip module", ir_ops[op].name);
  CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  /* parsed values, not just text */
  CHECK(m->consts.n == 3 && !m->consts.a[0].is_float && m->consts.a[0].i == 16 && m->consts.a[1].is_float &&
        m->consts.a[1].f == 0.1 && m->consts.a[2].i == -3, "consts");
  CHECK(m->train.schedule == IR_SCHED_COSINE && m->train.lr == 0.001 && m->train.steps == 200, "train");
  CHECK(m->states.a[3].of == 0 && m->states.a[1].flags == IR_STATE_NODECAY && m->states.a[2].init_a == -0.125, "states");
  CHECK(strcmp(m->blocks.a[0].nodes[1].sa, "tar\"g\\ets") == 0, "string escapes: %s", m->blocks.a[0].nodes[1].sa);
  char *p1 = print_module(m);
  CHECK(strcmp(p1, all_ops) == 0, "print(parse(text)) differs:\n%s", p1);
  IrModule *m2 = ir_parse_module(p1, "p1", err, sizeof err);
  CHECK(m2 != NULL, "reparse: %s", err);
  if (m2) {
    char *p2 = print_module(m2);
    CHECK(strcmp(p1, p2) == 0, "second round trip differs");
    free(p2);
    ir_module_free(m2);
  }
  IrModule *c = ir_module_clone(m);
  ir_module_free(m);                 /* the clone must not share memory with it */
  char *pc = print_module(c);
  CHECK(strcmp(pc, p1) == 0, "clone prints differently");
  CHECK(ir_verify(c, err, sizeof err) == 0, "clone verify: %s", err);
  free(pc);

  StrBuf dot = {0};
  ir_print_dot(c, &dot);
  CHECK(strstr(dot.p, "subgraph cluster_0") && strstr(dot.p, "subgraph cluster_1") &&
        strstr(dot.p, "s0 [shape=box") && strstr(dot.p, "b0_2 -> b0_3;") && strstr(dot.p, "s0 -> b0_2"),
        "dot output:\n%s", dot.p);
  sb_free(&dot);
  ir_module_free(c);
  free(p1);
}

/* A module built with ir_emit (names attached by the builder) round-trips. */
static void test_emit_roundtrip(void) {
  char err[512] = "";
  IrModule *m = ir_module_new("built");
  IrState s = {.name = "emb", .type = {IR_F32, 2, {10, 4}, {"vocab", "c"}}, .kind = IR_STATE_PARAM,
               .init = IR_INIT_NORMAL, .init_a = 0.0, .init_b = 1.0 / 3.0, .of = -1};
  ir_state_add(m, &s);
  VEC_PUSH(m->consts, ((IrConst){ts_intern("pi"), 1, 0, 3.141592653589793}));
  int b = ir_block_add(m, "forward");
  IrType ids = {IR_I32, 1, {5}, {"t"}};
  int x = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "ids", &ids, err, sizeof err);
  int w = ir_emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){0}, NULL, NULL, &s.type, err, sizeof err);
  int e = ir_emit(m, b, IR_OP_EMBEDDING, (int[]){w, x}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  int q = ir_emit(m, b, IR_OP_SUMSQ, (int[]){e}, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  int o = ir_emit(m, b, IR_OP_OUTPUT, (int[]){q}, 1, NULL, NULL, "loss", NULL, err, sizeof err);
  CHECK(x == 0 && w == 1 && e == 2 && q == 3 && o == 4, "emit: %s", err);
  CHECK(m->blocks.a[b].nodes[o].type.dtype == IR_VOID, "effect has a type");
  CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  char *p1 = print_module(m);
  CHECK(strstr(p1, "%2 = embedding %1, %0 : f32[t:5, c:4]\n"), "embedding line:\n%s", p1);
  CHECK(strstr(p1, "init=normal(0.0, 0.3333333333333333)"), "init:\n%s", p1);
  IrModule *m2 = ir_parse_module(p1, "p1", err, sizeof err);
  CHECK(m2 != NULL, "parse: %s", err);
  if (m2) {
    char *p2 = print_module(m2);
    CHECK(strcmp(p1, p2) == 0, "round trip differs:\n%s\n---\n%s", p1, p2);
    CHECK(m2->consts.a[0].f == 3.141592653589793, "double const lost bits");
    free(p2);
    ir_module_free(m2);
  }
  /* several modules one after another, with text between them */
  StrBuf cat = {0};
  sb_puts(&cat, "# plan text\n");
  sb_puts(&cat, p1);
  sb_puts(&cat, "program 1\n");
  sb_puts(&cat, all_ops);
  sb_puts(&cat, "tail\n");
  size_t pos = 0;
  int line = 0;    /* lines before pos */
  IrModule *a = ir_parse_module_at(cat.p, &pos, &line, "plan", err, sizeof err);
  CHECK(a && strcmp(a->name, "built") == 0, "first module: %s", err);
  CHECK(strncmp(cat.p + pos, "program 1\n", 10) == 0, "pos after first module: '%.12s'", cat.p + pos);
  int nl = 0;
  for (size_t i = 0; i < pos; i++) nl += cat.p[i] == '\n';
  CHECK(line == nl, "line %d, expected %d", line, nl);
  pos += 10;
  line++;
  int first_line = line + 1;    /* 1-based line of "module all_ops" */
  IrModule *bm = ir_parse_module_at(cat.p, &pos, &line, "plan", err, sizeof err);
  CHECK(bm && strcmp(bm->name, "all_ops") == 0, "second module: %s", err);
  CHECK(strcmp(cat.p + pos, "tail\n") == 0, "pos after second module");
  /* an error inside an embedded module reports its line within the whole text */
  char *bad = strstr(cat.p + 1, "module all_ops");
  char *zero = strstr(bad, "zero @grad.wte");
  memcpy(zero, "zerx", 4);
  pos = (size_t)(bad - cat.p);
  line = first_line - 1;
  IrModule *c = ir_parse_module_at(cat.p, &pos, &line, "plan", err, sizeof err);
  int zline = first_line;   /* the line of the broken `zero`, counted (the module grows with new ops) */
  for (const char *q = bad; q < zero; q++) zline += *q == '\n';
  char want[64];
  snprintf(want, sizeof want, "plan:%d:3: error: unknown op 'zerx'", zline);
  CHECK(c == NULL && strcmp(err, want) == 0, "got '%s', want '%s'", err, want);
  ir_module_free(a);
  ir_module_free(bm);
  sb_free(&cat);
  free(p1);
  ir_module_free(m);
}

/* Parse errors: file:line:col of the offending token. */
static void test_parse_errors(void) {
  static const struct { const char *text, *where, *what; } cases[] = {
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n  %1 = frob %0 : f32[2]\n}\nend\n", "e:4:8:", "unknown op 'frob'"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n  %2 = neg %0 : f32[2]\n}\nend\n", "e:4:4:", "expected %1"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n  %1 = add %0, %5 : f32[2]\n}\nend\n", "e:4:16:", "%5 is not defined"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n  %1 = neg %0 : f32[3]\n}\nend\n", "e:4:8:", "written type f32[3]"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n  %1 = neg %0 : f33[2]\n}\nend\n", "e:4:17:", "unknown dtype 'f33'"},
    {"module m\nblock b {\n  %0 = input \"x : f32[2]\n}\nend\n", "e:3:25:", "unterminated string"},
    {"module m\nstate @p : f32[2] param init=zeros\nstate @g : f32[2] grad of=@q\nend\n", "e:3:27:", "@q is not a param"},
    {"module m\ntrain lr=0.1 bogus=3\nend\n", "e:2:14:", "unknown train key 'bogus'"},
    {"module m\nblock b {\n  %0 = state @nope : f32[2]\n}\nend\n", "e:3:14:", "unknown state @nope"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2, 3]\n  %1 = permute %0 perm=[1] : f32[3, 2]\n}\nend\n",
     "e:4:19:", "perm has 1 entries"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n  output \"y\" %0\n}\nend\n", "e:4:3:", "output: operand"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n", "e:4:1:", "missing '}'"},
    {"module m\nblock b {\n}\n", "e:4:1:", "missing 'end'"},  /* only ir_parse_module_at needs it: see below */
    {"module m\nend\nmore\n", "e:3:1:", "unexpected text"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2] junk\n}\nend\n", "e:3:27:", "expected end of line"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[99999999999999999999]\n}\nend\n", "e:3:24:", "out of range"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[2]\n  %1 = input \"x\" : f32[2]\n}\nend\n", "e:1:1:", "appears twice"},
    /* the contiguous innermost cp level of a split (ir.h IR_SPLIT_CP_MINOR) */
    {"module m\nblock b {\n  %0 = input \"x\" : f32[4, 2] {0:cp*+tp}\n}\nend\n", "e:3:33:", "cp* must be the last axis"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[4, 2] {0:tp*}\n}\nend\n", "e:3:33:", "only cp takes a star"},
    {"module m\nblock b {\n  %0 = input \"x\" : f32[4, 2] {partial:cp*}\n}\nend\n", "e:3:39:", "only cp takes a star"},
  };
  char err[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    err[0] = 0;
    IrModule *m;
    if (strstr(cases[i].what, "missing 'end'")) {
      size_t pos = 0;
      int line = 0;
      m = ir_parse_module_at(cases[i].text, &pos, &line, "e", err, sizeof err);
    } else {
      m = ir_parse_module(cases[i].text, "e", err, sizeof err);
    }
    CHECK(m == NULL, "case %zu accepted", i);
    ir_module_free(m);
    CHECK(strncmp(err, cases[i].where, strlen(cases[i].where)) == 0 && strstr(err, "error: ") &&
          strstr(err, cases[i].what), "case %zu: got '%s', want '%s ... %s'", i, err, cases[i].where, cases[i].what);
  }
  /* ir_parse_module accepts a module that ends with the text (no `end`) */
  {
    IrModule *m = ir_parse_module("module m\nblock b {\n}\n", "e", err, sizeof err);
    CHECK(m != NULL, "no-end module: %s", err);
    ir_module_free(m);
  }
}

/* A split whose cp level is contiguous and innermost (all-to-all
 * attention's head split, "1:tp+cp*") prints and parses back, and is not
 * the zigzag split "1:cp+tp". */
static void test_cp_minor_text(void) {
  const char *text =
      "module m\n"
      "parallel tp=2 pp=1 cp=2 ep=1 dp=0 sp=0 zero=1\n"
      "block micro {\n"
      "  %0 = input \"q\" : f32[1, 4, 16, 8] {1:tp+cp*}\n"
      "  %1 = input \"k\" : f32[1, 2, 16, 8] {1:cp*}\n"
      "  %2 = input \"v\" : f32[1, 2, 16, 8] {1:cp+tp}\n"
      "}\n"
      "end\n";
  char err[512];
  IrModule *m = ir_parse_module(text, "cp_minor", err, sizeof err);
  CHECK(m != NULL, "cp* text: %s", err);
  if (!m) return;
  const IrBlock *b = &m->blocks.a[0];
  unsigned cp = 1u << IR_AXIS_CP, tp = 1u << IR_AXIS_TP;
  CHECK(b->nodes[0].sh.split[1] == (cp | tp | IR_SPLIT_CP_MINOR), "1:tp+cp* parsed as 0x%x", b->nodes[0].sh.split[1]);
  CHECK(b->nodes[1].sh.split[1] == (cp | IR_SPLIT_CP_MINOR), "1:cp* parsed as 0x%x", b->nodes[1].sh.split[1]);
  CHECK(b->nodes[2].sh.split[1] == (cp | tp), "1:cp+tp parsed as 0x%x", b->nodes[2].sh.split[1]);
  CHECK(!ir_sharding_equal(&b->nodes[0].sh, &b->nodes[2].sh), "tp+cp* equals cp+tp");
  CHECK(ir_verify(m, err, sizeof err) == 0, "cp* text does not verify: %s", err);
  StrBuf out = {0};
  ir_print_module(m, &out);
  for (int i = 0; i < 3; i++) {   /* the three nodes' lines, as written */
    const char *line = strstr(text, i == 0 ? "  %0" : i == 1 ? "  %1" : "  %2");
    char want[64];
    snprintf(want, sizeof want, "%.*s", (int)(strchr(line, '\n') - line + 1), line);
    CHECK(out.p && strstr(out.p, want), "cp* text does not print back '%s':\n%s", want, out.p ? out.p : "(null)");
  }
  IrModule *m2 = out.p ? ir_parse_module(out.p, "cp_minor2", err, sizeof err) : NULL;
  StrBuf out2 = {0};
  if (m2) ir_print_module(m2, &out2);
  CHECK(m2 && out2.p && strcmp(out.p, out2.p) == 0, "print(parse(print)) differs: %s", err);
  sb_free(&out2);
  ir_module_free(m2);
  sb_free(&out);
  ir_module_free(m);
}

/* Every truncation of a valid module and many byte flips: the parser must
 * return a module or an error message, never crash (ASan build checks). */
static void test_parse_mangled(void) {
  size_t n = strlen(all_ops);
  char *buf = ts_xmalloc(n + 1);
  char err[512];
  int errors = 0;
  for (size_t k = 0; k < n; k += 3) {
    memcpy(buf, all_ops, k);
    buf[k] = 0;
    IrModule *m = ir_parse_module(buf, "t", err, sizeof err);
    if (!m) { errors++; CHECK(strncmp(err, "t:", 2) == 0, "truncation %zu: message '%s'", k, err); }
    ir_module_free(m);
  }
  CHECK(errors > 0, "no truncation failed");
  static const char junk[] = "%@\"\\#:=[],(){}-9xe.\n \t\x01\xff";
  uint64_t r = 12345;
  for (int it = 0; it < 3000; it++) {
    memcpy(buf, all_ops, n + 1);
    for (int f = 0; f < 1 + it % 3; f++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = (size_t)(r >> 33) % n;
      buf[at] = junk[(r >> 20) % (sizeof junk - 1)];
    }
    IrModule *m = ir_parse_module(buf, "t", err, sizeof err);
    if (m) {  /* whatever parsed must verify and round-trip */
      CHECK(ir_verify(m, err, sizeof err) == 0, "mangled module parsed but fails verify: %s", err);
      char *p1 = print_module(m);
      IrModule *m2 = ir_parse_module(p1, "p", err, sizeof err);
      CHECK(m2 != NULL, "mangled round trip: %s", err);
      if (m2) { char *p2 = print_module(m2); CHECK(strcmp(p1, p2) == 0, "mangled round trip differs"); free(p2); }
      ir_module_free(m2);
      free(p1);
    } else {
      CHECK(strncmp(err, "t:", 2) == 0 && strstr(err, ": error: "), "message '%s'", err);
    }
    ir_module_free(m);
  }
  free(buf);
}

/* The verifier catches what direct edits of nodes and states can break. */
static void test_verifier(void) {
  char err[512] = "";
  IrModule *m = ir_parse_module(all_ops, "v", err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  IrBlock *b = &m->blocks.a[0];
  /* forward reference: %5 = add %3, %4  ->  add %3, %6 */
  b->nodes[5].in[1] = 6;
  CHECK(ir_verify(m, err, sizeof err) == -1 && strstr(err, "block micro, %5 = add") && strstr(err, "not defined before use"),
        "forward ref: '%s'", err);
  b->nodes[5].in[1] = 4;
  CHECK(ir_verify(m, err, sizeof err) == 0, "restored: %s", err);
  /* wrong stored type */
  b->nodes[38].type.dim[2] = 9;
  CHECK(ir_verify(m, err, sizeof err) == -1 && strstr(err, "block micro, %38 = matmul: stored type f32[batch:2, seq:4, 9]"),
        "wrong type: '%s'", err);
  b->nodes[38].type.dim[2] = 8;
  /* names may differ, sizes may not */
  b->nodes[38].type.dname[2] = ts_intern("renamed");
  CHECK(ir_verify(m, err, sizeof err) == 0, "renamed dim rejected: %s", err);
  /* bad state reference in an effect */
  IrBlock *u = &m->blocks.a[1];
  u->nodes[4].ia[2] = 99;
  CHECK(ir_verify(m, err, sizeof err) == -1 && strstr(err, "block update, node 4: adamw: state reference 99"),
        "bad state ref: '%s'", err);
  u->nodes[4].ia[2] = 5;
  /* a grad whose `of` is not a param; duplicate state names */
  m->states.a[3].of = 4;
  CHECK(ir_verify(m, err, sizeof err) == -1 && strstr(err, "of=4 is not a param"), "bad of: '%s'", err);
  m->states.a[3].of = 0;
  m->states.a[2].name = m->states.a[1].name;
  CHECK(ir_verify(m, err, sizeof err) == -1 && strstr(err, "defined twice"), "dup state: '%s'", err);
  m->states.a[2].name = ts_intern("w");
  /* duplicate output names: turn %60 (sumsq) into a second output "loss" */
  IrNode *n60 = &b->nodes[60];
  n60->op = IR_OP_OUTPUT;
  n60->in[0] = 58;
  n60->sa = ts_intern("loss");
  memset(&n60->type, 0, sizeof n60->type);
  CHECK(ir_verify(m, err, sizeof err) == -1 && strstr(err, "block micro, node 60: output: name \"loss\" appears twice"),
        "dup output: '%s'", err);
  n60->sa = ts_intern("loss2");
  CHECK(ir_verify(m, err, sizeof err) == 0, "distinct outputs rejected: %s", err);
  ir_module_free(m);
}

/* ir_verify_training: every gradient accumulated per micro batch and
 * zeroed once per step, every parameter updated once. */
static void test_verify_training(void) {
  const char *text =
      "module t\n"
      "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
      "min_lr=0.0 clip_grad=0.0 global_batch=1 micro_batch=1 seq_len=4 steps=1 seed=1 precision=f32\n"
      "parallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0 zero=1\n"
      "state @w : f32[4] param init=zeros\n"
      "state @v : f32[4] param init=zeros\n"
      "state @grad.w : f32[4] grad of=@w\n"
      "state @grad.v : f32[4] grad of=@v\n"
      "state @adam_m.w : f32[4] adam_m of=@w\n"
      "state @adam_v.w : f32[4] adam_v of=@w\n"
      "state @adam_m.v : f32[4] adam_m of=@v\n"
      "state @adam_v.v : f32[4] adam_v of=@v\n"
      "block micro {\n"
      "  %0 = input \"x\" : f32[4]\n"
      "  accum %0 @grad.w\n"
      "  accum %0 @grad.v\n"
      "}\n"
      "block update {\n"
      "  %0 = state @grad.w : f32[4]\n"
      "  %1 = state @grad.v : f32[4]\n"
      "  %2 = sumsq %0 : f32[]\n"
      "  adamw %2, %0 @w @adam_m.w @adam_v.w b1=0.9 b2=0.95 eps=1e-08 wd=0.1\n"
      "  adamw %2, %1 @v @adam_m.v @adam_v.v b1=0.9 b2=0.95 eps=1e-08 wd=0.1\n"
      "  zero @grad.w\n"
      "  zero @grad.v\n"
      "}\n"
      "end\n";
  char err[512] = "";
  IrModule *m = ir_parse_module(text, "t", err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  CHECK(ir_verify_training(m, err, sizeof err) == 0, "a complete module: %s", err);
  IrNode *acc = &m->blocks.a[0].nodes[2], *zero = &m->blocks.a[1].nodes[6], *up = &m->blocks.a[1].nodes[4];
  acc->ia[0] = 2;   /* both accums into @grad.w: @grad.v never accumulated */
  CHECK(ir_verify_training(m, err, sizeof err) != 0 && strstr(err, "gradient @grad.v is never accumulated"), "%s", err);
  acc->ia[0] = 3;
  zero->ia[0] = 2;  /* @grad.w zeroed twice, @grad.v never */
  CHECK(ir_verify_training(m, err, sizeof err) != 0 && strstr(err, "gradient @grad.w is zeroed 2 times"), "%s", err);
  zero->ia[0] = 3;
  up->ia[0] = 0;    /* @w updated twice, @v never */
  CHECK(ir_verify_training(m, err, sizeof err) != 0 && strstr(err, "parameter @w is updated by 2 adamw"), "%s", err);
  up->ia[0] = 1;
  CHECK(ir_verify_training(m, err, sizeof err) == 0, "restored: %s", err);
  ir_module_free(m);
}

static void test_docs_table(void) {
  StrBuf md = {0};
  ir_ops_markdown(&md);
  char *doc = ts_read_file(TS_SOURCE_DIR "/docs/ir.md", NULL);
  CHECK(doc != NULL, "cannot read docs/ir.md");
  CHECK(doc && strstr(doc, md.p), "docs/ir.md does not contain the current op table; regenerate it:\n%s", md.p);
  for (int op = 0; op < IR_OP_COUNT; op++) {
    char cell[64];
    snprintf(cell, sizeof cell, "| `%s` |", ir_ops[op].name);
    CHECK(strstr(md.p, cell), "op table lacks %s", ir_ops[op].name);
  }
  free(doc);
  sb_free(&md);
}

/* Small helpers: defaults, dtypes, type text and comparisons, op lookup. */
/* ir_state_find's name index against a scan, through what passes do to
 * the state list: add, append directly, truncate, reorder in place (then
 * ir_states_truncate), duplicates (the first wins) */
static int scan_state(const IrModule *m, const char *name) {
  const char *s = ts_intern(name);
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].name == s) return i;
  return -1;
}

static void test_state_index(void) {
  IrModule *m = ir_module_new("ix");
  IrState st = {.type = {IR_F32, 1, {3}, {0}}, .kind = IR_STATE_PARAM, .of = -1};
  char name[32];
  for (int i = 0; i < 300; i++) {
    snprintf(name, sizeof name, "s%d", i);
    st.name = name;
    ir_state_add(m, &st);
  }
  int bad = -1;
  for (int i = 0; i < 320 && bad < 0; i++) {
    snprintf(name, sizeof name, "s%d", i);
    if (ir_state_find(m, name) != (i < 300 ? i : -1)) bad = i;
  }
  CHECK(bad < 0, "state index after 300 adds: s%d", bad);
  IrState extra = m->states.a[0];   /* appended directly, as the optimizer's rollback does */
  extra.name = ts_intern("direct");
  VEC_PUSH(m->states, extra);
  extra.name = ts_intern("s7");     /* a duplicate: the first stays the one found */
  VEC_PUSH(m->states, extra);
  CHECK(ir_state_find(m, "direct") == 300 && ir_state_find(m, "s7") == 7, "appended: %d %d",
        ir_state_find(m, "direct"), ir_state_find(m, "s7"));
  ir_states_truncate(m, 100);
  CHECK(m->states.n == 100 && ir_state_find(m, "s150") == -1 && ir_state_find(m, "direct") == -1 &&
        ir_state_find(m, "s99") == 99, "after truncating to 100");
  m->states.n = 50;                 /* removed without the call: the index notices the count */
  CHECK(ir_state_find(m, "s60") == -1 && ir_state_find(m, "s49") == 49, "after shrinking the count directly");
  IrState t = m->states.a[3];       /* reordered in place, then told */
  m->states.a[3] = m->states.a[40];
  m->states.a[40] = t;
  ir_states_truncate(m, m->states.n);
  bad = -1;
  for (int i = 0; i < 60 && bad < 0; i++) {
    snprintf(name, sizeof name, "s%d", i);
    if (ir_state_find(m, name) != scan_state(m, name)) bad = i;
  }
  CHECK(bad < 0 && ir_state_find(m, "s3") == 40 && ir_state_find(m, "s40") == 3, "after a reorder: s%d", bad);
  ir_module_free(m);
}

static void test_basics(void) {
  IrTrain t;
  ir_train_defaults(&t);
  CHECK(t.lr == 3e-4 && t.beta1 == 0.9 && t.beta2 == 0.95 && t.eps == 1e-8 && t.weight_decay == 0.0 &&
        t.schedule == IR_SCHED_CONSTANT && t.warmup == 0 && t.decay_steps == 0 && t.min_lr == 0.0 &&
        t.clip_grad == 0.0 && t.global_batch == 1 && t.micro_batch == 1 && t.seq_len == 0 && t.steps == 100 &&
        t.seed == 1234 && t.precision == IR_F32, "train defaults");
  CHECK(ir_dtype_lookup("f64") == IR_F64 && ir_dtype_lookup("void") == IR_VOID && ir_dtype_lookup("f16") == IR_F16 && ir_dtype_lookup("bf16") == IR_BF16 && ir_dtype_lookup("f8") == -1,
        "dtype lookup");
  CHECK(strcmp(ir_dtype_name(IR_I32), "i32") == 0 && ir_dtype_size(IR_F64) == 8 && ir_dtype_size(IR_I32) == 4,
        "dtype names/sizes");
  CHECK(ir_op_lookup("matmul") == IR_OP_MATMUL && ir_op_lookup("cross_entropy_bwd") == IR_OP_CROSS_ENTROPY_BWD &&
        ir_op_lookup("nope") == -1, "op lookup");
  char buf[128];
  IrType a = {IR_F32, 3, {4, 64, 768}, {ts_intern("batch"), ts_intern("seq"), NULL}};
  CHECK(strcmp(ir_type_str(&a, buf, sizeof buf), "f32[batch:4, seq:64, 768]") == 0, "type_str '%s'", buf);
  IrType s = {IR_F64, 0, {0}, {0}};
  CHECK(strcmp(ir_type_str(&s, buf, sizeof buf), "f64[]") == 0, "scalar type_str '%s'", buf);
  CHECK(strlen(ir_type_str(&a, buf, 8)) == 7, "type_str truncates");
  IrType b = a;
  b.dname[0] = NULL;
  CHECK(ir_type_same_shape(&a, &b) && !ir_type_equal(&a, &b) && ir_type_equal(&a, &a), "type comparisons");
  b.dim[2] = 767;
  CHECK(!ir_type_same_shape(&a, &b) && ir_type_numel(&a) == 4 * 64 * 768 && ir_type_numel(&s) == 1, "numel");
  CHECK(strcmp(ir_state_kind_name(IR_STATE_ADAM_V), "adam_v") == 0 &&
        strcmp(ir_init_kind_name(IR_INIT_UNIFORM), "uniform") == 0 &&
        strcmp(ir_schedule_name(IR_SCHED_LINEAR), "linear") == 0, "enum names");
  IrModule *m = ir_module_new("x");
  int b0 = ir_block_add(m, "forward"), b1 = ir_block_add(m, "update");
  IrState st = {.name = "a.b", .type = {IR_F32, 1, {3}, {0}}, .kind = IR_STATE_PARAM, .of = -1};
  int s0 = ir_state_add(m, &st);
  CHECK(b0 == 0 && b1 == 1 && ir_block_find(m, "update") == 1 && ir_block_find(m, "x") == -1, "blocks");
  CHECK(s0 == 0 && ir_state_find(m, "a.b") == 0 && ir_state_find(m, "a") == -1 && m->states.a[0].name == ts_intern("a.b"),
        "states");
  StrBuf line = {0};
  int in = ir_emit(m, b0, IR_OP_STATE, NULL, 0, (int64_t[]){0}, NULL, NULL, &st.type, buf, sizeof buf);
  ir_emit(m, b0, IR_OP_ACCUM, &in, 1, (int64_t[]){0}, NULL, NULL, NULL, buf, sizeof buf);
  ir_print_node(m, &m->blocks.a[b0], 0, &line);
  sb_puts(&line, "|");
  ir_print_node(m, &m->blocks.a[b0], 1, &line);
  CHECK(strcmp(line.p, "%0 = state @a.b : f32[3]|accum %0 @a.b") == 0, "print_node '%s'", line.p);
  sb_free(&line);
  ir_module_free(m);
  test_state_index();
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--print-op-table") == 0) {   /* to regenerate docs/ir.md */
    StrBuf md = {0};
    ir_ops_markdown(&md);
    fputs(md.p, stdout);
    sb_free(&md);
    return 0;
  }
  test_basics();
  test_all_ops_roundtrip();
  test_emit_roundtrip();
  test_parse_errors();
  test_cp_minor_text();
  test_parse_mangled();
  test_verifier();
  test_verify_training();
  test_docs_table();
  return check_exit("test_ir_text");
}
