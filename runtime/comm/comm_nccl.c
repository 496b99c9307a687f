/* comm_nccl.c - the communication layer over NCCL (GPU ranks), bootstrapped
 * through MPI: rank 0 makes the NCCL unique id, MPI broadcasts it, every
 * rank calls ncclCommInitRank.  See comm.h for the contract.
 *
 * libcudart and libnccl.so.2 are loaded (ir/dl.h) on first use and never
 * linked, so mcc/mrun start on machines without a GPU, a driver or NCCL;
 * there rt_comm_init_nccl returns a clear "no GPU: ..." error.  We declare
 * the few types and prototypes we call ourselves (NCCL's ABI is stable);
 * when nccl.h is found at build time (TS_HAVE_NCCL_H) the declarations are
 * checked against it.
 *
 * Every NCCL/CUDA call goes through a check that names the call and adds a
 * hint.  By default operations are enqueued on one stream per group and
 * then polled (cudaStreamQuery) against the group's deadline, so a stalled
 * peer ends the job with a message instead of a hang (ncclCommAbort first,
 * so the GPU kernels stop).  Not guaranteed: ncclCommInitRank itself blocks
 * until every rank arrives.
 *
 * A group bound to a device's stream (rt_comm_nccl_bind: the executor
 * passes its device's comm stream) instead enqueues there and
 * returns at once: the executor orders collectives against compute with
 * the device's events (record on compute, wait on comm, and back), so
 * communication overlaps computation, and a CUDA Graph capture can take
 * collectives in (NCCL supports capture; polling a capturing stream is not
 * allowed, hence no waiting here).  rt_comm_nccl_wait waits for the comm
 * stream with the deadline and the diagnostics of the default mode. */
#define RT_COMM_INTERNAL
#include "runtime/comm/comm.h"
#include "ir/dl.h"
#include <time.h>

/* ---- the ABI we use ---- */
typedef int ncResult;                /* ncclResult_t: 0 = ncclSuccess, 7 = ncclInProgress */
typedef int cuError;                 /* cudaError_t: 0 = cudaSuccess, 600 = cudaErrorNotReady */
typedef struct ncOpaque *ncComm;     /* ncclComm_t */
typedef struct cuStreamOpaque *cuStream;
typedef struct { char internal[128]; } ncUniqueId;
enum { NC_SUCCESS = 0, NC_IN_PROGRESS = 7, NC_SUM = 0, NC_MAX = 2, NC_INT32 = 2, NC_FLOAT32 = 7, NC_FLOAT64 = 8, NC_FLOAT16 = 6, NC_BFLOAT16 = 9,
       NC_FLOAT8E4M3 = 10, NC_FLOAT8E5M2 = 11, CU_NOT_READY = 600 };

#ifdef TS_HAVE_NCCL_H
#include <nccl.h>
_Static_assert(sizeof(ncUniqueId) == sizeof(ncclUniqueId), "ncclUniqueId size");
_Static_assert(NC_SUM == (int)ncclSum && NC_MAX == (int)ncclMax && NC_FLOAT32 == (int)ncclFloat32 && NC_FLOAT64 == (int)ncclFloat64 &&
               NC_INT32 == (int)ncclInt32 && NC_FLOAT16 == (int)ncclFloat16 && NC_BFLOAT16 == (int)ncclBfloat16 &&
               NC_FLOAT8E4M3 == (int)ncclFloat8e4m3 && NC_FLOAT8E5M2 == (int)ncclFloat8e5m2 &&
               NC_SUCCESS == (int)ncclSuccess && NC_IN_PROGRESS == (int)ncclInProgress, "NCCL enums");
_Static_assert(CU_NOT_READY == (int)cudaErrorNotReady, "cudaErrorNotReady");
#endif

/* Every dtype to its own NCCL type (a sum of i32 bit patterns as floats
 * would be garbage): no default, so a new dtype is a -Wswitch warning
 * here until it is mapped. */
static int nc_type(IrDtype dt) {
  switch (dt) {
  case IR_F32: return NC_FLOAT32;
  case IR_F64: return NC_FLOAT64;
  case IR_I32: return NC_INT32;
  case IR_BF16: return NC_BFLOAT16;
  case IR_F16: return NC_FLOAT16;
  case IR_F8E4M3: return NC_FLOAT8E4M3;   /* NCCL 2.24+ */
  case IR_F8E5M2: return NC_FLOAT8E5M2;
  case IR_VOID: case IR_DTYPE_COUNT: break;
  }
  TS_DIE("comm_nccl: dtype %d has no NCCL data type", (int)dt);
}

