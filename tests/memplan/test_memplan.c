/* test_memplan.c - plan/memplan.c: liveness and arena packing on
 * hand-built blocks whose peak is worked out by hand below; the checker
 * rejects broken plans; the LLVM backend's plan of a fused kernel; both samples, tiny and full size, pack without
 * overlap with lower bound <= peak <= sum of buffers; state byte totals
 * equal dtype size * parameter count (GPT-2 124M: 124,475,904 params).
 *
 * usage: test_memplan */
#include "frontend/mdl.h"
#include "ir/ir.h"
#include "passes/memreport.h"
#include "../check.h"

static char err[1024];
#define EMIT(...) emit_or_die(ir_emit(__VA_ARGS__, err, sizeof err))
static int emit_or_die(int id) {
  if (id < 0) TS_DIE("ir_emit: %s", err);
  return id;
}
#define UN(m, b, op, x) EMIT(m, b, op, (int[]){x}, 1, NULL, NULL, NULL, NULL)
#define BIN(m, b, op, x, y) EMIT(m, b, op, (int[]){x, y}, 2, NULL, NULL, NULL, NULL)

static MemPlan plan_ok(const IrModule *m, int b) {
  MemPlan p;
  TS_ASSERT(ir_verify(m, err, sizeof err) == 0);
  if (plan_mem_block(m, b, &p, err, sizeof err) != 0) TS_DIE("memplan: %s", err);
  CHECK(plan_mem_check(m, &p, err, sizeof err) == 0, "check: %s", err);
  return p;
}

/* x[16] -> exp -> exp -> exp -> sumsq -> output: every value is 64 bytes
 * and lives from its node to the next one, so at most two are live at
 * once: lower bound = peak = 128; no reuse = 5 * 64 = 320. */
static void test_chain(void) {
  IrModule *m = ir_module_new("chain");
  int b = ir_block_add(m, "micro");
  IrType t = {IR_F32, 1, {16}, {NULL}};
  int x = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t);
  int a = UN(m, b, IR_OP_EXP, x), c = UN(m, b, IR_OP_EXP, a), d = UN(m, b, IR_OP_EXP, c);
  int s = UN(m, b, IR_OP_SUMSQ, d);
  int o = EMIT(m, b, IR_OP_OUTPUT, &s, 1, NULL, NULL, "loss", NULL);
  MemPlan p = plan_ok(m, b);
  CHECK(p.lower_bound_bytes == 128, "lower bound %zu", p.lower_bound_bytes);
  CHECK(p.peak_bytes == 128, "peak %zu", p.peak_bytes);
  CHECK(p.total_bytes == 320, "total %zu", p.total_bytes);
  CHECK(p.nbuffers == 5, "%d buffers", p.nbuffers);
  CHECK(p.buf[o] == -1 && p.offset[o] == -1, "output owns a buffer");
  CHECK(p.first[a] == a && p.last[a] == c, "exp live over [%d, %d]", p.first[a], p.last[a]);
  CHECK(p.last[s] == o, "sumsq live until %d", p.last[s]);
  CHECK(p.offset[a] != p.offset[x] && p.offset[c] != p.offset[a], "neighbours share bytes");
  plan_mem_free(&p);
  ir_module_free(m);
}

/* Sizes: x, a, b, c are f32[64] = 256 bytes, s a scalar = 64.
 *   %0 x = input        live [0, 3]
 *   %1 a = exp x        live [1, 2]
 *   %2 b = exp a        live [2, 3]
 *   %3 c = add x, b     live [3, 4]
 *   %4 s = sumsq c      live [4, 5]
 *   %5 output s
 * Live sums per node: 256, 512, 768, 768, 320, 64 -> lower bound 768.
 * Best fit: x@0, a@256, b@512 (conflicts with both), c@256 (a is dead by
 * then; b and x are not), s@0 (x is dead) -> peak 768.  No reuse: 1088. */
