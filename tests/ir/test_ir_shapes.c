/* test_ir_shapes.c - every op's shape rule accepts a valid node and rejects
 * an invalid one with a message naming the op.
 *
 * Each case is one node line appended, as node %10, to a fixed prelude of
 * inputs and states and run through the parser (which calls ir_emit, i.e.
 * the shape rule).  A case table entry per op is required: the test fails
 * if an op of ops.def has no case, so new ops must come with one. */
#include "ir/ir.h"
#include "../check.h"

static const char *prelude =
    "module t\n"
    "parallel tp=2 pp=1 cp=1 ep=1 dp=1 sp=0\n"
    "state @p : f32[16, 8] param init=zeros\n"
    "state @g : f32[16, 8] grad of=@p\n"
    "state @m : f32[16, 8] adam_m of=@p\n"
    "state @v : f32[16, 8] adam_v of=@p\n"
    "state @q : f32[8] param init=ones\n"
    "state @s : f32[] scaler start=65536.0\n"
    "state @sg : f32[] scaler start=0.0\n"
    "state @sh : f32[] scaler start=2.0\n"
    "state @sk : f32[] scaler start=0.0\n"
    "block b {\n"
    "  %0 = input \"ids\" : i32[batch:2, seq:4]\n"
    "  %1 = input \"x\" : f32[batch:2, seq:4, dim:8] {2:tp, partial:cp}\n"
    "  %2 = input \"y\" : f32[2, 4, 8]\n"
    "  %3 = input \"w\" : f32[8, 8]\n"
    "  %4 = input \"s\" : f32[]\n"
    "  %5 = input \"z\" : f32[2, 4, 4]\n"
    "  %6 = input \"t\" : f32[16, 8]\n"
    "  %7 = input \"d\" : f64[2, 4, 8]\n"
    "  %8 = input \"l\" : f32[2, 4]\n"
    "  %9 = input \"k\" : f32[2, 4, 16]\n";

typedef struct { const char *op, *good, *bad; } Case;

