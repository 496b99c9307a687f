/* ops_pipe.c - reference kernels of the pipeline ops (send, recv, stash,
 * unstash, group_sum; docs/pipeline.md).  Entries of rt_ref_kernels
 * (ops_ref.c) like every other kernel.  Not implemented yet: each refuses
 * with a message, so a pipeline plan fails cleanly instead of computing
 * something wrong. */
#include "rt_priv.h"

static int not_yet(RtKctx *k) {
  return rt_kfail(k, "%s: pipeline execution is not implemented in the runtime yet", ir_ops[k->n->op].name);
}
int ref_SEND(RtKctx *k) { return not_yet(k); }
int ref_RECV(RtKctx *k) { return not_yet(k); }
int ref_STASH(RtKctx *k) { return not_yet(k); }
int ref_UNSTASH(RtKctx *k) { return not_yet(k); }
int ref_GROUP_SUM(RtKctx *k) { return not_yet(k); }