static void test_best_fit(void) {
  IrModule *m = ir_module_new("fit");
  int b = ir_block_add(m, "micro");
  IrType t = {IR_F32, 1, {64}, {NULL}};
  int x = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t);
  int a = UN(m, b, IR_OP_EXP, x);
  int e = UN(m, b, IR_OP_EXP, a);
  int c = BIN(m, b, IR_OP_ADD, x, e);
  int s = UN(m, b, IR_OP_SUMSQ, c);
  EMIT(m, b, IR_OP_OUTPUT, &s, 1, NULL, NULL, "loss", NULL);
  MemPlan p = plan_ok(m, b);
  CHECK(p.lower_bound_bytes == 768, "lower bound %zu", p.lower_bound_bytes);
  CHECK(p.peak_bytes == 768, "peak %zu", p.peak_bytes);
  CHECK(p.total_bytes == 4 * 256 + 64, "total %zu", p.total_bytes);
  CHECK(p.offset[x] == 0 && p.offset[a] == 256 && p.offset[e] == 512 && p.offset[c] == 256 && p.offset[s] == 0,
        "offsets %lld %lld %lld %lld %lld", (long long)p.offset[x], (long long)p.offset[a],
        (long long)p.offset[e], (long long)p.offset[c], (long long)p.offset[s]);

  /* the checker must catch broken plans: c moved onto x (both live at 3) */
  int64_t keep = p.offset[c];
  p.offset[c] = 0;
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0 && strstr(err, "overlaps"), "overlap not caught: %s", err);
  p.offset[c] = keep;
  /* a buffer claimed dead before its last reader */
  p.last[x] = 2;
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0 && strstr(err, "live over"), "short interval not caught: %s", err);
  p.last[x] = 3;
  /* a misaligned offset */
  p.offset[s] = 8;
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0, "misaligned offset not caught");
  p.offset[s] = 0;
  /* a peak that is not what the buffers give */
  p.peak_bytes = 512;
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0, "wrong peak not caught");
  p.peak_bytes = 768;
  CHECK(plan_mem_check(m, &p, err, sizeof err) == 0, "restored plan rejected: %s", err);
  plan_mem_free(&p);
  ir_module_free(m);
}

/* Best fit, not first fit: when Z is placed, two holes fit it and it takes
 * the tighter one.  Sizes: L0, G1 f32[128] = 512 B; L2, G3, L4, Z, w
 * f32[64] = 256 B; scalars 64 B.  Intervals (node of birth, last reader):
 *   %0 L0 = input a   [0, 10]     %7  Z  = neg L2        [7, 8]
 *   %1 G1 = exp L0    [1, 5]      %8  w  = add Z, L4     [8, 9]
 *   %2 L2 = input b   [2, 7]      %9  sw = sumsq w       [9, 12]
 *   %3 G3 = input c   [3, 6]      %10 s0 = sumsq L0      [10, 12]
 *   %4 L4 = input d   [4, 8]      %11 t  = add u, v      [11, 12]
 *   %5 u  = sumsq G1  [5, 11]     %12 t2 = add t, sw     [12, 13]
 *   %6 v  = sumsq G3  [6, 11]     %13 t3 = add t2, s0    [13, 14]
 *                                 %14 output t3
 * Big first: L0@0, G1@512; then by start L2@1024, G3@1280, L4@1536.  Z
 * conflicts with L0, L2, L4 only: holes [512, 1024) and [1280, 1536); best
 * fit takes 1280 (first fit would take 512).  w then fits at 512.  The
 * scalars: u has no hole (tail, 1792), v takes [768, 1024) ... the peak is
 * u's end, 1856, which is also the most bytes live at once (at %5:
 * 2 * 512 + 3 * 256 + 64), so lower bound = peak = 1856. */