/* good: must parse; bad: must fail in the shape rule of `op`. */
static const Case cases[] = {
  {"input", "%10 = input \"q\" : f32[3]", "%10 = input : f32[3]"},
  {"state", "%10 = state @p : f32[16, 8]", "%10 = state @p : f32[16, 9]"},
  {"full", "%10 = full value=1.5 : f32[2, 3]", "%10 = full value=1.5 : f32[2199023255553, 3]"},
  {"add", "%10 = add %1, %2 : f32[batch:2, seq:4, dim:8]", "%10 = add %1, %3 : f32[2, 4, 8]"},
  {"sub", "%10 = sub %1, %2 : f32[2, 4, 8]", "%10 = sub %1, %7 : f32[2, 4, 8]"},
  {"mul", "%10 = mul %1, %2 : f32[2, 4, 8]", "%10 = mul %1, %5 : f32[2, 4, 8]"},
  {"div", "%10 = div %2, %1 : f32[2, 4, 8]", "%10 = div %0, %0 : f32[2, 4]"},
  {"adds", "%10 = adds %1 c=2.0 : f32[2, 4, 8]", "%10 = adds %0 c=2.5 : i32[2, 4]"},
  {"muls", "%10 = muls %1 c=0.5 : f32[2, 4, 8]", "%10 = muls %0 c=0.5 : i32[2, 4]"},
  {"neg", "%10 = neg %7 : f64[2, 4, 8]", "%10 = neg %1 : i32[2, 4, 8]"},
  {"exp", "%10 = exp %1 : f32[2, 4, 8]", "%10 = exp %0 : i32[2, 4]"},
  {"log", "%10 = log %1 : f32[2, 4, 8]", "%10 = log %0 : i32[2, 4]"},
  {"sqrt", "%10 = sqrt %1 : f32[2, 4, 8]", "%10 = sqrt %0 : i32[2, 4]"},
  {"rsqrt", "%10 = rsqrt %1 : f32[2, 4, 8]", "%10 = rsqrt %0 : i32[2, 4]"},
  {"tanh", "%10 = tanh %1 : f32[2, 4, 8]", "%10 = tanh %0 : i32[2, 4]"},
  {"gelu_tanh", "%10 = gelu_tanh %1 : f32[2, 4, 8]", "%10 = gelu_tanh %0 : i32[2, 4]"},
  {"gelu_erf", "%10 = gelu_erf %1 : f32[2, 4, 8]", "%10 = gelu_erf %0 : i32[2, 4]"},
  {"silu", "%10 = silu %1 : f32[2, 4, 8]", "%10 = silu %0 : i32[2, 4]"},
  {"relu", "%10 = relu %1 : f32[2, 4, 8]", "%10 = relu %0 : i32[2, 4]"},
  {"gelu_tanh_bwd", "%10 = gelu_tanh_bwd %1, %2 : f32[2, 4, 8]", "%10 = gelu_tanh_bwd %1, %3 : f32[2, 4, 8]"},
  {"gelu_erf_bwd", "%10 = gelu_erf_bwd %1, %2 : f32[2, 4, 8]", "%10 = gelu_erf_bwd %1, %3 : f32[2, 4, 8]"},
  {"silu_bwd", "%10 = silu_bwd %1, %2 : f32[2, 4, 8]", "%10 = silu_bwd %1, %3 : f32[2, 4, 8]"},
  {"relu_bwd", "%10 = relu_bwd %1, %2 : f32[2, 4, 8]", "%10 = relu_bwd %1, %7 : f32[2, 4, 8]"},
  {"eq", "%10 = eq %1, %2 : f32[2, 4, 8]", "%10 = eq %1, %3 : f32[2, 4, 8]"},
  {"ne_scalar", "%10 = ne_scalar %0 c=0.0 : f32[2, 4]", "%10 = ne_scalar %0 c=0.0 : i32[2, 4]"},
  {"cast", "%10 = cast %1 : f64[2, 4, 8]", "%10 = cast %1 : f64[2, 8, 4]"},
  {"cmp", "%10 = cmp %0, %0 pred=2 : i32[2, 4]", "%10 = cmp %0, %8 pred=2 : i32[2, 4]"},
  {"where", "%10 = where %0, %8, %8 : f32[2, 4]", "%10 = where %0, %8, %0 : f32[2, 4]"},
  {"floordiv", "%10 = floordiv %0, %0 : i32[2, 4]", "%10 = floordiv %8, %8 : f32[2, 4]"},
  {"mod", "%10 = mod %0, %0 : i32[2, 4]", "%10 = mod %0, %8 : i32[2, 4]"},
  {"arange", "%10 = arange axis=1 start=0.0 step=1.0 : i32[2, 4]", "%10 = arange axis=2 start=0.0 step=1.0 : i32[2, 4]"},
  {"rand", "%10 = rand stream=0 lo=0.0 hi=5.0 : i32[2, 4]", "%10 = rand stream=0 lo=0.0 hi=2.5 : i32[2, 4]"},
  {"gather", "%10 = gather %8, %0 axis=1 : f32[2, 4]", "%10 = gather %9, %0 axis=1 : f32[2, 4]"},
  {"gather_bwd", "%10 = gather_bwd %0, %8 axis=1 : f32[2, 9]", "%10 = gather_bwd %0, %8 axis=1 : f32[3, 9]"},
  {"reshape", "%10 = reshape %1 : f32[8, 8]", "%10 = reshape %1 : f32[8, 9]"},
  {"permute", "%10 = permute %1 perm=[2, 0, 1] : f32[dim:8, batch:2, seq:4]",
   "%10 = permute %1 perm=[0, 0, 1] : f32[2, 2, 4]"},
  {"slice", "%10 = slice %1 axis=2 start=2 end=6 : f32[2, 4, 4]",
   "%10 = slice %1 axis=2 start=6 end=9 : f32[2, 4, 3]"},
  {"pad", "%10 = pad %1 axis=1 before=1 after=2 : f32[2, 7, 8]",
   "%10 = pad %1 axis=3 before=1 after=2 : f32[2, 7, 8]"},
  {"concat", "%10 = concat %1, %2, %1 axis=2 : f32[2, 4, 24]", "%10 = concat %1, %5 axis=1 : f32[2, 8, 8]"},
  {"broadcast", "%10 = broadcast %8 : f32[3, 2, 4]", "%10 = broadcast %8 : f32[2, 3]"},
  {"sum_to", "%10 = sum_to %1 : f32[1, 4, 8]", "%10 = sum_to %1 : f32[3, 8]"},
  {"sum", "%10 = sum %1 axis=1 keepdim=0 : f32[2, 8]", "%10 = sum %1 axis=3 keepdim=0 : f32[2, 8]"},
  {"mean", "%10 = mean %1 axis=2 keepdim=1 : f32[2, 4, 1]", "%10 = mean %1 axis=0 keepdim=2 : f32[1, 4, 8]"},
  {"max", "%10 = max %1 axis=0 keepdim=0 : f32[4, 8]", "%10 = max %0 axis=0 keepdim=0 : i32[4]"},
  {"sumsq", "%10 = sumsq %1 : f32[]", "%10 = sumsq %0 : i32[]"},
  {"matmul", "%10 = matmul %1, %3 ta=0 tb=1 : f32[2, 4, 8]", "%10 = matmul %1, %6 ta=0 tb=0 : f32[2, 4, 8]"},
  {"softmax", "%10 = softmax %1 : f32[2, 4, 8]", "%10 = softmax %4 : f32[]"},
  {"softmax_bwd", "%10 = softmax_bwd %1, %2 : f32[2, 4, 8]", "%10 = softmax_bwd %1, %5 : f32[2, 4, 8]"},
  {"log_softmax", "%10 = log_softmax %1 : f32[2, 4, 8]", "%10 = log_softmax %0 : i32[2, 4]"},
  {"log_softmax_bwd", "%10 = log_softmax_bwd %1, %2 : f32[2, 4, 8]",
   "%10 = log_softmax_bwd %1, %7 : f32[2, 4, 8]"},
  {"layernorm", "%10 = layernorm %1 eps=1e-05 : f32[2, 4, 8]", "%10 = layernorm %1 eps=0.0 : f32[2, 4, 8]"},
  {"layernorm_bwd", "%10 = layernorm_bwd %1, %2 eps=1e-05 : f32[2, 4, 8]",
   "%10 = layernorm_bwd %1, %5 eps=1e-05 : f32[2, 4, 8]"},
  {"rmsnorm", "%10 = rmsnorm %1 eps=1e-06 : f32[2, 4, 8]", "%10 = rmsnorm %1 eps=-1.0 : f32[2, 4, 8]"},
  {"rmsnorm_bwd", "%10 = rmsnorm_bwd %1, %2 eps=1e-06 : f32[2, 4, 8]",
   "%10 = rmsnorm_bwd %1, %2 eps=0.0 : f32[2, 4, 8]"},
  {"embedding", "%10 = embedding %6, %0 : f32[batch:2, seq:4, 8]", "%10 = embedding %6, %8 : f32[2, 4, 8]"},
  {"embedding_bwd", "%10 = embedding_bwd %0, %1 : f32[16, 8]", "%10 = embedding_bwd %0, %5 : f32[16, 8]"},
  {"causal_mask", "%10 = causal_mask %5 fill=-inf : f32[2, 4, 4]", "%10 = causal_mask %4 fill=-inf : f32[]"},
  {"masked_fill", "%10 = masked_fill %1, %2 fill=0.0 : f32[2, 4, 8]",
   "%10 = masked_fill %1, %5 fill=0.0 : f32[2, 4, 8]"},
  {"dropout", "%10 = dropout %1 stream=3 p=0.1 : f32[2, 4, 8]", "%10 = dropout %1 stream=3 p=1.0 : f32[2, 4, 8]"},
  /* rank-4 operands: no prelude value has them; cases in test_attention() */
  {"attention", NULL, NULL},
  /* a position operand (i32 []) and a cache state: cases in test_decode() */
  {"kv_write", NULL, NULL},
  {"attn_cached", NULL, NULL},
  {"rope_at", NULL, NULL},
  {"slice_at", NULL, NULL},
  {"attention_bwd", NULL, NULL},
  {"rope", "%10 = rope %1 axis=1 inverse=0 base=10000.0 : f32[2, 4, 8]",
   "%10 = rope %1 axis=2 inverse=0 base=10000.0 : f32[2, 4, 8]"},
  {"topk_mask", "%10 = topk_mask %1 k=2 : f32[2, 4, 8]", "%10 = topk_mask %1 k=9 : f32[2, 4, 8]"},
  {"capacity_mask", "%10 = capacity_mask %1 cap=3 : f32[2, 4, 8]", "%10 = capacity_mask %1 cap=-1 : f32[2, 4, 8]"},
  /* token dispatch: %6 serves as tokens [16, 8], routing mask [16 tokens, 8
   * experts] and scale at once; gmm / gmm_dw need i32 counts and 3-D
   * weights that match: cases in test_moe() */
  {"moe_counts", "%10 = moe_counts %6 : i32[1, 8]", "%10 = moe_counts %1 : i32[1, 8]"},
  {"moe_perm", "%10 = moe_perm %6, %6, %6 rows=32 : f32[32, 8]", "%10 = moe_perm %6, %6, %6 rows=0 : f32[1, 8]"},
  {"moe_unperm", "%10 = moe_unperm %6, %6, %6 : f32[16, 8]", "%10 = moe_unperm %6, %6, %3 : f32[16, 8]"},
  {"moe_gate_grad", "%10 = moe_gate_grad %3, %6, %6 : f32[16, 8]", "%10 = moe_gate_grad %3, %3, %6 : f32[16, 8]"},
  {"gmm", NULL, NULL},
  {"gmm_dw", NULL, NULL},
  {"cross_entropy", "%10 = cross_entropy %9, %0 ignore=-1 : f32[batch:2, seq:4]",
   "%10 = cross_entropy %9, %8 ignore=-1 : f32[2, 4]"},
  {"cross_entropy_bwd", "%10 = cross_entropy_bwd %9, %0, %8 ignore=-1 : f32[2, 4, 16]",
   "%10 = cross_entropy_bwd %9, %0, %1 ignore=-1 : f32[2, 4, 16]"},
  {"clip_coef", "%10 = clip_coef %4 max=1.0 : f32[]", "%10 = clip_coef %8 max=1.0 : f32[]"},
  {"accum", "accum %6 @g", "accum %1 @g"},
  {"zero", "zero @g", NULL},    /* an unknown state is a parse error; see test_zero_bad_ref */
  {"adamw", "adamw %4, %6 @p @m @v b1=0.9 b2=0.95 eps=1e-08 wd=0.1",
   "adamw %4, %1 @p @m @v b1=0.9 b2=0.95 eps=1e-08 wd=0.1"},
  {"sgd", "sgd %4, %6 @p @m mom=0.9 nesterov=1.0 wd=0.1", "sgd %4, %6 @p @m mom=0.9 nesterov=2.0 wd=0.1"},
  {"lion", "lion %4, %6 @p @m b1=0.9 b2=0.99 wd=0.1", "lion %4, %1 @p @m b1=0.9 b2=0.99 wd=0.1"},
  {"lr_step", "lr_step %6 @p scale=1.5 wd=0.1", "lr_step %6 @p scale=0.0 wd=0.1"},
  {"assign", "assign %6 @p", "assign %1 @p"},
  {"nonfinite", "%10 = nonfinite %6 : f32[]", "%10 = nonfinite %0 : f32[]"},
  {"scale_update", "scale_update %4 @s @sg @sh @sk window=1000 hysteresis=2 dynamic=1 min=1.0",
   "scale_update %4 @s @sg @sh @p window=1000 hysteresis=2 dynamic=1 min=1.0"},
  {"all_to_all", "%10 = all_to_all %1 axis=tp split=2 concat=0 : f32[4, 4, 4]",
   "%10 = all_to_all %3 axis=tp split=3 concat=0 : f32[2, 4, 8]"},
  /* needs i32 counts: cases in test_moe() */
  {"all_to_all_v", NULL, NULL},
  /* fp8 values and fp8 states: cases in test_fp8() */
  {"quant8", NULL, NULL},
  {"amax_acc", NULL, NULL},
  {"matmul8", NULL, NULL},
  {"fp8_scale", NULL, NULL},
  /* rank-4 operands: cases in test_attention() */
  {"ring_shift", NULL, NULL},
  {"ring_wait", NULL, NULL},
  {"attn_acc", NULL, NULL},
  {"attn_finish", NULL, NULL},
  {"attn_lse", NULL, NULL},
  {"attn_bwd_q", NULL, NULL},
  {"attn_bwd_kv", NULL, NULL},
  {"all_reduce", "%10 = all_reduce %1 axis=tp red=1 : f32[2, 4, 8]", "%10 = all_reduce %1 axis=tp red=2 : f32[2, 4, 8]"},
  {"all_gather", "%10 = all_gather %1 axis=tp dim=2 : f32[2, 4, 16]", "%10 = all_gather %1 axis=tp dim=3 : f32[2, 4, 16]"},
  {"reduce_scatter", "%10 = reduce_scatter %1 axis=cp dim=1 : f32[2, 4, 8] {1:cp, 2:tp}",
   "%10 = reduce_scatter %0 axis=tp dim=1 : i32[2, 2]"},
  {"shard_slice", "%10 = shard_slice %0 axis=tp dim=1 : i32[2, 2] {1:tp}", "%10 = shard_slice %1 axis=tp dim=-1 : f32[2, 4, 8]"},
  {"take", "%10 = take %9, %0 ignore=-1 : f32[2, 4]", "%10 = take %9, %8 ignore=-1 : f32[2, 4]"},
  {"onehot", "%10 = onehot %0 ignore=-1 : f32[2, 4, 16]", "%10 = onehot %0 ignore=-1 : f32[2, 3, 16]"},
  {"pad_fill", "%10 = pad_fill %9 dim=2 limit=10 fill=-inf : f32[2, 4, 16]",
   "%10 = pad_fill %9 dim=3 limit=10 fill=-inf : f32[2, 4, 16]"},
  {"output", "output \"loss\" %4", "output \"loss\" %8"},
  {"send", "send %1 axis=pp peer=1 tag=0", NULL},   /* a bad axis is a parse error */
  {"recv", "%10 = recv axis=pp peer=-1 tag=0 : f32[2, 4, 8]", NULL},
  {"stash", "stash %1 slot=0", "stash %1 slot=-1"},
  {"unstash", "%10 = unstash slot=2 : f32[2, 4, 8]", "%10 = unstash slot=-1 : f32[2, 4, 8]"},
  {"group_sum", "%10 = group_sum %1 axis=pp ranks=3 : f32[2, 4, 8]", "%10 = group_sum %1 axis=pp ranks=0 : f32[2, 4, 8]"},
};