/* The two libraries' entry points (one table each, loaded by ir/dl.h). */
typedef struct {
  cuError (*GetDeviceCount)(int *);
  cuError (*SetDevice)(int);
  cuError (*StreamCreate)(cuStream *);
  cuError (*StreamDestroy)(cuStream);
  cuError (*StreamQuery)(cuStream);
  const char *(*GetErrorString)(cuError);
} CudartLib;
typedef struct {
  ncResult (*GetUniqueId)(ncUniqueId *);
  ncResult (*CommInitRank)(ncComm *, int, ncUniqueId, int);
  ncResult (*CommDestroy)(ncComm);
  ncResult (*CommAbort)(ncComm);
  ncResult (*CommGetAsyncError)(ncComm, ncResult *);
  const char *(*ncGetErrorString)(ncResult);
  ncResult (*AllReduce)(const void *, void *, size_t, int, int, ncComm, cuStream);
  ncResult (*AllGather)(const void *, void *, size_t, int, ncComm, cuStream);
  ncResult (*ReduceScatter)(const void *, void *, size_t, int, int, ncComm, cuStream);
  ncResult (*Send)(const void *, size_t, int, int, ncComm, cuStream);
  ncResult (*Recv)(void *, size_t, int, int, ncComm, cuStream);
  ncResult (*GroupStart)(void);
  ncResult (*GroupEnd)(void);
} NcclLib;
static CudartLib LC;
static NcclLib LN;
static struct { int tried; char why[1024]; } libs;   /* why loading failed ("" = loaded) */

static const TsDlSym cudart_syms[] = {
  TS_DL_SYM(CudartLib, GetDeviceCount, "cudaGetDeviceCount"), TS_DL_SYM(CudartLib, SetDevice, "cudaSetDevice"),
  TS_DL_SYM(CudartLib, StreamCreate, "cudaStreamCreate"),     TS_DL_SYM(CudartLib, StreamDestroy, "cudaStreamDestroy"),
  TS_DL_SYM(CudartLib, StreamQuery, "cudaStreamQuery"),       TS_DL_SYM(CudartLib, GetErrorString, "cudaGetErrorString"),
};
static const TsDlSym nccl_syms[] = {
  TS_DL_SYM(NcclLib, GetUniqueId, "ncclGetUniqueId"),       TS_DL_SYM(NcclLib, CommInitRank, "ncclCommInitRank"),
  TS_DL_SYM(NcclLib, CommDestroy, "ncclCommDestroy"),       TS_DL_SYM(NcclLib, CommAbort, "ncclCommAbort"),
  TS_DL_SYM(NcclLib, CommGetAsyncError, "ncclCommGetAsyncError"),
  TS_DL_SYM(NcclLib, ncGetErrorString, "ncclGetErrorString"),
  TS_DL_SYM(NcclLib, AllReduce, "ncclAllReduce"),           TS_DL_SYM(NcclLib, AllGather, "ncclAllGather"),
  TS_DL_SYM(NcclLib, ReduceScatter, "ncclReduceScatter"),   TS_DL_SYM(NcclLib, Send, "ncclSend"),
  TS_DL_SYM(NcclLib, Recv, "ncclRecv"),                     TS_DL_SYM(NcclLib, GroupStart, "ncclGroupStart"),
  TS_DL_SYM(NcclLib, GroupEnd, "ncclGroupEnd"),
};

/* Loads both libraries once per process (handles stay open: the symbols
 * are used until exit).  0 on success, else libs.why says what is missing. */