static void test_best_fit_hole(void) {
  IrModule *m = ir_module_new("hole");
  int b = ir_block_add(m, "micro");
  IrType big = {IR_F32, 1, {128}, {NULL}}, mid = {IR_F32, 1, {64}, {NULL}};
  int l0 = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "a", &big);
  int g1 = UN(m, b, IR_OP_EXP, l0);
  int l2 = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "b", &mid);
  int g3 = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "c", &mid);
  int l4 = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "d", &mid);
  int u = UN(m, b, IR_OP_SUMSQ, g1), v = UN(m, b, IR_OP_SUMSQ, g3);
  int z = UN(m, b, IR_OP_NEG, l2);
  int w = BIN(m, b, IR_OP_ADD, z, l4);
  int sw = UN(m, b, IR_OP_SUMSQ, w), s0 = UN(m, b, IR_OP_SUMSQ, l0);
  int t = BIN(m, b, IR_OP_ADD, u, v);
  int t2 = BIN(m, b, IR_OP_ADD, t, sw);
  int t3 = BIN(m, b, IR_OP_ADD, t2, s0);
  EMIT(m, b, IR_OP_OUTPUT, &t3, 1, NULL, NULL, "loss", NULL);
  MemPlan p = plan_ok(m, b);
  CHECK(p.offset[l0] == 0 && p.offset[g1] == 512 && p.offset[l2] == 1024 && p.offset[g3] == 1280 &&
        p.offset[l4] == 1536, "big buffers at %lld %lld %lld %lld %lld", (long long)p.offset[l0],
        (long long)p.offset[g1], (long long)p.offset[l2], (long long)p.offset[g3], (long long)p.offset[l4]);
  CHECK(p.offset[z] == 1280, "Z at %lld, not in the tighter hole 1280", (long long)p.offset[z]);
  CHECK(p.offset[w] == 512, "w at %lld", (long long)p.offset[w]);
  CHECK(p.offset[u] == 1792 && p.offset[v] == 768, "u at %lld, v at %lld", (long long)p.offset[u], (long long)p.offset[v]);
  CHECK(p.lower_bound_bytes == 1856 && p.peak_bytes == 1856, "lower %zu peak %zu", p.lower_bound_bytes, p.peak_bytes);
  CHECK(p.total_bytes == 2 * 512 + 5 * 256 + 7 * 64, "total %zu", p.total_bytes);
  plan_mem_free(&p);
  ir_module_free(m);
}

/* RESHAPE shares its operand's buffer (kernels never write operands, so
 * the bytes need no copy), through chains of reshapes:
 *   %0 x = input f32[4,16]      256 B
 *   %1 r = reshape x : [64]     x's buffer
 *   %2 y = reshape r : [8,8]    x's buffer (r is read again at %4: still shared)
 *   %3 z = reshape y : [64]     x's buffer
 *   %4 e = add r, z
 *   %5 s = sumsq e              64 B
 *   %6 output s
 * Buffers: x+r+y+z [0, 4], e [4, 5], s [5, 6]; at %4 two of 256 B are
 * live -> lower bound = peak = 512; no reuse 2 * 256 + 64. */
static void test_reshape_alias(void) {
  IrModule *m = ir_module_new("alias");
  int b = ir_block_add(m, "micro");
  IrType t2 = {IR_F32, 2, {4, 16}, {NULL}}, t1 = {IR_F32, 1, {64}, {NULL}}, t8 = {IR_F32, 2, {8, 8}, {NULL}};
  int x = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t2);
  int r = EMIT(m, b, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &t1);    /* %1 */
  int y = EMIT(m, b, IR_OP_RESHAPE, &r, 1, NULL, NULL, NULL, &t8);    /* %2 */
  int z = EMIT(m, b, IR_OP_RESHAPE, &y, 1, NULL, NULL, NULL, &t1);    /* %3 */
  int e = BIN(m, b, IR_OP_ADD, r, z);                                 /* %4 */
  int s = UN(m, b, IR_OP_SUMSQ, e);                                   /* %5 */
  EMIT(m, b, IR_OP_OUTPUT, &s, 1, NULL, NULL, "loss", NULL);         /* %6 */
  MemPlan p = plan_ok(m, b);
  CHECK(p.buf[r] == x && p.offset[r] == p.offset[x], "reshape does not alias its operand");
  CHECK(p.buf[y] == x && p.buf[z] == x, "reshape chain does not alias (buf %d %d)", p.buf[y], p.buf[z]);
  CHECK(p.first[x] == 0 && p.last[x] == e && p.last[r] == e && p.last[z] == e,
        "x/r/y/z buffer live over [%d, %d]", p.first[x], p.last[x]);
  CHECK(p.nbuffers == 3, "%d buffers", p.nbuffers);
  CHECK(p.lower_bound_bytes == 512 && p.peak_bytes == 512, "lower %zu peak %zu", p.lower_bound_bytes, p.peak_bytes);
  CHECK(p.total_bytes == 2 * 256 + 64, "total %zu", p.total_bytes);
  /* the checker refuses sharing that is not a reshape: e onto x's buffer */
  p.buf[e] = x;
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0, "illegal sharing not caught");
  plan_mem_free(&p);
  ir_module_free(m);
}

