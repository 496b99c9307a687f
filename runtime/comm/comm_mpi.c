/* comm_mpi.c - the communication layer's core and its MPI backend (CPU
 * ranks): the mesh arithmetic, groups (every group is an MPI communicator,
 * whatever backend runs its collectives), deadlines and diagnostics, the
 * public collectives (arguments checked here, then the group's backend
 * through its RtCommOps table) and the MPI table itself.  See comm.h for
 * the contract and the failure guarantees.  The NCCL backend
 * (comm_nccl.c) builds on this file; this file knows nothing of it.
 *
 * Why nonblocking calls everywhere: a blocking MPI_Allreduce waits forever
 * for a rank that stalls.  Each collective is posted as MPI_I<op> and polled
 * with MPI_Test against a deadline, so a stuck job ends with a message that
 * names the group, the operation and (best guess) the missing rank.
 * Why MPI_ERRORS_RETURN: the default handler aborts with MPI's own message,
 * which does not say which of our collectives failed. */
#define RT_COMM_INTERNAL
#include "runtime/comm/comm.h"
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

static const char *coll_names[RT_COLL_COUNT] = {
  "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "barrier"};
const char *rt_coll_name(RtCollKind k) { return k < RT_COLL_COUNT ? coll_names[k] : "?"; }

static const char *axis_names[RT_AXIS_COUNT] = {"dp", "pp", "cp", "ep", "tp"};
const char *rt_mesh_axis_name(RtMeshAxis a) { return a < RT_AXIS_COUNT ? axis_names[a] : "?"; }

/* ---------------- mesh arithmetic ---------------- */

static void mesh_dims(const PlanMesh *m, int d[RT_AXIS_COUNT]) {
  d[RT_AXIS_DP] = m->dp; d[RT_AXIS_PP] = m->pp; d[RT_AXIS_CP] = m->cp;
  d[RT_AXIS_EP] = m->ep; d[RT_AXIS_TP] = m->tp;
  for (int i = 0; i < RT_AXIS_COUNT; i++) if (d[i] < 1) d[i] = 1;
}

int rt_mesh_size(const PlanMesh *m) {
  int d[RT_AXIS_COUNT], n = 1;
  mesh_dims(m, d);
  for (int i = 0; i < RT_AXIS_COUNT; i++) n *= d[i];
  return n;
}

int rt_mesh_coords(const PlanMesh *m, int rank, int coord[RT_AXIS_COUNT]) {
  int d[RT_AXIS_COUNT];
  mesh_dims(m, d);
  if (rank < 0 || rank >= rt_mesh_size(m)) return -1;
  for (int i = RT_AXIS_COUNT - 1; i >= 0; i--) {   /* tp innermost */
    coord[i] = rank % d[i];
    rank /= d[i];
  }
  return 0;
}

int rt_mesh_rank(const PlanMesh *m, const int coord[RT_AXIS_COUNT]) {
  int d[RT_AXIS_COUNT], r = 0;
  mesh_dims(m, d);
  for (int i = 0; i < RT_AXIS_COUNT; i++) {
    if (coord[i] < 0 || coord[i] >= d[i]) return -1;
    r = r * d[i] + coord[i];
  }
  return r;
}

int rt_mesh_group_ranks(const PlanMesh *m, int rank, RtMeshAxis a, int *ranks_out) {
  int d[RT_AXIS_COUNT], c[RT_AXIS_COUNT];
  mesh_dims(m, d);
  if (a >= RT_AXIS_COUNT || rt_mesh_coords(m, rank, c) < 0) return -1;
  for (int i = 0; i < d[a]; i++) {
    c[a] = i;
    ranks_out[i] = rt_mesh_rank(m, c);
  }
  return d[a];
}

/* ---------------- errors ---------------- */

static void mpi_errstr(int rc, char *buf, size_t n) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
  snprintf(buf, n, "%s", s);
}

