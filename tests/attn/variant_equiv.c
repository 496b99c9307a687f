/* variant_equiv.c - the fused attention's variants against the composed
 * form (issue 24, deliverable 5), under mpirun with TP * CP ranks:
 *
 *   mpirun -np TP*CP variant_equiv MODEL TP SP CP [--a2a|--allgather] [--break] [KEY=VALUE ...]
 *
 * MODEL (tests/attn/variants.mdl) has a config knob `fused` and the
 * variants as others (alibi, window, causal, cross, kv_heads); KEY=VALUE
 * are -D overrides for both runs.  In f64, one micro batch:
 *   - the reference: fused = false (matmul, softmax, matmul: ALiBi's bias
 *     a [heads, seq, seq] tensor added to the scores) on one rank;
 *   - the test: fused = true (the flash-style kernels: the bias computed
 *     per tile from global positions) sharded over tp / sp / cp (the ring,
 *     or --a2a / --allgather).
 * The loss and every gradient (partial sums over tp or cp all-reduced
 * first) must agree within 1e-12 relative.  --break compiles the reference
 * with alibi = false: the comparison must then fail, which shows the test
 * can see the bias. */
#include "../equiv.h"

int main(int argc, char **argv) {
  char err[1024];
  RtComm *w = rt_comm_init_mpi(&argc, &argv, 60, err, sizeof err);
  if (!w) { fprintf(stderr, "variant_equiv: %s\n", err); return 1; }
  if (argc < 5) {
    fprintf(stderr, "usage: variant_equiv MODEL TP SP CP [--a2a|--allgather] [--break] [KEY=VALUE ...]\n");
    return 2;
  }
  int TP = atoi(argv[2]), sp = atoi(argv[3]), CP = atoi(argv[4]), brk = 0, me = rt_comm_rank(w), nd = 0;
  MdlDefine defs[16];
  static char kv[16][128];
  for (int i = 5; i < argc; i++) {
    if (strcmp(argv[i], "--break") == 0) brk = 1;
    else if (strcmp(argv[i], "--a2a") == 0) equiv_cp_attn = PASS_CP_ATTN_A2A;
    else if (strcmp(argv[i], "--allgather") == 0) equiv_cp_attn = PASS_CP_ATTN_ALLGATHER;
    else if (nd < 14 && strchr(argv[i], '=')) {
      snprintf(kv[nd], sizeof kv[nd], "%s", argv[i]);
      char *eq = strchr(kv[nd], '=');
      *eq = 0;
      defs[nd] = (MdlDefine){kv[nd], eq + 1};
      nd++;
    } else {
      fprintf(stderr, "variant_equiv: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (rt_comm_size(w) != TP * CP) { fprintf(stderr, "variant_equiv: run with -np %d\n", TP * CP); return 2; }
  MdlDefine rdefs[16], fdefs[16];
  memcpy(rdefs, defs, (size_t)nd * sizeof *defs);
  memcpy(fdefs, defs, (size_t)nd * sizeof *defs);
  int rn = nd, fn = nd;
  rdefs[rn++] = (MdlDefine){"fused", "false"};
  if (brk) rdefs[rn++] = (MdlDefine){"alibi", "false"};
  fdefs[fn++] = (MdlDefine){"fused", "true"};
  IrModule *ref = equiv_compile("variant_equiv", argv[1], 1, 0, 1, 1, rdefs, rn);
  IrModule *fu = equiv_compile("variant_equiv", argv[1], TP, sp, CP, 1, fdefs, fn);
  if (!ref || !fu) return 1;
  RtRank rk;
  if (equiv_rank(w, (PlanMesh){1, 1, CP, 1, TP}, me, &rk, err, sizeof err)) {
    fprintf(stderr, "variant_equiv: %s\n", err);
    return 1;
  }
  RtProgram *pr = rt_program_new(ref, err, sizeof err);
  RtProgram *ps = pr ? rt_program_new_rank(fu, &rk, err, sizeof err) : NULL;
  if (!ps) { fprintf(stderr, "variant_equiv: %s\n", err); return 1; }

  /* tokens and targets [rows, T]: the reference's input types are global */
  static const char *names[2] = {"tokens", "targets"};
  const IrNode *rin = equiv_input_node(ref, "tokens");
  if (!rin || rin->type.rank != 2) { fprintf(stderr, "variant_equiv: the model has no tokens [batch, seq]\n"); return 1; }
  int64_t R = rin->type.dim[0], T = rin->type.dim[1];
  int32_t *g[2], *local[2];
  RtFeed rf[2], pf[2];
  for (int k = 0; k < 2; k++) {
    g[k] = ts_xcalloc((size_t)(R * T), sizeof *g[k]);
    for (int64_t e = 0; e < R * T; e++) g[k][e] = (int32_t)((e * (k ? 29 : 17) + (k ? 11 : 3)) % 40);
    const IrNode *in = equiv_input_node(fu, names[k]);
    if (!in || !equiv_input_node(ref, names[k])) { fprintf(stderr, "variant_equiv: the model has no input %s\n", names[k]); return 1; }
    local[k] = equiv_local_block(ps, in, T, g[k]);
    rf[k] = (RtFeed){names[k], g[k]};
    pf[k] = (RtFeed){names[k], local[k]};
  }
  int rc = equiv_run_compare("variant_equiv", w, me, "composed", "fused", ref, pr, rf, fu, ps, pf, 2, &rk, 1e-12, brk);
  for (int k = 0; k < 2; k++) { free(g[k]); free(local[k]); }
  return rc;
}