static IrModule *parse_case(const char *line, char *err, size_t errlen) {
  StrBuf b = {0};
  /* the pipeline ops live in pipeline blocks: block b is renamed for them */
  const char *name = strstr(line, "unstash ") ? "bwd.0"
                   : strstr(line, "send ") || strstr(line, "recv ") || strstr(line, "stash ") ? "fwd.0" : "b";
  const char *at = strstr(prelude, "block b {");
  sb_printf(&b, "%.*sblock %s {%s", (int)(at - prelude), prelude, name, at + strlen("block b {"));
  sb_printf(&b, "  %s\n}\nend\n", line);
  IrModule *m = ir_parse_module(b.p, "case", err, errlen);
  sb_free(&b);
  return m;
}

/* zero's only way to be wrong is a bad state index, which the text cannot
 * express (unknown names fail in the parser); check it through ir_emit. */
static void test_zero_bad_ref(void) {
  IrModule *m = ir_module_new("z");
  int b = ir_block_add(m, "update");
  char err[256] = "";
  int r = ir_emit(m, b, IR_OP_ZERO, NULL, 0, (int64_t[]){3}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "zero: ") && strstr(err, "state"), "got %d '%s'", r, err);
  CHECK(m->blocks.a[b].n == 0, "block changed on error");
  ir_module_free(m);
}

/* attention and attention_bwd through ir_emit: q [2, 4, 6, 8], k / v
 * [2, 2, 5, 8] (grouped-query, two query heads per kv head). */