/* A fused kernel (the LLVM backend): group {a, b, c} runs at c.
 *   %0 x = input f32[64]    read by a, i.e. at 3: live [0, 3]
 *   %1 a = exp x    g1      read only inside the kernel: no buffer
 *   %2 b = neg a    g1      read by d outside: written at 3, live [3, 4]
 *   %3 c = exp b    g1      the kernel's last member: live [3, 4]
 *   %4 d = add c, b         [4, 5]
 *   %5 s = sumsq d          [5, 6] (64 B)
 *   %6 output s
 * Live per position: 256 at 0-2, 768 at 3 (x, b, c) and 4 (b, c, d), 320,
 * 64.  Best fit: x@0, b@256, c@512, d@0 (x is dead), s@256 -> peak 768.
 * The reference plan (no at) gives a its buffer. */
static void test_kernel_at(void) {
  IrModule *m = ir_module_new("kern");
  int bl = ir_block_add(m, "micro");
  IrType t = {IR_F32, 1, {64}, {NULL}};
  int x = EMIT(m, bl, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t);
  int a = UN(m, bl, IR_OP_EXP, x), b = UN(m, bl, IR_OP_NEG, a), c = UN(m, bl, IR_OP_EXP, b);
  int d = BIN(m, bl, IR_OP_ADD, c, b);
  int s = UN(m, bl, IR_OP_SUMSQ, d);
  EMIT(m, bl, IR_OP_OUTPUT, &s, 1, NULL, NULL, "loss", NULL);
  IrBlock *blk = &m->blocks.a[bl];
  blk->nodes[a].group = blk->nodes[b].group = blk->nodes[c].group = 1;
  int at[7];
  plan_mem_group_at(blk, at);
  CHECK(at[x] == x && at[a] == c && at[b] == c && at[c] == c && at[d] == d, "group_at %d %d %d %d", at[x], at[a], at[b], at[c]);
  MemPlan p;
  if (plan_mem_block_at(m, bl, at, &p, err, sizeof err) != 0) TS_DIE("memplan: %s", err);
  CHECK(plan_mem_check(m, &p, err, sizeof err) == 0, "check: %s", err);
  CHECK(p.buf[a] == -1 && p.offset[a] == -1, "a value inside the kernel owns bytes");
  CHECK(p.first[x] == 0 && p.last[x] == c, "x live over [%d, %d]", p.first[x], p.last[x]);
  CHECK(p.first[b] == c && p.last[b] == d && p.first[c] == c && p.last[c] == d, "b [%d, %d] c [%d, %d]",
        p.first[b], p.last[b], p.first[c], p.last[c]);
  CHECK(p.offset[x] == 0 && p.offset[b] == 256 && p.offset[c] == 512 && p.offset[d] == 0 && p.offset[s] == 256,
        "offsets %lld %lld %lld %lld %lld", (long long)p.offset[x], (long long)p.offset[b], (long long)p.offset[c],
        (long long)p.offset[d], (long long)p.offset[s]);
  CHECK(p.nbuffers == 5 && p.lower_bound_bytes == 768 && p.peak_bytes == 768 && p.total_bytes == 4 * 256 + 64,
        "%d buffers, lower %zu peak %zu total %zu", p.nbuffers, p.lower_bound_bytes, p.peak_bytes, p.total_bytes);
  /* the checker recomputes liveness with the plan's at[]: b must reach d */
  p.last[b] = p.last[p.buf[b]] = c;
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0 && strstr(err, "live over"), "short interval not caught: %s", err);
  plan_mem_free(&p);
  /* an at[] that runs a node before itself is refused */
  at[d] = c;
  CHECK(plan_mem_block_at(m, bl, at, &p, err, sizeof err) != 0 && strstr(err, "run at"), "bad at[] accepted");
  /* the reference plan: a has bytes of its own */
  p = plan_ok(m, bl);
  CHECK(p.buf[a] == a && p.first[b] == b, "reference plan: a buf %d, b from %d", p.buf[a], p.first[b]);
  plan_mem_free(&p);
  ir_module_free(m);
}