static int load_libs(void) {
  if (libs.tried) return libs.why[0] ? -1 : 0;
  libs.tried = 1;
  static const char *const cudart[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", NULL};
  static const char *const nccl[] = {"libnccl.so.2", "libnccl.so", NULL};
  char detail[900];
  TsDlStatus st;
  if (!ts_dl_load(cudart, cudart_syms, (int)(sizeof cudart_syms / sizeof cudart_syms[0]), &LC, NULL, &st, detail,
                  sizeof detail)) {
    if (st == TS_DL_NOT_FOUND) snprintf(libs.why, sizeof libs.why, "cannot load the CUDA runtime (libcudart.so): %s", detail);
    else snprintf(libs.why, sizeof libs.why, "%s not found (CUDA runtime or NCCL too old?)", detail);
    return -1;
  }
  if (!ts_dl_load(nccl, nccl_syms, (int)(sizeof nccl_syms / sizeof nccl_syms[0]), &LN, NULL, &st, detail,
                  sizeof detail)) {
    if (st == TS_DL_NOT_FOUND)
      snprintf(libs.why, sizeof libs.why, "cannot load NCCL (libnccl.so.2): %s", detail);
    else snprintf(libs.why, sizeof libs.why, "%s not found (CUDA runtime or NCCL too old?)", detail);
    return -1;
  }
  return 0;
}

typedef struct {
  ncComm comm;
  cuStream stream;           /* the group's own (default mode) */
  cuStream bound;            /* a device's comm stream (rt_comm_nccl_bind), not owned; NULL: none */
  RtCollKind last;           /* the last operation enqueued, for rt_comm_nccl_wait's messages */
  int device;
  VEC(RtCommReq *) queued;   /* sends of rt_comm_isend not posted yet */
} RtNccl;                    /* RtComm.impl of a NCCL group */

static const RtCommOps nccl_ops;
static RtNccl *NC(const RtComm *c) { return c->impl; }
/* Where c's operations go. */
static cuStream nstream(const RtComm *c) { return NC(c)->bound ? NC(c)->bound : NC(c)->stream; }

static const char *cu_str(cuError e) { return LC.GetErrorString ? LC.GetErrorString(e) : "?"; }
static const char *nc_str(ncResult r) { return LN.ncGetErrorString ? LN.ncGetErrorString(r) : "?"; }

/* Setup checks: message into err, jump to fail.  Communication checks
 * (inside nccl_coll): print and end the job. */
#define CU_TRY(call, hint) do { cuError e_ = (call); if (e_ != 0) { \
    ts_errf(err, errlen, "%s failed: %s (hint: %s)", #call, cu_str(e_), hint); goto fail; } } while (0)
#define NC_TRY(call, hint) do { ncResult r_ = (call); if (r_ != NC_SUCCESS) { \
    ts_errf(err, errlen, "%s failed: %s (hint: %s)", #call, nc_str(r_), hint); goto fail; } } while (0)
#define NC_FATAL(c, k, call, hint) do { ncResult r_ = (call); if (r_ != NC_SUCCESS) { \
    if (NC(c)->comm) LN.CommAbort(NC(c)->comm); \
    rt_comm_abort(c, "%s on group %s failed in %s: %s (hint: %s)", rt_coll_name(k), (c)->name, #call, nc_str(r_), hint); } } while (0)

/* MPI collective helpers bounded by the group's deadline. */
static void agree_min(RtComm *m, int *v) {
  MPI_Request r;
  if (MPI_Iallreduce(MPI_IN_PLACE, v, 1, MPI_INT, MPI_MIN, m->comm, &r) != MPI_SUCCESS)
    rt_comm_abort(m, "MPI_Iallreduce failed while setting up NCCL on group %s", m->name);
  rt_comm_wait_mpi(m, &r, RT_COLL_ALL_REDUCE, -1);
}

static int local_rank(RtComm *m) {
  MPI_Comm node;
  int r = 0;
  if (MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return m->rank;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

RtComm *rt_comm_init_nccl(RtComm *mpi, int device, char *err, size_t errlen) {
  char why[1100] = "";
  int ndev = 0;
  if (mpi->ops != &rt_comm_mpi_ops) {
    ts_errf(err, errlen, "rt_comm_init_nccl: group %s is already a %s group", mpi->name, mpi->ops->name);
    return NULL;
  }
  if (load_libs() < 0) snprintf(why, sizeof why, "%s", libs.why);
  else {
    cuError e = LC.GetDeviceCount(&ndev);
    if (e != 0) snprintf(why, sizeof why, "cudaGetDeviceCount failed: %s (no driver or no device)", cu_str(e));
    else if (ndev <= 0) snprintf(why, sizeof why, "cudaGetDeviceCount reports no device");
    else if (device >= ndev) snprintf(why, sizeof why, "device %d requested, %d present", device, ndev);
  }
  /* Every rank must learn that one rank cannot join, or the others would
   * wait in ncclCommInitRank: agree on the lowest failing rank. */
  int bad = why[0] ? mpi->rank : mpi->size;
  agree_min(mpi, &bad);
  if (bad < mpi->size) {
    if (bad == mpi->rank) ts_errf(err, errlen, "no GPU: %s", why);
    else ts_errf(err, errlen, "no GPU: rank %d of group %s cannot use NCCL", mpi->world_ranks[bad], mpi->name);
    return NULL;
  }

  RtComm *c = NULL;
  MPI_Comm dup = MPI_COMM_NULL;
  if (MPI_Comm_dup(mpi->comm, &dup) != MPI_SUCCESS) { ts_errf(err, errlen, "MPI_Comm_dup failed (hint: out of communicators?)"); return NULL; }
  c = rt_comm_wrap_mpi(dup, mpi->name, mpi->timeout, err, errlen);
  if (!c) { MPI_Comm_free(&dup); return NULL; }
  c->impl = ts_xcalloc(1, sizeof(RtNccl));
  c->ops = &nccl_ops;
  int ok = 1;
  /* Each setup step that can fail on one rank only is followed by an
   * agreement, so that all ranks leave together instead of one waiting in
   * the next collective. */
  NC(c)->device = device >= 0 ? device : local_rank(mpi) % ndev;
  cuError se = LC.SetDevice(NC(c)->device);
  if (se != 0) {
    ts_errf(err, errlen, "cudaSetDevice failed: %s (hint: is the device visible? CUDA_VISIBLE_DEVICES)", cu_str(se));
    ok = 0;
  }
  agree_min(c, &ok);
  if (!ok) { if (!se) ts_errf(err, errlen, "cudaSetDevice failed on another rank of group %s", c->name); rt_comm_free(c); return NULL; }
  struct { int ok; ncUniqueId id; } boot;
  memset(&boot, 0, sizeof boot);
  boot.ok = 1;
  if (c->rank == 0 && LN.GetUniqueId(&boot.id) != NC_SUCCESS) boot.ok = 0;
  MPI_Request r;
  if (MPI_Ibcast(&boot, (int)sizeof boot, MPI_BYTE, 0, c->comm, &r) != MPI_SUCCESS)
    rt_comm_abort(c, "MPI_Ibcast of the NCCL id failed on group %s", c->name);
  rt_comm_wait_mpi(c, &r, RT_COLL_ALL_REDUCE, -1);
  if (!boot.ok) { ts_errf(err, errlen, "ncclGetUniqueId failed on rank 0 of group %s (hint: NCCL_DEBUG=INFO)", c->name); goto fail; }
  NC_TRY(LN.CommInitRank(&NC(c)->comm, c->size, boot.id, c->rank), "NCCL_DEBUG=INFO shows why; are the ranks' GPUs visible to each other?");
  CU_TRY(LC.StreamCreate(&NC(c)->stream), "out of GPU memory?");
  agree_min(c, &ok);
  return c;
fail:
  ok = 0;
  agree_min(c, &ok);   /* the others must not keep a half-made group either */
  rt_comm_free(c);
  return NULL;
}

static void nccl_free(RtComm *c) {
  RtNccl *n = NC(c);
  c->impl = NULL;
  if (!n) return;
  free(n->queued.a);
  if (n->stream) LC.StreamDestroy(n->stream);
  if (n->comm) LN.CommDestroy(n->comm);
  free(n);
}

/* Waits for the group's stream, checking NCCL's async error, until the
 * deadline; then aborts the NCCL communicator and the job.  peer: the group
 * rank of a send/recv partner, or -1 for a collective. */
static void wait_stream(RtComm *c, RtCollKind k, int peer) {
  double end = ts_now_s() + c->timeout;
  for (;;) {
    cuError e = LC.StreamQuery(nstream(c));
    if (e == 0) return;
    if (e != CU_NOT_READY) {
      LN.CommAbort(NC(c)->comm);
      rt_comm_abort(c, "%s on group %s failed: %s (hint: a kernel before it failed, or a rank died)", rt_coll_name(k), c->name, cu_str(e));
    }
    ncResult ae = NC_SUCCESS;
    if (LN.CommGetAsyncError(NC(c)->comm, &ae) == NC_SUCCESS && ae != NC_SUCCESS && ae != NC_IN_PROGRESS) {
      LN.CommAbort(NC(c)->comm);
      rt_comm_abort(c, "%s on group %s failed: %s (hint: NCCL_DEBUG=INFO; a rank died?)", rt_coll_name(k), c->name, nc_str(ae));
    }
    if (ts_now_s() > end) {
      char who[512];
      LN.CommAbort(NC(c)->comm);
      if (peer >= 0) snprintf(who, sizeof who, "waiting for rank %d?", c->world_ranks[peer]);
      else rt_comm_diagnose(c, k, who, sizeof who);   /* the peers time out too and answer over MPI */
      rt_comm_abort(c, "collective %s on group %s timed out after %g s (%s)", rt_coll_name(k), c->name, c->timeout, who);
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

static int nccl_coll(RtComm *c, RtCollKind k, int max, IrDtype dt, const void *send, void *recv, size_t count,
                     int peer, int tag, char *err, size_t errlen) {
  (void)tag;   /* NCCL matches in order on each pair */
  int t = nc_type(dt);
  size_t es = ir_dtype_size(dt);
  ncComm nc = NC(c)->comm;
  cuStream s = nstream(c);
  const char *hint = "NCCL_DEBUG=INFO shows why; are the buffers device memory of this rank's GPU?";
  NC(c)->last = k;
  switch (k) {
  case RT_COLL_ALL_REDUCE: NC_FATAL(c, k, LN.AllReduce(send, recv, count, t, max ? NC_MAX : NC_SUM, nc, s), hint); break;
  case RT_COLL_ALL_GATHER: NC_FATAL(c, k, LN.AllGather(send, recv, count, t, nc, s), hint); break;
  case RT_COLL_REDUCE_SCATTER: NC_FATAL(c, k, LN.ReduceScatter(send, recv, count, t, NC_SUM, nc, s), hint); break;
  case RT_COLL_SEND: NC_FATAL(c, k, LN.Send(send, count, t, peer, nc, s), hint); break;
  case RT_COLL_RECV: {
    /* the queued sends go in the same NCCL group as the receive (comm.h) */
    RtNccl *q = NC(c);
    NC_FATAL(c, k, LN.GroupStart(), hint);
    for (int i = 0; i < q->queued.n; i++) {
      RtCommReq *r = q->queued.a[i];
      int rt = nc_type(r->dt);
      NC_FATAL(c, RT_COLL_SEND, LN.Send(r->buf, r->count, rt, r->peer, nc, s), hint);
    }
    NC_FATAL(c, k, LN.Recv(recv, count, t, peer, nc, s), hint);
    NC_FATAL(c, k, LN.GroupEnd(), hint);
    if (!q->bound) wait_stream(c, k, peer);   /* bound: done in stream order */
    for (int i = 0; i < q->queued.n; i++) q->queued.a[i]->queued = 0, q->queued.a[i]->done = 1;
    q->queued.n = 0;
    return 0;
  }
  case RT_COLL_ALL_TO_ALL:
    /* block j of send goes to rank j, block j of recv comes from rank j;
     * one NCCL group so the sends and receives progress together. */
    NC_FATAL(c, k, LN.GroupStart(), hint);
    for (int j = 0; j < c->size; j++) {
      NC_FATAL(c, k, LN.Send((const char *)send + (size_t)j * count * es, count, t, j, nc, s), hint);
      NC_FATAL(c, k, LN.Recv((char *)recv + (size_t)j * count * es, count, t, j, nc, s), hint);
    }
    NC_FATAL(c, k, LN.GroupEnd(), hint);
    break;
  default:
    return ts_errf(err, errlen, "%s is not a NCCL operation", rt_coll_name(k));
  }
  if (!NC(c)->bound) wait_stream(c, k, k == RT_COLL_SEND || k == RT_COLL_RECV ? peer : -1);
  return 0;
}

/* Variable-count all-to-all: one NCCL group of a send and a receive per
 * peer with a nonzero count (counts agree pairwise, so both sides skip the
 * same pairs). */
static int nccl_all_to_all_v(RtComm *c, IrDtype dt, const void *send, const int *scount, const int *sdispl,
                             void *recv, const int *rcount, const int *rdispl, char *err, size_t errlen) {
  if (!scount || !sdispl || !rcount || !rdispl)
    return ts_errf(err, errlen, "all_to_all_v on group %s: NULL counts or displacements", c->name);
  for (int j = 0; j < c->size; j++)
    if (scount[j] < 0 || sdispl[j] < 0 || rcount[j] < 0 || rdispl[j] < 0 || (scount[j] && !send) ||
        (rcount[j] && !recv))
      return ts_errf(err, errlen, "all_to_all_v on group %s: peer %d has count %d at %d to send, %d at %d to receive",
                     c->name, j, scount[j], sdispl[j], rcount[j], rdispl[j]);
  int t = nc_type(dt);
  size_t es = ir_dtype_size(dt);
  ncComm nc = NC(c)->comm;
  cuStream s = nstream(c);
  const RtCollKind k = RT_COLL_ALL_TO_ALL;
  const char *hint = "NCCL_DEBUG=INFO shows why; do the counts agree pairwise between the ranks?";
  NC(c)->last = k;
  NC_FATAL(c, k, LN.GroupStart(), hint);
  for (int j = 0; j < c->size; j++) {
    if (scount[j])
      NC_FATAL(c, k, LN.Send((const char *)send + (size_t)sdispl[j] * es, (size_t)scount[j], t, j, nc, s), hint);
    if (rcount[j]) NC_FATAL(c, k, LN.Recv((char *)recv + (size_t)rdispl[j] * es, (size_t)rcount[j], t, j, nc, s), hint);
  }
  NC_FATAL(c, k, LN.GroupEnd(), hint);
  if (!NC(c)->bound) wait_stream(c, k, -1);
  return 0;
}

int rt_comm_nccl_bind(RtComm *c, void *stream, int gpu, char *err, size_t errlen) {
  if (c->ops != &nccl_ops)
    return ts_errf(err, errlen, "group %s is not a NCCL group: only NCCL groups run on a device stream", c->name);
  RtNccl *q = NC(c);
  if (q->queued.n)
    return ts_errf(err, errlen, "group %s has %d send(s) not posted yet: wait for them before changing its stream",
                   c->name, q->queued.n);
  if (!stream) {   /* back to the group's own stream, after what is on the device's */
    if (q->bound) wait_stream(c, q->last, -1);
    q->bound = NULL;
    return 0;
  }
  if (gpu != q->device)
    return ts_errf(err, errlen, "group %s runs on GPU %d but the stream is on GPU %d", c->name, q->device, gpu);
  if (q->bound && q->bound != stream) wait_stream(c, q->last, -1);
  q->bound = stream;
  return 0;
}

int rt_comm_nccl_wait(RtComm *c, char *err, size_t errlen) {
  if (c->ops != &nccl_ops) return ts_errf(err, errlen, "group %s is not a NCCL group", c->name);
  wait_stream(c, NC(c)->last, -1);   /* failures end the job, as every NCCL wait */
  return 0;
}

static void nccl_isend(RtComm *c, RtCommReq *r) {
  r->queued = 1;
  VEC_PUSH(NC(c)->queued, r);
}

static int nccl_req_done(RtCommReq *r) { return r->done; }

static void nccl_flush(RtComm *c) {
  RtNccl *q = NC(c);
  if (!q || !q->queued.n) return;
  const char *hint = "NCCL_DEBUG=INFO shows why; are the buffers device memory of this rank's GPU?";
  q->last = RT_COLL_SEND;
  NC_FATAL(c, RT_COLL_SEND, LN.GroupStart(), hint);
  for (int i = 0; i < q->queued.n; i++) {
    RtCommReq *r = q->queued.a[i];
    int t = nc_type(r->dt);
    NC_FATAL(c, RT_COLL_SEND, LN.Send(r->buf, r->count, t, r->peer, q->comm, nstream(c)), hint);
  }
  NC_FATAL(c, RT_COLL_SEND, LN.GroupEnd(), hint);
  if (!q->bound) wait_stream(c, RT_COLL_SEND, q->queued.a[0]->peer);   /* bound: done in stream order */
  for (int i = 0; i < q->queued.n; i++) q->queued.a[i]->queued = 0, q->queued.a[i]->done = 1;
  q->queued.n = 0;
}

/* A split of a NCCL group: NCCL over the split MPI group, on the same GPU. */
static RtComm *nccl_derive(RtComm *parent, RtComm *mpi_sub, char *err, size_t errlen) {
  return rt_comm_init_nccl(mpi_sub, NC(parent)->device, err, errlen);
}

static const RtCommOps nccl_ops = {
  .name = "nccl", .coll = nccl_coll, .all_to_all_v = nccl_all_to_all_v, .isend = nccl_isend,
  .req_done = nccl_req_done, .flush = nccl_flush, .derive = nccl_derive, .free_impl = nccl_free,
  .device_buffers = 1,
};