static void test_attention(void) {
  IrModule *m = ir_module_new("a");
  int b = ir_block_add(m, "forward");
  char err[256] = "";
  IrType tq = {IR_F64, 4, {2, 4, 6, 8}, {0}}, tk = {IR_F64, 4, {2, 2, 5, 8}, {0}}, t3 = {IR_F64, 4, {2, 3, 5, 8}, {0}};
  int q = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "q", &tq, err, sizeof err);
  int k = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "k", &tk, err, sizeof err);
  int k3 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "k3", &t3, err, sizeof err);
  double sc = 0.125;
  int o = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k}, 3, (int64_t[]){1, 0, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(o >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[o].type, &tq), "attention: %s", err);
  int r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k3, k3}, 3, (int64_t[]){1, 0, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "attention: ") && strstr(err, "multiple"), "heads 4 / 3: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k}, 3, (int64_t[]){2, 0, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "attention: "), "causal=2: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k}, 3, (int64_t[]){1, -2, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "window must be >= 0"), "window=-2: %d '%s'", r, err);
  /* document ids: i32 [B, T] last */
  IrType td = {IR_I32, 2, {tq.dim[0], tq.dim[2]}, {NULL}}, tdf = td, td3 = td;
  tdf.dtype = IR_F32;
  td3.dim[0] = tq.dim[0] + 1;
  int dd = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "docs", &td, err, sizeof err);
  int ddf = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "docsf", &tdf, err, sizeof err);
  int dd3 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "docs3", &td3, err, sizeof err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, dd}, 4, (int64_t[]){1, 3, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "attention with documents and a window: %s", err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, ddf}, 4, (int64_t[]){1, 0, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "document ids"), "f32 document ids: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, dd3}, 4, (int64_t[]){1, 0, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "document ids"), "document ids of another batch: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, dd, dd}, 5, (int64_t[]){1, 0, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "takes 3 operands, or 4"), "five operands: %d '%s'", r, err);
  for (int part = 0; part < 3 && o >= 0; part++) {
    r = ir_emit(m, b, IR_OP_ATTENTION_BWD, (int[]){q, k, k, o, o}, 5, (int64_t[]){1, part, 0, 0, 0}, &sc, NULL, NULL, err,
                sizeof err);
    CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, part ? &tk : &tq), "part %d: %s", part, err);
  }
  r = ir_emit(m, b, IR_OP_ATTENTION_BWD, (int[]){q, k, k, o, o}, 5, (int64_t[]){1, 3, 0, 0, 0}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "attention_bwd: ") && strstr(err, "part"), "part 3: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION_BWD, (int[]){q, k, k, k, o}, 5, (int64_t[]){1, 0, 0, 0, 0}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "attention_bwd: "), "o shaped like k: %d '%s'", r, err);
  /* ALiBi: alibi=1 and the slopes [Hq] (f32 or f64; whole when the heads
   * are split, so a multiple of q's heads) after v, before the documents */
  IrType tsl = {IR_F32, 1, {tq.dim[1]}, {NULL}}, tsl3 = tsl, tsl8 = tsl, tsli = tsl;
  tsl3.dim[0] = 3;
  tsl8.dim[0] = 8;
  tsli.dtype = IR_I32;
  int sl = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "sl", &tsl, err, sizeof err);
  int sl3 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "sl3", &tsl3, err, sizeof err);
  int sl8 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "sl8", &tsl8, err, sizeof err);
  int sli = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "sli", &tsli, err, sizeof err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, sl, dd}, 5, (int64_t[]){1, 3, 1, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "attention with slopes, documents and a window: %s", err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, sl8}, 4, (int64_t[]){1, 0, 1, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "slopes of 8 heads (4 here, the rest on another tp rank): %s", err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, sl3}, 4, (int64_t[]){1, 0, 1, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "ALiBi slopes"), "3 slopes for 4 heads: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, sli}, 4, (int64_t[]){1, 0, 1, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "ALiBi slopes"), "i32 slopes: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k}, 3, (int64_t[]){1, 0, 1, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "takes 4 operands (the slopes last)"), "alibi=1 without slopes: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, sl}, 4, (int64_t[]){1, 0, 2, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "alibi must be 0 or 1"), "alibi=2: %d '%s'", r, err);
  /* slopes with a q that is not [B, H, T, D] (here the slopes [4]
   * themselves: its dim 1 reads as 0): refused, not a division by zero
   * (ir.fuzz found it: SIGFPE in the slopes' check) */
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){sl, k, k, sl}, 4, (int64_t[]){1, 0, 1, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1, "slopes with a 1-D q accepted");
  /* an additive score bias: bias=1 and [Hq or 1, Tq, Tk] of q's dtype after
   * the slopes, before the documents; attention_bwd part=3 is its gradient */
  IrType tb = {IR_F64, 3, {4, 6, 5}, {NULL}}, tb1 = tb, tbt = tb, tbf = tb;
  tb1.dim[0] = 1;
  tbt.dim[2] = 6;   /* the queries' length where the keys' belongs */
  tbf.dtype = IR_F32;
  int bs = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "bs", &tb, err, sizeof err);
  int bs1 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "bs1", &tb1, err, sizeof err);
  int bst = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "bst", &tbt, err, sizeof err);
  int bsf = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "bsf", &tbf, err, sizeof err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, sl, bs, dd}, 6, (int64_t[]){1, 3, 1, 1}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r >= 0, "attention with slopes, a score bias and documents: %s", err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, bs1}, 4, (int64_t[]){0, 0, 0, 1}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "one bias head for all: %s", err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, bst}, 4, (int64_t[]){0, 0, 0, 1}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "score bias"), "bias [4, 6, 6] for 5 keys: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, bsf}, 4, (int64_t[]){0, 0, 0, 1}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "score bias"), "f32 bias, f64 q: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k}, 3, (int64_t[]){0, 0, 0, 1}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "takes 4 operands (the score bias last)"), "bias=1 without it: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTENTION, (int[]){q, k, k, bs}, 4, (int64_t[]){0, 0, 0, 2}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "bias must be 0 or 1"), "bias=2: %d '%s'", r, err);
  int ob = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "ob", &tq, err, sizeof err);
  r = ir_emit(m, b, IR_OP_ATTENTION_BWD, (int[]){q, k, k, ob, ob, bs1}, 6, (int64_t[]){0, 3, 0, 0, 1}, &sc, NULL, NULL,
              err, sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &tb1), "dbias (part 3) shaped like the bias: %s",
        err);
  r = ir_emit(m, b, IR_OP_ATTENTION_BWD, (int[]){q, k, k, ob, ob, bs1}, 6, (int64_t[]){0, 4, 0, 0, 1}, &sc, NULL, NULL,
              err, sizeof err);
  CHECK(r == -1 && strstr(err, "3 (dbias)"), "part 4: %d '%s'", r, err);
  /* the ring steps: state [2, 4, 6, 10], lse / drow [2, 4, 6] */
  IrType ts = tq, tl = tq, ts9 = tq;
  ts.dim[3] = 10;
  ts9.dim[3] = 9;
  tl.rank = 3;
  int st = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "st", &ts, err, sizeof err);
  int st9 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "st9", &ts9, err, sizeof err);
  int ls = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "lse", &tl, err, sizeof err);
  r = ir_emit(m, b, IR_OP_ATTN_ACC, (int[]){q, k, k, st}, 4, (int64_t[]){1, 3, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &ts), "attn_acc: %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_ACC, (int[]){q, k, k, st9}, 4, (int64_t[]){1, 0, 0, 0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "head_dim + 2"), "attn_acc with a [.., 9] state: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTN_FINISH, &st, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &tq), "attn_finish: %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_LSE, &st, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &tl), "attn_lse: %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_BWD_Q, (int[]){q, k, k, q, ls, ls, q}, 7, (int64_t[]){1, 1, 0, 0}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &tq), "attn_bwd_q: %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_BWD_KV, (int[]){q, k, k, q, ls, ls, k}, 7, (int64_t[]){0, 1, 2, 0, 0}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &tk), "attn_bwd_kv: %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_BWD_KV, (int[]){q, k, k, q, ls, ls, q}, 7, (int64_t[]){0, 1, 1, 0, 0}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "accumulator"), "attn_bwd_kv with a q-shaped accumulator: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTN_BWD_KV, (int[]){q, k, k, q, ls, ls, k}, 7, (int64_t[]){0, 1, 0, 0, 0}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "part"), "attn_bwd_kv part=0: %d '%s'", r, err);
  int sh = ir_emit(m, b, IR_OP_RING_SHIFT, &k, 1, (int64_t[]){IR_AXIS_CP}, NULL, NULL, NULL, err, sizeof err);
  CHECK(sh >= 0, "ring_shift: %s", err);
  r = ir_emit(m, b, IR_OP_RING_WAIT, &sh, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &tk), "ring_wait: %s", err);
  r = ir_emit(m, b, IR_OP_RING_WAIT, &k, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "ring_shift"), "ring_wait of an input: %d '%s'", r, err);
  ir_module_free(m);
}