/* STATE aliases the slab and effects have no result: neither owns bytes. */
static void test_states_effects(void) {
  IrModule *m = ir_module_new("st");
  IrType t = {IR_F32, 1, {32}, {NULL}};
  IrState w = {"w", t, IR_STATE_PARAM, IR_INIT_ZEROS, 0, 0, -1, 0, {{0}, 0, 0}, {0}};
  int sw = ir_state_add(m, &w);
  IrState g = {"grad.w", t, IR_STATE_GRAD, IR_INIT_ZEROS, 0, 0, sw, 0, {{0}, 0, 0}, {0}};
  int sg = ir_state_add(m, &g);
  int b = ir_block_add(m, "micro");
  int64_t iw[1] = {sw}, ig[1] = {sg};
  int ws = EMIT(m, b, IR_OP_STATE, NULL, 0, iw, NULL, NULL, &t);
  int x = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t);
  int y = BIN(m, b, IR_OP_MUL, ws, x);
  int ac = EMIT(m, b, IR_OP_ACCUM, &y, 1, ig, NULL, NULL, NULL);
  MemPlan p = plan_ok(m, b);
  CHECK(p.buf[ws] == -1 && p.buf[ac] == -1, "state/effect own bytes");
  CHECK(p.nbuffers == 2 && p.peak_bytes == 256 && p.lower_bound_bytes == 256, "%d buffers, peak %zu", p.nbuffers, p.peak_bytes);
  CHECK(plan_mem_state_bytes(m, IR_STATE_PARAM) == 128 && plan_mem_state_bytes(m, IR_STATE_GRAD) == 128,
        "state bytes");
  plan_mem_free(&p);
  CHECK(plan_mem_block(m, 7, &p, err, sizeof err) != 0 && strstr(err, "no block"), "bad block index accepted");
  ir_module_free(m);
}

/* A reshape of a state is a VIEW of the slab when the block writes that
 * state nowhere (a parameter in the micro block), through reshape chains;
 * of a state an effect writes (the gradient accumulated here) it is a copy
 * with a buffer of its own, since the accum changes the bytes it read.
 *   %0 ws = state @w [32]          %1 wv = reshape ws [4,8]: view
 *   %2 wv2 = reshape wv [32]: view %3 gs = state @grad.w
 *   %4 gv = reshape gs [4,8]: copy %5 x = input [4,8]
 *   %6 y = mul wv, x               %7 z = mul gv, y
 *   %8 accum z @grad.w             %9 s = sumsq wv2, %10 output
 * Buffers: gv, x, y, z, s. */