/* Setup calls: the failing call, MPI's words, and a hint; returns -1. */
static int mpi_fail(char *err, size_t errlen, const char *call, int rc, const char *hint) {
  char s[MPI_MAX_ERROR_STRING];
  mpi_errstr(rc, s, sizeof s);
  return ts_errf(err, errlen, "%s failed: %s (hint: %s)", call, s, hint);
}
#define RT_MPI_TRY(call, hint) \
  do { int rc_ = (call); if (rc_ != MPI_SUCCESS) { mpi_fail(err, errlen, #call, rc_, hint); goto fail; } } while (0)

static int world_rank_now(void) {
  int r = -1, init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void rt_comm_abort(RtComm *c, const char *fmt, ...) {
  /* one write, so that the lines of ranks aborting together do not mix */
  char msg[2048];
  int n = snprintf(msg, sizeof msg, "rank %d: ", c ? c->world_rank : world_rank_now());
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof msg) vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
  /* When every rank fails together (an error they agreed on), rank 0's
   * message is the one that says what happened to the job ("another rank
   * could not ..."): the other ranks give it 0.2 s to be written before
   * their abort takes the job down. */
  int wr = c ? c->world_rank : world_rank_now();
  if (wr > 0) usleep(200000);
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);   /* MPI_Abort does not return; this is for a broken MPI */
}

/* Communication calls: a failure here leaves the group in an unknown state
 * (some ranks may have completed the operation), so the job ends. */
#define RT_MPI_FATAL(c, k, call, hint) \
  do { int rc_ = (call); if (rc_ != MPI_SUCCESS) { char s_[MPI_MAX_ERROR_STRING]; mpi_errstr(rc_, s_, sizeof s_); \
    rt_comm_abort(c, "%s on group %s failed in %s: %s (hint: %s)", rt_coll_name(k), (c)->name, #call, s_, hint); } } while (0)

/* ---------------- groups ---------------- */

RtComm *rt_comm_wrap_mpi(MPI_Comm comm, const char *name, double timeout, char *err, size_t errlen) {
  RtComm *c = ts_xcalloc(1, sizeof *c);
  c->ops = &rt_comm_mpi_ops;
  MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
  int *idx = NULL;
  c->comm = comm;
  c->side = MPI_COMM_NULL;
  c->is_world = comm == MPI_COMM_WORLD;
  c->timeout = timeout;
  snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
  RT_MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "is MPI initialized?");
  RT_MPI_TRY(MPI_Comm_rank(comm, &c->rank), "is the communicator valid?");
  RT_MPI_TRY(MPI_Comm_size(comm, &c->size), "is the communicator valid?");
  RT_MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &c->world_rank), "is MPI initialized?");
  /* MPI_TAG_UB is an attribute of MPI_COMM_WORLD; the standard promises at least 32767 */
  int *ub = NULL, has_ub = 0;
  c->tag_ub = 32767;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has_ub) == MPI_SUCCESS && has_ub && ub && *ub > c->tag_ub)
    c->tag_ub = *ub;
  RT_MPI_TRY(MPI_Comm_dup(comm, &c->side), "out of communicators? free the groups you no longer use");
  RT_MPI_TRY(MPI_Comm_set_errhandler(c->side, MPI_ERRORS_RETURN), "is MPI initialized?");
  c->world_ranks = ts_xmalloc((size_t)c->size * sizeof(int));
  idx = ts_xmalloc((size_t)c->size * sizeof(int));
  for (int i = 0; i < c->size; i++) idx[i] = i;
  RT_MPI_TRY(MPI_Comm_group(comm, &g), "is the communicator valid?");
  RT_MPI_TRY(MPI_Comm_group(MPI_COMM_WORLD, &wg), "is MPI initialized?");
  RT_MPI_TRY(MPI_Group_translate_ranks(g, c->size, idx, wg, c->world_ranks), "internal error");
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  free(idx);
  return c;
fail:
  if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
  if (wg != MPI_GROUP_NULL) MPI_Group_free(&wg);
  free(idx);
  c->comm = MPI_COMM_NULL;   /* the caller still owns comm on failure */
  rt_comm_free(c);
  return NULL;
}

static double default_timeout(double t) {
  if (t > 0) return t;
  const char *e = getenv("TS_COMM_TIMEOUT");
  if (e && *e) {
    char *end;
    double v = strtod(e, &end);
    if (*end == 0 && v > 0) return v;
    fprintf(stderr, "warning: ignoring TS_COMM_TIMEOUT='%s' (want seconds > 0)\n", e);
  }
  return RT_COMM_DEFAULT_TIMEOUT;
}

RtComm *rt_comm_init_mpi(int *argc, char ***argv, double timeout_s, char *err, size_t errlen) {
  int init = 0, fin = 0, ours = 0;
  MPI_Finalized(&fin);
  if (fin) { ts_errf(err, errlen, "MPI was already finalized in this process"); return NULL; }
  MPI_Initialized(&init);
  if (!init) {
    int rc = MPI_Init(argc, argv);
    if (rc != MPI_SUCCESS) {
      mpi_fail(err, errlen, "MPI_Init", rc, "run under mpirun, and check that its Open MPI matches the one we were built with");
      return NULL;
    }
    ours = 1;
  }
  RtComm *c = rt_comm_wrap_mpi(MPI_COMM_WORLD, "world", default_timeout(timeout_s), err, errlen);
  if (!c) { if (ours) MPI_Finalize(); return NULL; }
  c->owns_mpi = ours;
  return c;
}