/* gmm and gmm_dw through ir_emit: rows a [10, 3], counts i32 [2, 4] (2
 * sources, 4 experts), w [4, 3, 5]. */
/* pass decode's ops: kv_write, attn_cached, rope_at, slice_at (the
 * position an i32 scalar; kv_write's state a cache of x's dims but along
 * its axis). */
static void test_decode(void) {
  IrModule *m = ir_module_new("d");
  IrState c = {0}, pa = {0};
  c.name = ts_intern("cache.0.k");
  c.kind = IR_STATE_CACHE;
  c.of = -1;
  c.type = (IrType){IR_F64, 4, {1, 2, 16, 8}, {0}};
  pa = c;
  pa.name = ts_intern("w");
  pa.kind = IR_STATE_PARAM;
  int cs = ir_state_add(m, &c), ps = ir_state_add(m, &pa);
  int b = ir_block_add(m, "step");
  char err[256] = "";
  IrType tq = {IR_F64, 4, {1, 4, 1, 8}, {0}}, tk = {IR_F64, 4, {1, 2, 1, 8}, {0}}, tp = {IR_I32, 0, {0}, {0}};
  IrType tpf = {IR_F64, 0, {0}, {0}}, tk3 = {IR_F64, 4, {1, 3, 16, 8}, {0}};
  int q = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "q", &tq, err, sizeof err);
  int k = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "k", &tk, err, sizeof err);
  int pos = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "pos", &tp, err, sizeof err);
  int posf = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "posf", &tpf, err, sizeof err);
  int kc = ir_emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){cs}, NULL, NULL, &c.type, err, sizeof err);
  int k3 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "k3", &tk3, err, sizeof err);
  int r = ir_emit(m, b, IR_OP_KV_WRITE, (int[]){k, pos}, 2, (int64_t[]){cs, 2}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "kv_write: %s", err);
  r = ir_emit(m, b, IR_OP_KV_WRITE, (int[]){q, pos}, 2, (int64_t[]){cs, 2}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "kv_write: ") && strstr(err, "does not fit"), "kv_write of 4 heads: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_KV_WRITE, (int[]){k, posf}, 2, (int64_t[]){cs, 2}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "i32 scalar"), "kv_write at an f64 position: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_KV_WRITE, (int[]){k, pos}, 2, (int64_t[]){ps, 2}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "expected kind cache"), "kv_write into a param: %d '%s'", r, err);
  double sc = 0.125;
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc, pos}, 4, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &tq), "attn_cached: %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, k3, k3, pos}, 4, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "attn_cached: ") && strstr(err, "multiple"), "attn_cached 4 / 3 heads: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc, posf}, 4, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "i32 scalar"), "attn_cached at an f64 position: %d '%s'", r, err);
  /* ALiBi: a fifth operand, f32 / f64 [heads], every query head's (4 here, or 8 when tp splits them in 2) */
  IrType ts4 = {IR_F64, 1, {4}, {0}}, ts8 = {IR_F32, 1, {8}, {0}}, ts3 = {IR_F64, 1, {3}, {0}}, tsi = {IR_I32, 1, {4}, {0}};
  int s4 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "s4", &ts4, err, sizeof err);
  int s8 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "s8", &ts8, err, sizeof err);
  int s3 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "s3", &ts3, err, sizeof err);
  int si = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "si", &tsi, err, sizeof err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc, pos, s4}, 5, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "attn_cached with 4 slopes: %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc, pos, s8}, 5, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "attn_cached with 8 f32 slopes (heads split): %s", err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc, pos, s3}, 5, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "ALiBi slopes f64[3]") && strstr(err, "one per query head"),
        "attn_cached with 3 slopes for 4 heads: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc, pos, si}, 5, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "must be f32 or f64"), "attn_cached with i32 slopes: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc}, 3, (int64_t[]){0}, &sc, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "takes 4 operands"), "attn_cached with 3 operands: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ATTN_CACHED, (int[]){q, kc, kc, pos, s4, s4}, 6, (int64_t[]){0}, &sc, NULL, NULL, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "takes 4 operands"), "attn_cached with 6 operands: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ROPE_AT, (int[]){q, pos}, 2, (int64_t[]){2, 0}, (double[]){10000.0}, NULL, NULL, err, sizeof err);
  CHECK(r >= 0, "rope_at: %s", err);
  r = ir_emit(m, b, IR_OP_ROPE_AT, (int[]){q, pos}, 2, (int64_t[]){3, 0}, (double[]){10000.0}, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "rope_at: ") && strstr(err, "before the last"), "rope_at on the last axis: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_SLICE_AT, (int[]){kc, pos}, 2, (int64_t[]){2, 1}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && m->blocks.a[b].nodes[r].type.dim[2] == 1, "slice_at: %s", err);
  r = ir_emit(m, b, IR_OP_SLICE_AT, (int[]){kc, pos}, 2, (int64_t[]){2, 17}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "slice_at: ") && strstr(err, "size=17"), "slice_at of 17 of 16: %d '%s'", r, err);
  CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  ir_module_free(m);
}