static void test_state_views(void) {
  IrModule *m = ir_module_new("views");
  IrType t = {IR_F32, 1, {32}, {NULL}}, t48 = {IR_F32, 2, {4, 8}, {NULL}};
  IrState w = {"w", t, IR_STATE_PARAM, IR_INIT_ZEROS, 0, 0, -1, 0, {{0}, 0, 0}, {0}};
  int sw = ir_state_add(m, &w);
  IrState g = {"grad.w", t48, IR_STATE_GRAD, IR_INIT_ZEROS, 0, 0, sw, 0, {{0}, 0, 0}, {0}};
  int sg = ir_state_add(m, &g);
  int b = ir_block_add(m, "micro");
  int64_t iw[1] = {sw}, ig[1] = {sg};
  IrType t48g = t48;
  int ws = EMIT(m, b, IR_OP_STATE, NULL, 0, iw, NULL, NULL, &t);
  int wv = EMIT(m, b, IR_OP_RESHAPE, &ws, 1, NULL, NULL, NULL, &t48);
  int wv2 = EMIT(m, b, IR_OP_RESHAPE, &wv, 1, NULL, NULL, NULL, &t);
  int gs = EMIT(m, b, IR_OP_STATE, NULL, 0, ig, NULL, NULL, &t48g);
  IrType t32 = t;
  int gv = EMIT(m, b, IR_OP_RESHAPE, &gs, 1, NULL, NULL, NULL, &t32);
  int gv48 = EMIT(m, b, IR_OP_RESHAPE, &gv, 1, NULL, NULL, NULL, &t48);
  int x = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t48);
  int y = BIN(m, b, IR_OP_MUL, wv, x);
  int z = BIN(m, b, IR_OP_MUL, gv48, y);
  EMIT(m, b, IR_OP_ACCUM, &z, 1, ig, NULL, NULL, NULL);
  int s = UN(m, b, IR_OP_SUMSQ, wv2);
  EMIT(m, b, IR_OP_OUTPUT, &s, 1, NULL, NULL, "loss", NULL);
  MemPlan p = plan_ok(m, b);
  CHECK(p.view[wv] && p.view[wv2] && p.buf[wv] == -1 && p.buf[wv2] == -1, "a reshape of an unwritten state is not a view");
  CHECK(!p.view[gv] && p.buf[gv] == gv && p.buf[gv48] == gv, "a reshape of a written state has no copy (view %d buf %d)",
        p.view[gv], p.buf[gv]);
  CHECK(p.nbuffers == 5, "%d buffers", p.nbuffers);
  /* the checker refuses a view of the written state */
  p.view[gv] = 1;
  p.buf[gv] = -1;
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0 && strstr(err, "view of the state slab"), "bad view accepted: %s", err);
  plan_mem_free(&p);
  /* inside a kernel {wv, wv2} run at wv2, neither reshape is a view */
  int at[12];
  for (int i = 0; i < m->blocks.a[b].n; i++) at[i] = i;
  at[wv] = wv2;
  if (plan_mem_block_at(m, b, at, &p, err, sizeof err) != 0) TS_DIE("memplan: %s", err);
  CHECK(!p.view[wv] && !p.view[wv2] && p.buf[wv2] >= 0, "a reshape inside a kernel is a view");
  CHECK(plan_mem_check(m, &p, err, sizeof err) == 0, "check: %s", err);
  plan_mem_free(&p);
  ir_module_free(m);
}

/* The pipeline's hand-over (memplan.h, ext): a value exactly one stash
 * reads (directly or through a reshape sharing its bytes) and every
 * unstash result live outside the arena; a value stashed twice is copied
 * by each stash and stays in the arena.  All f32[64] = 256 bytes.
 *   fwd.0: %0 x (stashed through the reshape %6: ext), %1 (stashed once:
 *          ext), %3 (stashed twice: arena), %8 sumsq (64, arena)
 *   bwd.0: %0, %1 unstashed (ext), %2 add (arena) */