void rt_comm_free(RtComm *c) {
  if (!c) return;
  if (c->ops && c->ops->free_impl) c->ops->free_impl(c);
  if (c->side != MPI_COMM_NULL) MPI_Comm_free(&c->side);
  if (!c->is_world && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
  int fin = c->owns_mpi;
  free(c->world_ranks);
  free(c);
  if (fin) MPI_Finalize();
}

int rt_comm_rank(const RtComm *c) { return c->rank; }
int rt_comm_size(const RtComm *c) { return c->size; }
int rt_comm_world_rank(const RtComm *c) { return c->world_rank; }
const char *rt_comm_name(const RtComm *c) { return c->name; }
double rt_comm_timeout(const RtComm *c) { return c->timeout; }
void rt_comm_set_timeout(RtComm *c, double seconds) { c->timeout = default_timeout(seconds); }
int rt_comm_is_nccl(const RtComm *c) { return c->ops->device_buffers; }

RtComm *rt_comm_split(RtComm *c, int color, int key, const char *name, char *err, size_t errlen) {
  MPI_Comm sub = MPI_COMM_NULL;
  if (color < 0) { ts_errf(err, errlen, "rt_comm_split on group %s: color must be >= 0, got %d", c->name, color); return NULL; }
  RT_MPI_TRY(MPI_Comm_split(c->comm, color, key, &sub),
             "every rank of the group must call split (a rank missing here hangs the others)");
  RtComm *s = rt_comm_wrap_mpi(sub, name, c->timeout, err, errlen);
  if (!s) { MPI_Comm_free(&sub); return NULL; }
  if (c->ops->derive) {   /* e.g. a NCCL group splits into NCCL groups over the split MPI group */
    RtComm *n = c->ops->derive(c, s, err, errlen);
    rt_comm_free(s);
    if (n) snprintf(n->name, sizeof n->name, "%s", name ? name : "?");
    return n;
  }
  return s;
fail:
  return NULL;
}

/* 0 when c has the mesh's ranks, else -1 with the message. */
static int mesh_fits(const RtComm *c, const PlanMesh *m, char *err, size_t errlen) {
  if (rt_mesh_size(m) == c->size) return 0;
  return ts_errf(err, errlen, "mesh dp=%d pp=%d cp=%d ep=%d tp=%d has %d ranks but group %s has %d "
                 "(hint: start as many ranks as the plan's mesh, mpirun -np %d)",
                 m->dp, m->pp, m->cp, m->ep, m->tp, rt_mesh_size(m), c->name, c->size, rt_mesh_size(m));
}

RtComm *rt_comm_mesh_group(RtComm *c, const PlanMesh *m, RtMeshAxis a, char *err, size_t errlen) {
  int coord[RT_AXIS_COUNT];
  if (a >= RT_AXIS_COUNT) { ts_errf(err, errlen, "rt_comm_mesh_group: no mesh axis %d", (int)a); return NULL; }
  if (mesh_fits(c, m, err, errlen) != 0) return NULL;
  rt_mesh_coords(m, c->rank, coord);
  /* color: this rank with its coordinate on a set to 0 (shared by the group);
   * key: the coordinate on a, so group rank i is coordinate i. */
  int key = coord[a];
  coord[a] = 0;
  return rt_comm_split(c, rt_mesh_rank(m, coord), key, rt_mesh_axis_name(a), err, errlen);
}

int rt_mesh_axes_index(const PlanMesh *m, unsigned mask, const int coord[RT_AXIS_COUNT]) {
  const int size[RT_AXIS_COUNT] = {m->dp, m->pp, m->cp, m->ep, m->tp};
  int k = 0;
  for (int a = 0; a < RT_AXIS_COUNT; a++)   /* outer axis major */
    if (mask & (1u << a)) k = k * (size[a] < 1 ? 1 : size[a]) + coord[a];
  return k;
}

RtComm *rt_comm_mesh_axes_group(RtComm *c, const PlanMesh *m, unsigned mask, char *err, size_t errlen) {
  int coord[RT_AXIS_COUNT];
  if (!mask || (mask >> RT_AXIS_COUNT)) {
    ts_errf(err, errlen, "rt_comm_mesh_axes_group: bad axis mask %#x", mask);
    return NULL;
  }
  if (mesh_fits(c, m, err, errlen) != 0) return NULL;
  rt_mesh_coords(m, c->rank, coord);
  int key = rt_mesh_axes_index(m, mask, coord);
  char name[32];
  size_t k = 0;
  name[0] = 0;
  for (int a = 0; a < RT_AXIS_COUNT; a++) {
    if (!(mask & (1u << a))) continue;
    k += (size_t)snprintf(name + k, sizeof name - k, "%s%s", k ? "+" : "", rt_mesh_axis_name((RtMeshAxis)a));
    coord[a] = 0;   /* color: the coordinates outside the set */
  }
  return rt_comm_split(c, rt_mesh_rank(m, coord), key, name, err, errlen);
}

/* ---------------- the rank in the mesh ---------------- */

RtRank rt_rank_single(void) {
  RtRank r;
  memset(&r, 0, sizeof r);
  r.mesh = (PlanMesh){1, 1, 1, 1, 1};
  return r;
}

int rt_rank_axis_size(const RtRank *r, IrAxis a) {
  int v = 1;
  switch (a) {
  case IR_AXIS_DP: v = r->mesh.dp; break;
  case IR_AXIS_PP: v = r->mesh.pp; break;
  case IR_AXIS_CP: v = r->mesh.cp; break;
  case IR_AXIS_EP: v = r->mesh.ep; break;
  case IR_AXIS_TP: v = r->mesh.tp; break;
  default: break;
  }
  return v < 1 ? 1 : v;
}

/* the axes of v with size > 1 */
static unsigned live_axes(const RtRank *r, int64_t v) {
  unsigned mask = ir_axes_mask(v), live = 0;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if ((mask & (1u << a)) && rt_rank_axis_size(r, (IrAxis)a) > 1) live |= 1u << a;
  return live;
}

int rt_rank_axes_size(const RtRank *r, int64_t v) {
  unsigned mask = ir_axes_mask(v);
  int k = 1;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (mask & (1u << a)) k *= rt_rank_axis_size(r, (IrAxis)a);
  return k;
}

RtComm *rt_rank_axes_group(const RtRank *r, int64_t v, int dev) {
  unsigned live = live_axes(r, v);
  if (!live) return NULL;
  if (!(live & (live - 1))) {
    int a = __builtin_ctz(live);
    return dev ? r->dev_group[a] : r->group[a];
  }
  return dev ? r->dev_sets[live] : r->sets[live];
}

int rt_rank_axes_groups(RtRank *r, RtComm *world, char *err, size_t errlen) {
  const unsigned D = 1u << IR_AXIS_DP, C = 1u << IR_AXIS_CP, E = 1u << IR_AXIS_EP;
  const unsigned want[3] = {D | C, D | E, D | C | E};
  for (int i = 0; i < 3; i++) {
    unsigned live = live_axes(r, IR_AXES_SET | (int64_t)want[i]);
    if (!(live & (live - 1)) || r->sets[live]) continue;   /* one axis: its own group */
    if (!(r->sets[live] = rt_comm_mesh_axes_group(world, &r->mesh, live, err, errlen))) {
      rt_rank_axes_groups_free(r);
      return -1;
    }
  }
  return 0;
}

void rt_rank_axes_groups_free(RtRank *r) {
  for (unsigned k = 0; k < (1u << IR_AXIS_COUNT); k++) {
    rt_comm_free(r->sets[k]);
    r->sets[k] = NULL;
  }
}

/* ---------------- waiting with a deadline ---------------- */

/* Short sleeps, growing: ranks share cores (mpirun --oversubscribe), so
 * busy-polling would starve the very peer we wait for.  After a few ms of
 * waiting the rank sleeps 1 ms per poll: with 64 ranks on 2 cores, idle
 * ranks waking every few microseconds would eat the working ranks' CPU. */
static void backoff(int iter) {
  if (iter < 32) { sched_yield(); return; }
  long ns = iter < 150 ? 30000 : 1000000;
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* On timeout of a collective: tell every peer (on the side communicator)
 * which collective we are in, listen for a grace period, and name the
 * peers that were silent or elsewhere.  Writes the guess into out. */
void rt_comm_diagnose(RtComm *c, RtCollKind k, char *out, size_t n) {
  int p = c->size;
  long mine[2] = {(long)c->seq, (long)k};
  long *got = ts_xcalloc((size_t)p * 2, sizeof(long));
  MPI_Request *rq = ts_xmalloc((size_t)p * 2 * sizeof *rq);
  int *done = ts_xcalloc((size_t)p, sizeof(int));
  const int tag = 7001;
  for (int i = 0; i < p; i++) {
    rq[2 * i] = rq[2 * i + 1] = MPI_REQUEST_NULL;
    if (i == c->rank) { done[i] = 1; continue; }
    MPI_Irecv(got + 2 * i, 2, MPI_LONG, i, tag, c->side, &rq[2 * i]);
    MPI_Isend(mine, 2, MPI_LONG, i, tag, c->side, &rq[2 * i + 1]);
  }
  double grace = c->timeout / 10;
  if (grace < 0.3) grace = 0.3;
  if (grace > 2.0) grace = 2.0;
  double end = ts_now_s() + grace;
  for (int iter = 0, left = p - 1; left > 0 && ts_now_s() < end; iter++) {
    for (int i = 0; i < p; i++) {
      int f = 0;
      if (done[i] || MPI_Test(&rq[2 * i], &f, MPI_STATUS_IGNORE) != MPI_SUCCESS || !f) continue;
      done[i] = 1;
      left--;
    }
    backoff(iter);
  }
  size_t len = 0;
  out[0] = 0;
  for (int i = 0; i < p && len + 1 < n; i++) {
    if (i == c->rank) continue;
    int w;
    if (!done[i])
      w = snprintf(out + len, n - len, "%swaiting for rank %d?", len ? "; " : "", c->world_ranks[i]);
    else if (got[2 * i] != mine[0] || got[2 * i + 1] != mine[1])
      w = snprintf(out + len, n - len, "%srank %d is in %s #%ld of this group, we are in %s #%ld (mismatched programs?)",
                   len ? "; " : "", c->world_ranks[i], rt_coll_name((RtCollKind)got[2 * i + 1]), got[2 * i],
                   rt_coll_name(k), (long)c->seq);
    else continue;
    if (w > 0) len += (size_t)w;
  }
  if (len >= n) len = n - 1;
  if (!out[0]) snprintf(out, n, "every peer answered; a slow network?");
  /* The requests are left posted on purpose: the job is about to abort. */
  free(got); free(rq); free(done);
}

void rt_comm_wait_mpi(RtComm *c, MPI_Request *req, RtCollKind k, int peer) {
  double start = ts_now_s(), end = start + c->timeout;
  for (int iter = 0;; iter++) {
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Test(req, &flag, &st);
    if (rc != MPI_SUCCESS) {
      char s[MPI_MAX_ERROR_STRING];
      mpi_errstr(rc, s, sizeof s);
      if (peer >= 0)
        rt_comm_abort(c, "%s %s rank %d on group %s failed: %s (hint: did rank %d die?)", rt_coll_name(k),
                      k == RT_COLL_SEND ? "to" : "from", c->world_ranks[peer], c->name, s, c->world_ranks[peer]);
      rt_comm_abort(c, "collective %s on group %s failed: %s (hint: a rank of the group died, or the ranks "
                    "disagree on count or dtype)", rt_coll_name(k), c->name, s);
    }
    if (flag) return;
    if (ts_now_s() > end) {
      char who[512];
      if (peer >= 0) {
        snprintf(who, sizeof who, "waiting for rank %d?", c->world_ranks[peer]);
        rt_comm_abort(c, "%s %s rank %d on group %s timed out after %g s (%s)", rt_coll_name(k),
                      k == RT_COLL_SEND ? "to" : "from", c->world_ranks[peer], c->name, c->timeout, who);
      }
      rt_comm_diagnose(c, k, who, sizeof who);
      rt_comm_abort(c, "collective %s on group %s timed out after %g s (%s)", rt_coll_name(k), c->name,
                    c->timeout, who);
    }
    backoff(iter);
  }
}

/* ---------------- collectives ---------------- */

static int check_args(RtComm *c, RtCollKind k, IrDtype dt, const void *a, const void *b, size_t count,
                      char *err, size_t errlen) {
  /* i32 (token ids) and 16-bit values only move: gathered or sent point to
   * point (a pipeline's 16-bit activations), never summed */
  int moves = k == RT_COLL_ALL_GATHER || k == RT_COLL_SEND || k == RT_COLL_RECV;
  if (dt != IR_F32 && dt != IR_F64 && !((dt == IR_I32 || ir_dtype_is_16(dt)) && moves))
    return ts_errf(err, errlen, "%s on group %s: dtype %s is not supported (f32 or f64%s)", rt_coll_name(k),
                   c->name, ir_dtype_name(dt), moves ? ", i32, bf16 or f16" : "");
  /* MPI counts are int; the gathered side of a collective is size*count. */
  size_t mult = (k == RT_COLL_ALL_REDUCE || k == RT_COLL_SEND || k == RT_COLL_RECV) ? 1 : (size_t)c->size;
  if (count > (size_t)INT_MAX / mult)
    return ts_errf(err, errlen, "%s on group %s: %zu elements is more than one MPI call can carry "
                   "(hint: split the buffer)", rt_coll_name(k), c->name, count);
  if (count > 0 && (!a || !b))
    return ts_errf(err, errlen, "%s on group %s: NULL buffer", rt_coll_name(k), c->name);
  return 0;
}

static MPI_Datatype mpi_type(IrDtype dt) {
  return dt == IR_F64 ? MPI_DOUBLE : dt == IR_I32 ? MPI_INT : ir_dtype_is_16(dt) ? MPI_UINT16_T : MPI_FLOAT;
}

/* The MPI backend's collectives (RtCommOps.coll): posted nonblocking and
 * waited for against the group's deadline. */
static int mpi_coll(RtComm *c, RtCollKind k, int max, IrDtype dt, const void *send, void *recv, size_t count, int peer,
                    int tag, char *err, size_t errlen) {
  MPI_Request r;
  MPI_Datatype t = mpi_type(dt);
  int n = (int)count;
  const char *hint = "a rank of the group died, or MPI is out of memory";
  switch (k) {
  case RT_COLL_ALL_REDUCE:
    RT_MPI_FATAL(c, k, MPI_Iallreduce(MPI_IN_PLACE, recv, n, t, max ? MPI_MAX : MPI_SUM, c->comm, &r), hint);
    break;
  case RT_COLL_ALL_GATHER: RT_MPI_FATAL(c, k, MPI_Iallgather(send, n, t, recv, n, t, c->comm, &r), hint); break;
  case RT_COLL_REDUCE_SCATTER:
    RT_MPI_FATAL(c, k, MPI_Ireduce_scatter_block(send, recv, n, t, MPI_SUM, c->comm, &r), hint);
    break;
  case RT_COLL_ALL_TO_ALL: RT_MPI_FATAL(c, k, MPI_Ialltoall(send, n, t, recv, n, t, c->comm, &r), hint); break;
  case RT_COLL_SEND:
    RT_MPI_FATAL(c, k, MPI_Isend(send, n, t, peer, tag, c->comm, &r), "the peer died, or MPI is out of memory");
    break;
  case RT_COLL_RECV:
    RT_MPI_FATAL(c, k, MPI_Irecv(recv, n, t, peer, tag, c->comm, &r), "the peer died, or MPI is out of memory");
    break;
  default: return ts_errf(err, errlen, "%s is not an MPI collective here", rt_coll_name(k));
  }
  rt_comm_wait_mpi(c, &r, k, k == RT_COLL_SEND || k == RT_COLL_RECV ? peer : -1);
  return 0;
}

static int mpi_all_to_all_v(RtComm *c, IrDtype dt, const void *send, const int *scount, const int *sdispl, void *recv,
                            const int *rcount, const int *rdispl, char *err, size_t errlen) {
  (void)err, (void)errlen;
  MPI_Request r;
  RT_MPI_FATAL(c, RT_COLL_ALL_TO_ALL, MPI_Ialltoallv(send, scount, sdispl, mpi_type(dt), recv, rcount, rdispl,
                                                      mpi_type(dt), c->comm, &r),
               "a rank of the group died, or MPI is out of memory");
  rt_comm_wait_mpi(c, &r, RT_COLL_ALL_TO_ALL, -1);
  return 0;
}

static void mpi_isend(RtComm *c, RtCommReq *r) {
  RT_MPI_FATAL(c, RT_COLL_SEND, MPI_Isend(r->buf, (int)r->count, mpi_type(r->dt), r->peer, r->tag, c->comm, &r->r),
               "the peer died, or MPI is out of memory");
}

/* One poll of r: 1 if it has completed (not freed), 0 if not.  An MPI
 * error ends the job, naming the peer. */
static int mpi_req_done(RtCommReq *r) {
  int flag = 0;
  int rc = MPI_Test(&r->r, &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS && r->coll) {
    char s[MPI_MAX_ERROR_STRING];
    mpi_errstr(rc, s, sizeof s);
    rt_comm_abort(r->c, "nonblocking %s on group %s failed: %s (hint: did a rank of the group die?)",
                  rt_coll_name((RtCollKind)(r->coll - 1)), r->c->name, s);
  }
  if (rc != MPI_SUCCESS) {
    char s[MPI_MAX_ERROR_STRING];
    mpi_errstr(rc, s, sizeof s);
    rt_comm_abort(r->c, "send to rank %d on group %s failed: %s (hint: did rank %d die?)",
                  r->c->world_ranks[r->peer], r->c->name, s, r->c->world_ranks[r->peer]);
  }
  return flag;
}

const RtCommOps rt_comm_mpi_ops = {
  .name = "mpi", .coll = mpi_coll, .all_to_all_v = mpi_all_to_all_v, .isend = mpi_isend, .req_done = mpi_req_done,
};

/* ---- the public collectives: arguments checked here, then the group's backend ---- */

int rt_comm_all_reduce(RtComm *c, IrDtype dt, void *buf, size_t count, char *err, size_t errlen) {
  if (check_args(c, RT_COLL_ALL_REDUCE, dt, buf, buf, count, err, errlen)) return -1;
  c->seq++;
  return c->ops->coll(c, RT_COLL_ALL_REDUCE, 0, dt, buf, buf, count, -1, 0, err, errlen);
}

int rt_comm_all_reduce_max(RtComm *c, IrDtype dt, void *buf, size_t count, char *err, size_t errlen) {
  if (check_args(c, RT_COLL_ALL_REDUCE, dt, buf, buf, count, err, errlen)) return -1;
  c->seq++;
  return c->ops->coll(c, RT_COLL_ALL_REDUCE, 1, dt, buf, buf, count, -1, 0, err, errlen);
}

/* all_gather, reduce_scatter, all_to_all: send[] and recv[] of count
 * elements per rank block. */
static int blocks(RtComm *c, RtCollKind k, IrDtype dt, const void *send, void *recv, size_t count, char *err,
                  size_t errlen) {
  if (check_args(c, k, dt, send, recv, count, err, errlen)) return -1;
  c->seq++;
  return c->ops->coll(c, k, 0, dt, send, recv, count, -1, 0, err, errlen);
}
int rt_comm_all_gather(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count, char *err, size_t errlen) {
  return blocks(c, RT_COLL_ALL_GATHER, dt, send, recv, count, err, errlen);
}
int rt_comm_reduce_scatter(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count, char *err, size_t errlen) {
  return blocks(c, RT_COLL_REDUCE_SCATTER, dt, send, recv, count, err, errlen);
}
int rt_comm_all_to_all(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count, char *err, size_t errlen) {
  return blocks(c, RT_COLL_ALL_TO_ALL, dt, send, recv, count, err, errlen);
}

int rt_comm_all_to_all_v(RtComm *c, IrDtype dt, const void *send, const int *scount, const int *sdispl, void *recv,
                         const int *rcount, const int *rdispl, char *err, size_t errlen) {
  if (check_args(c, RT_COLL_ALL_TO_ALL, dt, send, recv, 0, err, errlen)) return -1;
  c->seq++;
  return c->ops->all_to_all_v(c, dt, send, scount, sdispl, recv, rcount, rdispl, err, errlen);
}

static int check_peer(RtComm *c, RtCollKind k, int peer, int tag, char *err, size_t errlen) {
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return ts_errf(err, errlen, "%s on group %s: peer %d is not another rank of the group (size %d, we are %d)",
                   rt_coll_name(k), c->name, peer, c->size, c->rank);
  if (tag < 0 || tag > c->tag_ub)
    return ts_errf(err, errlen, "%s on group %s: tag %d is outside 0..%d (MPI_TAG_UB)", rt_coll_name(k), c->name,
                   tag, c->tag_ub);
  return 0;
}

int rt_comm_send(RtComm *c, IrDtype dt, const void *buf, size_t count, int peer, int tag, char *err, size_t errlen) {
  if (check_args(c, RT_COLL_SEND, dt, buf, buf, count, err, errlen) ||
      check_peer(c, RT_COLL_SEND, peer, tag, err, errlen)) return -1;
  return c->ops->coll(c, RT_COLL_SEND, 0, dt, buf, NULL, count, peer, tag, err, errlen);
}

int rt_comm_recv(RtComm *c, IrDtype dt, void *buf, size_t count, int peer, int tag, char *err, size_t errlen) {
  if (check_args(c, RT_COLL_RECV, dt, buf, buf, count, err, errlen) ||
      check_peer(c, RT_COLL_RECV, peer, tag, err, errlen)) return -1;
  return c->ops->coll(c, RT_COLL_RECV, 0, dt, NULL, buf, count, peer, tag, err, errlen);
}

int rt_comm_barrier(RtComm *c, char *err, size_t errlen) {
  /* A NCCL group barriers over its MPI group too: the host is what waits. */
  MPI_Request r;
  c->seq++;
  RT_MPI_FATAL(c, RT_COLL_BARRIER, MPI_Ibarrier(c->comm, &r), "a rank of the group died");
  rt_comm_wait_mpi(c, &r, RT_COLL_BARRIER, -1);
  return 0;
}

/* ---------------- nonblocking sends ---------------- */

int rt_comm_isend(RtComm *c, IrDtype dt, const void *buf, size_t count, int peer, int tag, RtCommReq **req,
                  char *err, size_t errlen) {
  *req = NULL;
  if (check_args(c, RT_COLL_SEND, dt, buf, buf, count, err, errlen) ||
      check_peer(c, RT_COLL_SEND, peer, tag, err, errlen)) return -1;
  RtCommReq *r = ts_xcalloc(1, sizeof *r);
  *r = (RtCommReq){.c = c, .r = MPI_REQUEST_NULL, .peer = peer, .tag = tag, .dt = dt, .buf = buf, .count = count};
  c->ops->isend(c, r);
  *req = r;
  return 0;
}

int rt_comm_test(RtCommReq **req) {
  if (!*req) return 1;
  if (!(*req)->c->ops->req_done(*req)) return 0;
  free(*req);
  *req = NULL;
  return 1;
}

int rt_comm_wait_all(RtCommReq **reqs, int n, char *err, size_t errlen) {
  (void)err; (void)errlen;   /* every failure here ends the job */
  double timeout = 0;
  for (int i = 0; i < n; i++) {
    if (!reqs[i]) continue;
    if (reqs[i]->c->timeout > timeout) timeout = reqs[i]->c->timeout;
    if (reqs[i]->queued) reqs[i]->c->ops->flush(reqs[i]->c);   /* posts (and finishes) its whole group */
  }
  double end = ts_now_s() + timeout;
  for (int iter = 0;; iter++) {
    int left = 0;
    for (int i = 0; i < n; i++) left += !rt_comm_test(&reqs[i]);
    if (!left) return 0;
    if (ts_now_s() > end) {
      for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        RtComm *c = reqs[i]->c;
        int w = c->world_ranks[reqs[i]->peer];
        rt_comm_abort(c, "send to rank %d on group %s timed out after %g s (waiting for rank %d?) "
                      "(%d send%s not received)", w, c->name, timeout, w, left, left == 1 ? "" : "s");
      }
    }
    backoff(iter);
  }
}

/* ---------------- nonblocking collectives ---------------- */

static int icoll(RtComm *c, RtCollKind k, IrDtype dt, const void *send, void *recv, size_t count, RtCommReq **req,
                 char *err, size_t errlen) {
  *req = NULL;
  if (check_args(c, k, dt, send, recv, count, err, errlen)) return -1;
  if (c->ops != &rt_comm_mpi_ops)
    return ts_errf(err, errlen, "nonblocking %s on group %s: only MPI groups (host memory) post collectives "
                   "without waiting; this group runs on %s", rt_coll_name(k), c->name, c->ops->name);
  RtCommReq *r = ts_xcalloc(1, sizeof *r);
  *r = (RtCommReq){.c = c, .r = MPI_REQUEST_NULL, .peer = -1, .tag = -1, .dt = dt, .buf = send, .count = count,
                   .coll = (int)k + 1};
  c->seq++;
  const char *hint = "a rank of the group died, or MPI is out of memory";
  if (k == RT_COLL_ALL_REDUCE)
    RT_MPI_FATAL(c, k, MPI_Iallreduce(MPI_IN_PLACE, recv, (int)count, mpi_type(dt), MPI_SUM, c->comm, &r->r), hint);
  else
    RT_MPI_FATAL(c, k, MPI_Ireduce_scatter_block(send, recv, (int)count, mpi_type(dt), MPI_SUM, c->comm, &r->r),
                 hint);
  *req = r;
  return 0;
}

int rt_comm_iall_reduce(RtComm *c, IrDtype dt, void *buf, size_t count, RtCommReq **req, char *err, size_t errlen) {
  return icoll(c, RT_COLL_ALL_REDUCE, dt, buf, buf, count, req, err, errlen);
}

int rt_comm_ireduce_scatter(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count, RtCommReq **req,
                            char *err, size_t errlen) {
  return icoll(c, RT_COLL_REDUCE_SCATTER, dt, send, recv, count, req, err, errlen);
}

int rt_comm_coll_wait(RtCommReq **req, char *err, size_t errlen) {
  (void)err; (void)errlen;   /* every failure here ends the job */
  RtCommReq *r = *req;
  if (!r) return 0;
  rt_comm_wait_mpi(r->c, &r->r, (RtCollKind)(r->coll ? r->coll - 1 : RT_COLL_SEND), r->coll ? -1 : r->peer);
  free(r);
  *req = NULL;
  return 0;
}