static void test_moe(void) {
  IrModule *m = ir_module_new("moe");
  int b = ir_block_add(m, "forward");
  char err[256] = "";
  IrType ta = {IR_F64, 2, {10, 3}, {0}}, tw = {IR_F64, 3, {4, 3, 5}, {0}}, tc = {IR_I32, 2, {2, 4}, {0}};
  IrType tc3 = {IR_I32, 2, {2, 3}, {0}}, tf = {IR_F64, 2, {2, 4}, {0}};
  int a = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "a", &ta, err, sizeof err);
  int w = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "w", &tw, err, sizeof err);
  int c = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "c", &tc, err, sizeof err);
  int c3 = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "c3", &tc3, err, sizeof err);
  int cf = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "cf", &tf, err, sizeof err);
  int y = ir_emit(m, b, IR_OP_GMM, (int[]){a, w, c}, 3, (int64_t[]){0}, NULL, NULL, NULL, err, sizeof err);
  IrType ty = {IR_F64, 2, {10, 5}, {0}};
  CHECK(y >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[y].type, &ty), "gmm: %s", err);
  int r = ir_emit(m, b, IR_OP_GMM, (int[]){y, w, c}, 3, (int64_t[]){1}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[r].type, &ta), "gmm tb=1: %s", err);
  r = ir_emit(m, b, IR_OP_GMM, (int[]){a, w, c}, 3, (int64_t[]){1}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "gmm: ") && strstr(err, "inner"), "gmm tb=1 on [4, 3, 5]: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_GMM, (int[]){a, w, c3}, 3, (int64_t[]){0}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "gmm: ") && strstr(err, "counts"), "3 groups for 4 weights: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_GMM, (int[]){a, w, cf}, 3, (int64_t[]){0}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "gmm: ") && strstr(err, "i32"), "float counts: %d '%s'", r, err);
  if (y >= 0) {
    int g = ir_emit(m, b, IR_OP_GMM_DW, (int[]){a, y, c}, 3, NULL, NULL, NULL, NULL, err, sizeof err);
    CHECK(g >= 0 && ir_type_same_shape(&m->blocks.a[b].nodes[g].type, &tw), "gmm_dw: %s", err);
    r = ir_emit(m, b, IR_OP_GMM_DW, (int[]){a, w, c}, 3, NULL, NULL, NULL, NULL, err, sizeof err);
    CHECK(r == -1 && strstr(err, "gmm_dw: "), "gmm_dw with a 3-D dy: %d '%s'", r, err);
  }
  /* all_to_all_v: local counts [1, 8] and received [2, 4] (8 experts over 2
   * sources); typed, so the result row count is the caller's */
  IrType tl = {IR_I32, 2, {1, 8}, {0}}, tx = {IR_F64, 2, {14, 3}, {0}}, tb = {IR_F64, 2, {7, 3}, {0}};
  int cl = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "cl", &tl, err, sizeof err);
  r = ir_emit(m, b, IR_OP_ALL_TO_ALL_V, (int[]){a, cl, c}, 3, (int64_t[]){IR_AXIS_EP, 0}, NULL, NULL, &tx, err,
              sizeof err);
  CHECK(r >= 0, "all_to_all_v: %s", err);
  r = ir_emit(m, b, IR_OP_ALL_TO_ALL_V, (int[]){a, c, c}, 3, (int64_t[]){IR_AXIS_EP, 0}, NULL, NULL, &tx, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "local counts"), "all_to_all_v with [2, 4] local counts: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_ALL_TO_ALL_V, (int[]){a, cl, c3}, 3, (int64_t[]){IR_AXIS_EP, 1}, NULL, NULL, &tx, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "received counts"), "all_to_all_v with [2, 3] received counts: %d '%s'", r, err);
  tb.dim[1] = 4;
  r = ir_emit(m, b, IR_OP_ALL_TO_ALL_V, (int[]){a, cl, c}, 3, (int64_t[]){IR_AXIS_EP, 0}, NULL, NULL, &tb, err,
              sizeof err);
  CHECK(r == -1 && strstr(err, "width"), "all_to_all_v to 4 columns: %d '%s'", r, err);
  ir_module_free(m);
}

/* ir_emit's message names the op and both operand types (the brief's example). */
static void test_emit_message(void) {
  IrModule *m = ir_module_new("e");
  int b = ir_block_add(m, "forward");
  char err[256] = "";
  IrType ta = {IR_F32, 2, {4, 64}, {0}}, tb = {IR_F32, 2, {32, 8}, {0}};
  int a = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "a", &ta, err, sizeof err);
  int c = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "b", &tb, err, sizeof err);
  CHECK(a == 0 && c == 1, "inputs %d %d: %s", a, c, err);
  int r = ir_emit(m, b, IR_OP_MATMUL, (int[]){a, c}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1, "matmul accepted");
  CHECK(strcmp(err, "matmul: operand shapes f32[4, 64] and f32[32, 8] do not contract (64 vs 32)") == 0,
        "message '%s'", err);
  CHECK(m->blocks.a[b].n == 2, "block changed on error");
  /* transposed b contracts: [4,64] @ [32,8]^T is still wrong, [4,64] @ [8,64]^T is right */
  IrType tc = {IR_F32, 2, {8, 64}, {ts_intern("out"), ts_intern("in")}};
  int w = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "w", &tc, err, sizeof err);
  r = ir_emit(m, b, IR_OP_MATMUL, (int[]){a, w}, 2, (int64_t[]){0, 1}, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == 3, "matmul tb=1: %s", err);
  if (r == 3) {
    const IrType *t = &m->blocks.a[b].nodes[r].type;
    CHECK(t->rank == 2 && t->dim[0] == 4 && t->dim[1] == 8 && t->dname[1] == ts_intern("out"),
          "matmul result %s", ir_type_str(t, err, sizeof err));
  }
  /* short attr arrays are fine: only the op's named slots are read */
  int64_t perm[2] = {1, 0};
  r = ir_emit(m, b, IR_OP_PERMUTE, (int[]){w}, 1, perm, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == 4 && m->blocks.a[b].nodes[r].type.dim[0] == 64 &&
        m->blocks.a[b].nodes[r].type.dname[0] == ts_intern("in"), "permute: %s", err);
  /* wrong arity, out-of-range operand, typed op without a type */
  r = ir_emit(m, b, IR_OP_ADD, (int[]){a}, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "add: "), "arity: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_NEG, (int[]){99}, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "neg: "), "operand range: %d '%s'", r, err);
  r = ir_emit(m, b, IR_OP_RESHAPE, (int[]){a}, 1, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "reshape: "), "typed without type: %d '%s'", r, err);
  ir_module_free(m);
}

/* matmul (OPF_MIXED): bf16 / f16 operands read as they are, the result in
 * their dtype (inferred) or f32 (given); everything else refused with the
 * pairs that work.  The verifier and the text agree (round trip). */