static void test_stash_handover(void) {
  const char *text =
      "module stash\n"
      "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
      "min_lr=0.0 clip_grad=0.0 global_batch=1 micro_batch=1 seq_len=4 steps=1 seed=1 precision=f32\n"
      "parallel tp=1 pp=1 cp=1 ep=1 dp=1 sp=0 zero=1\n"
      "state @w : f32[64] param init=zeros\n"
      "state @g : f32[64] grad of=@w\n"
      "block fwd.0 {\n"
      "  %0 = input \"x\" : f32[64]\n"
      "  %1 = exp %0 : f32[64]\n"
      "  stash %1 slot=0\n"
      "  %3 = exp %1 : f32[64]\n"
      "  stash %3 slot=1\n"
      "  stash %3 slot=2\n"
      "  %6 = reshape %0 : f32[8, 8]\n"
      "  stash %6 slot=3\n"
      "  %8 = sumsq %3 : f32[]\n"
      "  output \"loss\" %8\n"
      "}\n"
      "block bwd.0 {\n"
      "  %0 = unstash slot=0 : f32[64]\n"
      "  %1 = unstash slot=1 : f32[64]\n"
      "  %2 = add %0, %1 : f32[64]\n"
      "  accum %2 @g\n"
      "}\n"
      "end\n";
  IrModule *m = ir_parse_module(text, "stash.ir", err, sizeof err);
  if (!m) TS_DIE("parse: %s", err);
  MemPlan p = plan_ok(m, ir_block_find(m, "fwd.0"));
  CHECK(p.ext[0] && p.ext[6] && p.buf[6] == 0 && p.ext[1], "stashed once: outside the arena (ext %d %d %d)", p.ext[0],
        p.ext[6], p.ext[1]);
  CHECK(!p.ext[3] && !p.ext[8] && p.offset[3] >= 0, "a value stashed twice stays in the arena");
  CHECK(p.offset[0] == -1 && p.offset[6] == -1 && p.offset[1] == -1, "ext values have no offset");
  CHECK(p.next == 2 && p.ext_bytes == 512 && p.nbuffers == 2, "%d ext buffers of %zu bytes, %d in the arena", p.next,
        p.ext_bytes, p.nbuffers);
  CHECK(p.peak_bytes == 256 + 64 && p.total_bytes == 256 + 64, "peak %zu total %zu: the arena holds %%3 and %%8",
        p.peak_bytes, p.total_bytes);
  p.ext[3] = 1;   /* the checker refuses handing over a value two stashes copy */
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0 && strstr(err, "does not hand over"), "bad ext accepted: %s", err);
  p.ext[3] = 0;
  p.ext[1] = 0;   /* ... and keeping in the arena one the pipeline hands over */
  CHECK(plan_mem_check(m, &p, err, sizeof err) != 0 && strstr(err, "hands over"), "missing ext accepted: %s", err);
  plan_mem_free(&p);
  p = plan_ok(m, ir_block_find(m, "bwd.0"));
  CHECK(p.ext[0] && p.ext[1] && !p.ext[2], "unstash results are handed over, the add is not");
  CHECK(p.peak_bytes == 256 && p.next == 2 && p.last[0] == 2 && p.last[1] == 2, "peak %zu, %d ext, live to %d/%d",
        p.peak_bytes, p.next, p.last[0], p.last[1]);
  plan_mem_free(&p);
  ir_module_free(m);
}

typedef struct { const char *file; int tiny; int64_t params; } Sample;   /* params < 0: not known */

