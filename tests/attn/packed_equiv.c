/* packed_equiv.c - packed sequences against their documents one by one
 * (issue 22, deliverable 4), under mpirun with TP * CP ranks:
 *
 *   mpirun -np TP*CP packed_equiv MODEL TP SP CP L1 L2 ... [--break] [--a2a]
 *
 * MODEL declares tokens, targets, position_ids and document_ids
 * (tests/attn/packed.mdl).  Documents of lengths L1, L2, ... (summing to
 * T, the model's seq_len) are run two ways in f64:
 *   - unsharded, one document per row (batch = the document count), each
 *     row the document followed by padding whose targets are ignored,
 *     positions 0, 1, ... and one document id;
 *   - packed into ONE row, sharded over tp / sp / cp: each position's
 *     document id and its position within its document fed as inputs.
 * The loss (mean over the T targets in both) and every gradient (a
 * partial sum over tp or cp all-reduced first) must agree within 1e-12
 * relative (to the gradient's largest entry, at least 1e-6 of the model's
 * largest gradient entry).  --break feeds the packed run document id 0 everywhere (one
 * document): the comparison must then fail, which shows the test can.
 * --a2a runs the packed model's attention under cp by all-to-all (mcc
 * --cp-attn a2a) instead of the ring. */
#include "../equiv.h"

int main(int argc, char **argv) {
  char err[1024];
  RtComm *w = rt_comm_init_mpi(&argc, &argv, 60, err, sizeof err);
  if (!w) { fprintf(stderr, "packed_equiv: %s\n", err); return 1; }
  if (argc < 6) { fprintf(stderr, "usage: packed_equiv MODEL TP SP CP L1 L2 ... [--break] [--a2a]\n"); return 2; }
  int TP = atoi(argv[2]), sp = atoi(argv[3]), CP = atoi(argv[4]), nd = 0, brk = 0, me = rt_comm_rank(w);
  int64_t len[16], T = 0;
  for (int i = 5; i < argc; i++) {
    if (strcmp(argv[i], "--break") == 0) brk = 1;
    else if (strcmp(argv[i], "--a2a") == 0) equiv_cp_attn = PASS_CP_ATTN_A2A;
    else if (nd < 16) T += len[nd++] = atoll(argv[i]);
  }
  if (rt_comm_size(w) != TP * CP) { fprintf(stderr, "packed_equiv: run with -np %d\n", TP * CP); return 2; }
  char seq[32], docs[32];
  snprintf(seq, sizeof seq, "%lld", (long long)T);
  snprintf(docs, sizeof docs, "%d", nd);
  MdlDefine one[3] = {{"seq_len", seq}, {"batch", "1"}, {"micro_batch", "1"}};
  MdlDefine per[3] = {{"seq_len", seq}, {"batch", docs}, {"micro_batch", docs}};
  IrModule *ref = equiv_compile("packed_equiv", argv[1], 1, 0, 1, 1, per, 3);
  IrModule *pk = equiv_compile("packed_equiv", argv[1], TP, sp, CP, 1, one, 3);
  if (!ref || !pk) return 1;
  RtRank rk;
  if (equiv_rank(w, (PlanMesh){1, 1, CP, 1, TP}, me, &rk, err, sizeof err)) {
    fprintf(stderr, "packed_equiv: %s\n", err);
    return 1;
  }
  RtProgram *pr = rt_program_new(ref, err, sizeof err);
  RtProgram *ps = pr ? rt_program_new_rank(pk, &rk, err, sizeof err) : NULL;
  if (!ps) { fprintf(stderr, "packed_equiv: %s\n", err); return 1; }

  /* the documents' tokens and targets; one row each, then packed */
  static const char *names[4] = {"tokens", "targets", "position_ids", "document_ids"};
  int32_t *rows[4], *packed[4];
  for (int k = 0; k < 4; k++) {
    rows[k] = ts_xcalloc((size_t)(nd * T), sizeof *rows[k]);
    packed[k] = ts_xcalloc((size_t)T, sizeof *packed[k]);
  }
  for (int d = 0, at = 0; d < nd; at += (int)len[d], d++)
    for (int64_t j = 0; j < T; j++) {
      int in_doc = j < len[d];
      int32_t tok = (int32_t)((d * 131 + j * 17 + 3) % 40), tgt = (int32_t)((d * 71 + j * 29 + 11) % 40);
      int32_t v[4] = {in_doc ? tok : 1, in_doc ? tgt : -1, (int32_t)j, 0};
      for (int k = 0; k < 4; k++) rows[k][d * T + j] = v[k];
      if (!in_doc) continue;
      int32_t pv[4] = {tok, tgt, (int32_t)j, brk ? 0 : d};
      for (int k = 0; k < 4; k++) packed[k][at + j] = pv[k];
    }
  RtFeed rf[4], pf[4];
  int32_t *local[4];
  for (int k = 0; k < 4; k++) {
    const IrNode *in = equiv_input_node(pk, names[k]);
    if (!in || !equiv_input_node(ref, names[k])) { fprintf(stderr, "packed_equiv: the model has no input %s\n", names[k]); return 1; }
    local[k] = equiv_local_block(ps, in, T, packed[k]);
    rf[k] = (RtFeed){names[k], rows[k]};
    pf[k] = (RtFeed){names[k], local[k]};
  }
  int rc = equiv_run_compare("packed_equiv", w, me, "one by one", "packed", ref, pr, rf, pk, ps, pf, 4, &rk, 1e-12, brk);
  for (int k = 0; k < 4; k++) { free(rows[k]); free(packed[k]); free(local[k]); }
  return rc;
}