static void test_matmul16(void) {
  IrModule *m = ir_module_new("mm16");
  int b = ir_block_add(m, "forward");
  char err[512] = "";
  IrType ta = {IR_BF16, 2, {4, 8}, {0}}, tb = {IR_BF16, 2, {8, 3}, {0}}, tf = {IR_F32, 2, {8, 3}, {0}},
         th = {IR_F16, 2, {8, 3}, {0}};
  int a = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "a", &ta, err, sizeof err);
  int w = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "w", &tb, err, sizeof err);
  int wf = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "wf", &tf, err, sizeof err);
  int wh = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "wh", &th, err, sizeof err);
  int r = ir_emit(m, b, IR_OP_MATMUL, (int[]){a, w}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r >= 0 && m->blocks.a[b].nodes[r].type.dtype == IR_BF16, "bf16 @ bf16 -> bf16: %d '%s'", r, err);
  IrType want = {.dtype = IR_F32};
  r = ir_emit(m, b, IR_OP_MATMUL, (int[]){a, w}, 2, NULL, NULL, NULL, &want, err, sizeof err);
  CHECK(r >= 0 && m->blocks.a[b].nodes[r].type.dtype == IR_F32 && m->blocks.a[b].nodes[r].type.dim[1] == 3,
        "bf16 @ bf16 -> f32 given: %d '%s'", r, err);
  want.dtype = IR_F64;
  r = ir_emit(m, b, IR_OP_MATMUL, (int[]){a, w}, 2, NULL, NULL, NULL, &want, err, sizeof err);
  CHECK(r == -1 && strstr(err, "result dtype f64: a matmul of bf16 operands stores bf16 or f32"), "-> f64: '%s'", err);
  want.dtype = IR_BF16;
  r = ir_emit(m, b, IR_OP_MATMUL, (int[]){wf, wf}, 2, (int64_t[]){1, 0}, NULL, NULL, &want, err, sizeof err);
  CHECK(r == -1 && strstr(err, "result dtype bf16: a matmul of f32 operands stores f32"), "f32 -> bf16: '%s'", err);
  r = ir_emit(m, b, IR_OP_MATMUL, (int[]){a, wf}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "must have the same float dtype") && strstr(err, "pass precision rounds"),
        "bf16 @ f32: '%s'", err);
  r = ir_emit(m, b, IR_OP_MATMUL, (int[]){a, wh}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "same float dtype"), "bf16 @ f16: '%s'", err);
  /* other arithmetic still reads 16 bits only through a cast */
  r = ir_emit(m, b, IR_OP_ADD, (int[]){a, a}, 2, NULL, NULL, NULL, NULL, err, sizeof err);
  CHECK(r == -1 && strstr(err, "a storage type"), "add of bf16: '%s'", err);
  CHECK(ir_op_reads_16(IR_OP_MATMUL) && !ir_op_reads_16(IR_OP_ADD) && !ir_op_reads_16(IR_OP_GMM), "ir_op_reads_16");
  CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  /* printed and parsed back: the given f32 survives the text */
  StrBuf t1 = {0}, t2 = {0};
  ir_print_module(m, &t1);
  IrModule *m2 = ir_parse_module(t1.p, "mm16.ir", err, sizeof err);
  CHECK(m2 != NULL, "reparse: %s", err);
  if (m2) {
    ir_print_module(m2, &t2);
    CHECK(t1.n == t2.n && !memcmp(t1.p, t2.p, t1.n), "round trip:\n%s\n---\n%s", t1.p, t2.p);
    CHECK(strstr(t2.p, "matmul %0, %1 ta=0 tb=0 : f32[4, 3]") != NULL, "the f32 result printed: %s", t2.p);
    ir_module_free(m2);
  }
  free(t1.p);
  free(t2.p);
  ir_module_free(m);
}

/* --fp8's ops (passes/fp8.c): a valid block, and one bad node per op whose
 * rule must name it */
static const char *fp8_text =
    "module t\n"
    "parallel tp=1 pp=1 cp=1 ep=1 dp=1 sp=0\n"
    "state @fa : f32[] fp8 start=0.0\n"
    "state @fh : f32[4] fp8 start=0.0\n"
    "state @fs : f32[] fp8 start=1.0\n"
    "state @fi : f32[] fp8 start=1.0\n"
    "block b {\n"
    "  %0 = input \"x\" : f32[4, 8]\n"
    "  %1 = input \"w\" : f32[8, 8]\n"
    "  %2 = state @fs : f32[]\n"
    "  %3 = quant8 %0, %2 : f8e4m3[4, 8]\n"
    "  %4 = quant8 %1, %2 : f8e5m2[8, 8]\n"
    "  %5 = state @fi : f32[]\n"
    "  %6 = matmul8 %3, %4, %5, %5 ta=0 tb=1 : bf16[4, 8]\n"
    "  amax_acc %0 @fa\n"
    "  fp8_scale %2 @fh @fs @fi algo=0 margin=0.0 fmax=448.0\n"
    "}\n"
    "end\n";