static void test_sample(const Sample *s) {
  char path[1024];
  snprintf(path, sizeof path, "%s/samples/%s", TS_SOURCE_DIR, s->file);
  MdlDefine tiny[] = {{"layers", "2"}, {"d_model", "64"}, {"heads", "4"}, {"seq_len", "64"}};
  MdlOptions opt;
  mdl_options_init(&opt);
  if (s->tiny) { opt.defines = tiny; opt.ndefines = 4; }
  IrModule *m = mdl_compile_file(path, &opt);
  if (!m) { CHECK(0, "%s does not compile", path); return; }
  PassCtx cx;
  pass_ctx_init(&cx);
  if (pass_run_pipeline(m, &cx) != 0) TS_DIE("pipeline: %s", cx.err);
  pass_ctx_free(&cx);

  /* state bytes: an independent count of elements, times the dtype size */
  int64_t nparam = 0, ngrad = 0, nmom = 0;
  for (int i = 0; i < m->states.n; i++) {
    int64_t k = ir_type_numel(&m->states.a[i].type);
    CHECK(m->states.a[i].type.dtype == IR_F32, "%s: state %s is not f32", s->file, m->states.a[i].name);
    switch (m->states.a[i].kind) {
    case IR_STATE_PARAM: nparam += k; break;
    case IR_STATE_GRAD: ngrad += k; break;
    default: nmom += k; break;
    }
  }
  if (s->params >= 0) CHECK(nparam == s->params, "%s: %lld params", s->file, (long long)nparam);
  CHECK(ngrad == nparam && nmom == 2 * nparam, "%s: grads %lld moments %lld", s->file, (long long)ngrad, (long long)nmom);
  CHECK(plan_mem_state_bytes(m, IR_STATE_PARAM) == 4 * (size_t)nparam, "%s: param bytes", s->file);
  CHECK(plan_mem_state_bytes(m, IR_STATE_GRAD) == 4 * (size_t)nparam, "%s: grad bytes", s->file);
  CHECK(plan_mem_state_bytes(m, IR_STATE_ADAM_M) + plan_mem_state_bytes(m, IR_STATE_ADAM_V) == 8 * (size_t)nparam,
        "%s: adam bytes", s->file);

  for (int b = 0; b < m->blocks.n; b++) {
    /* the LLVM backend's plan (fused groups as kernels) must be valid too */
    const IrBlock *blk = &m->blocks.a[b];
    int *at = ts_xmalloc((size_t)(blk->n ? blk->n : 1) * sizeof *at);
    plan_mem_group_at(blk, at);
    MemPlan pf;
    CHECK(plan_mem_block_at(m, b, at, &pf, err, sizeof err) == 0, "%s: fused plan: %s", s->file, err);
    CHECK(plan_mem_check(m, &pf, err, sizeof err) == 0, "%s: fused plan check: %s", s->file, err);
    plan_mem_free(&pf);
    free(at);
    MemPlan p = plan_ok(m, b);
    const char *bn = m->blocks.a[b].name;
    CHECK(p.lower_bound_bytes <= p.peak_bytes && p.peak_bytes <= p.total_bytes,
          "%s %s: lower %zu peak %zu total %zu", s->file, bn, p.lower_bound_bytes, p.peak_bytes, p.total_bytes);
    CHECK(p.nbuffers > 0 && p.lower_bound_bytes > 0, "%s %s: empty plan", s->file, bn);
    /* the arena must hold the biggest single value, e.g. the logits */
    size_t biggest = 0;
    for (int i = 0; i < p.n; i++) if (p.size[i] > biggest) biggest = p.size[i];
    CHECK(p.lower_bound_bytes >= biggest, "%s %s: bound below one buffer", s->file, bn);
    /* packing should be near the bound; 25% slack is a regression alarm,
     * not a property: it has held with room to spare for both samples */
    CHECK((double)p.peak_bytes <= 1.25 * (double)p.lower_bound_bytes,
          "%s %s: packed %zu vs bound %zu", s->file, bn, p.peak_bytes, p.lower_bound_bytes);
    plan_mem_free(&p);
  }
  StrBuf rep = {0};
  CHECK(pass_memplan_report(m, &rep, err, sizeof err) == 0, "%s: report: %s", s->file, err);
  CHECK(rep.p && strstr(rep.p, "ONE activation arena"), "%s: report lacks the runtime note", s->file);
  sb_free(&rep);
  ir_module_free(m);
}

int main(void) {
  test_chain();
  test_best_fit();
  test_best_fit_hole();
  test_reshape_alias();
  test_kernel_at();
  test_states_effects();
  test_state_views();
  test_stash_handover();
  const Sample samples[] = {
    {"gpt.mdl", 1, -1}, {"llama.mdl", 1, -1},
    {"gpt.mdl", 0, 124475904},   /* GPT-2 124M with the vocab padded to 50304 */
    {"llama.mdl", 0, -1},
  };
  for (size_t i = 0; i < sizeof samples / sizeof *samples; i++) test_sample(&samples[i]);
  return check_exit("test_memplan");
}