static void test_fp8(void) {
  char err[512];
  IrModule *m = ir_parse_module(fp8_text, "fp8", err, sizeof err);
  CHECK(m != NULL && ir_verify(m, err, sizeof err) == 0, "fp8 block: %s", err);
  if (m) ir_module_free(m);
  static const char *bad[][3] = {
      {"quant8 %0, %2 : f8e4m3", "quant8 %0, %0 : f8e4m3", "error: quant8: scale"},
      {"quant8 %1, %2 : f8e5m2[8, 8]", "quant8 %1, %2 : f8e5m2[8, 4]", "error: quant8: result"},
      {"ta=0 tb=1 : bf16[4, 8]", "ta=0 tb=1 : bf16[4, 7]", "error: matmul8: result bf16[4, 7]"},
      {"ta=0 tb=1 : bf16[4, 8]", "ta=0 tb=1 : f16[4, 8]", "error: matmul8: result dtype f16"},
      {"amax_acc %0 @fa", "amax_acc %0 @fh", "error: amax_acc: @fh is a fp8 f32[4]"},
      {"algo=0 margin", "algo=2 margin", "error: fp8_scale: algo=2"},
      {"fmax=448.0", "fmax=0.0", "error: fp8_scale: margin"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *at = strstr(fp8_text, bad[i][0]);
    CHECK(at != NULL, "fp8 case %zu", i);
    if (!at) continue;
    char t[2048];
    snprintf(t, sizeof t, "%.*s%s%s", (int)(at - fp8_text), fp8_text, bad[i][1], at + strlen(bad[i][0]));
    err[0] = 0;
    m = ir_parse_module(t, "fp8", err, sizeof err);
    CHECK(m == NULL && strstr(err, bad[i][2]), "fp8 case %zu: want '%s', got '%s'", i, bad[i][2], m ? "accepted" : err);
    if (m) ir_module_free(m);
  }
}

/* Collectives over a set of mesh axes (ZeRO-1 over dp x cp: ir.h,
 * IR_AXES_SET): "axis=dp+cp" parses to the set, prints back the same, sizes
 * are the product; one axis stays the plain IrAxis; the ops that take one
 * axis refuse a set; the verifier wants the value partial (split) over
 * every axis of the set. */
static const char *axes_text =
    "module t\n"
    "parallel tp=1 pp=1 cp=2 ep=1 dp=3 sp=0\n"
    "block update {\n"
    "  %0 = input \"g\" : f32[24] {partial:dp+cp}\n"
    "  %1 = reduce_scatter %0 axis=dp+cp dim=0 : f32[4] {0:dp+cp*}\n"
    "  %2 = all_gather %1 axis=dp+cp dim=0 : f32[24]\n"
    "  %3 = shard_slice %2 axis=dp+cp dim=0 : f32[4] {0:dp+cp*}\n"
    "  %4 = input \"h\" : f32[24] {partial:dp}\n"
    "  %5 = reduce_scatter %4 axis=dp dim=0 : f32[8] {0:dp}\n"
    "  %6 = shard_slice %5 axis=cp dim=0 : f32[4] {0:dp+cp*}\n"
    "  %7 = all_reduce %0 axis=dp+cp red=0 : f32[24]\n"
    "}\n"
    "end\n";
static IrModule *axes_case(const char *from, const char *to, char *err, size_t errlen) {
  StrBuf b = {0};
  const char *at = strstr(axes_text, from);
  sb_printf(&b, "%.*s%s%s", (int)(at - axes_text), axes_text, to, at + strlen(from));
  IrModule *m = ir_parse_module(b.p, "axes", err, errlen);
  if (m && ir_verify(m, err, errlen) != 0) { ir_module_free(m); m = NULL; }
  sb_free(&b);
  return m;
}
static void test_axes_sets(void) {
  char err[512] = "";
  IrModule *m = ir_parse_module(axes_text, "axes", err, sizeof err);
  CHECK(m != NULL, "axes: %s", err);
  if (!m) return;
  CHECK(ir_verify(m, err, sizeof err) == 0, "axes: verify: %s", err);
  const IrBlock *b = &m->blocks.a[0];
  CHECK(b->nodes[1].ia[0] == (IR_AXES_SET | (1 << IR_AXIS_DP) | (1 << IR_AXIS_CP)), "dp+cp parsed as %lld",
        (long long)b->nodes[1].ia[0]);
  CHECK(b->nodes[6].ia[0] == IR_AXIS_CP, "one axis stays the IrAxis: %lld", (long long)b->nodes[6].ia[0]);
  CHECK(ir_axes_size(m, b->nodes[1].ia[0]) == 6 && ir_axes_size(m, IR_AXIS_DP) == 3, "sizes");
  CHECK(ir_axes_attr(1u << IR_AXIS_TP) == IR_AXIS_TP && ir_axes_mask(IR_AXES_SET | 4) == 0 &&
        ir_axes_mask(IR_AXES_SET | 0x25) == 0 && ir_axes_mask(-1) == 0, "canonical forms");
  StrBuf t = {0};
  ir_print_module(m, &t);
  CHECK(strstr(t.p, strstr(axes_text, "block update")) != NULL, "axes: printed differently:\n%s", t.p);
  sb_free(&t);
  ir_module_free(m);
  /* cp+dp is the same set, printed outer to inner */
  m = axes_case("axis=dp+cp dim=0 : f32[4]", "axis=cp+dp dim=0 : f32[4]", err, sizeof err);
  CHECK(m != NULL, "cp+dp: %s", err);
  ir_module_free(m);
  static const struct { const char *from, *to, *want; } bad[] = {
    {"%1 = reduce_scatter %0 axis=dp+cp dim=0 : f32[4]", "%1 = reduce_scatter %0 axis=dp+cp dim=0 : f32[5]",
     "written type f32[5] but the operands give f32[4]"},
    {"%0 = input \"g\" : f32[24]", "%0 = input \"g\" : f32[21]", "not divisible by the dp+cp size 6"},
    {"%1 = reduce_scatter %0 axis=dp+cp", "%1 = all_to_all %0 axis=dp+cp split=0 concat=0 : f32[24]\n  %9 = reduce_scatter %0 axis=dp+cp",
     "all_to_all takes one mesh axis, not the set dp+cp"},
    {"%0 = input \"g\" : f32[24] {partial:dp+cp}", "%0 = input \"g\" : f32[24] {partial:dp}",
     "reduce_scatter of a value that is not a partial sum over its axis"},
    {"axis=dp+cp dim=0 : f32[4]", "axis=dp+dp dim=0 : f32[4]", "mesh axis dp given twice"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    m = axes_case(bad[i].from, bad[i].to, err, sizeof err);
    CHECK(m == NULL && strstr(err, bad[i].want), "axes bad %zu: want '%s', got '%s'", i, bad[i].want, err);
    ir_module_free(m);
  }
}

int main(void) {
  int ncases = (int)(sizeof cases / sizeof cases[0]);
  for (int op = 0; op < IR_OP_COUNT; op++) {
    int found = 0;
    for (int i = 0; i < ncases; i++) found |= strcmp(cases[i].op, ir_ops[op].name) == 0;
    CHECK(found, "op %s has no shape-rule case", ir_ops[op].name);
  }
  char err[512];
  for (int i = 0; i < ncases; i++) {
    const Case *c = &cases[i];
    if (!c->good) continue;
    err[0] = 0;
    IrModule *m = parse_case(c->good, err, sizeof err);
    CHECK(m != NULL, "%s: valid case rejected: %s", c->op, err);
    if (m) {
      /* the node must be the op we meant, and the module must verify */
      const IrBlock *b = &m->blocks.a[0];
      CHECK(b->n == 11 && strcmp(ir_ops[b->nodes[10].op].name, c->op) == 0, "%s: wrong node", c->op);
      CHECK(ir_verify(m, err, sizeof err) == 0, "%s: verify: %s", c->op, err);
      ir_module_free(m);
    }
    if (!c->bad) continue;
    err[0] = 0;
    m = parse_case(c->bad, err, sizeof err);
    CHECK(m == NULL, "%s: invalid case accepted: %s", c->op, c->bad);
    char want[64];
    snprintf(want, sizeof want, "error: %s: ", c->op);   /* the message comes from the op's rule */
    if (getenv("SHOW")) fprintf(stderr, "%s\n", err);   /* SHOW=1: list the messages for review */
    CHECK(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", c->op, err, want);
    CHECK(strncmp(err, "case:23:", 8) == 0, "%s: message '%s' not at line 23 (the line after the prelude)", c->op, err);
    ir_module_free(m);
  }
  test_zero_bad_ref();
  test_emit_message();
  test_matmul16();
  test_attention();
  test_decode();
  test_moe();
  test_fp8();
  test_axes_sets();
  printf("%d shape-rule cases\n", ncases);
  return check_exit("test_ir_shapes");
}
