/* comm_nccl.c - the communication layer over NCCL (GPU ranks), bootstrapped
 * through MPI: rank 0 makes the NCCL unique id, MPI broadcasts it, every
 * rank calls ncclCommInitRank.  See comm.h for the contract.
 *
 * libcudart and libnccl.so.2 are loaded with dlopen on first use and never
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
 * A group bound to a device (rt_comm_nccl_bind) instead enqueues on the
 * device's comm stream (RtDevOps.stream_handle(dev, RT_STREAM_COMM)) and
 * returns at once: the executor orders collectives against compute with
 * the device's events (record on compute, wait on comm, and back), so
 * communication overlaps computation, and a CUDA Graph capture can take
 * collectives in (NCCL supports capture; polling a capturing stream is not
 * allowed, hence no waiting here).  rt_comm_nccl_wait waits for the comm
 * stream with the deadline and the diagnostics of the default mode. */
#define RT_COMM_INTERNAL
#include "runtime/comm.h"
#include "runtime/device.h"
#include <dlfcn.h>
#include <time.h>

/* Declared here until comm.h has them (see the H5 report): */
int rt_comm_nccl_bind(RtComm *c, RtDev *dev, char *err, size_t errlen);
int rt_comm_nccl_wait(RtComm *c, char *err, size_t errlen);
int rt_nccl_all_to_all_v(RtComm *c, IrDtype dt, const void *send, const int *scount, const int *sdispl, void *recv,
                         const int *rcount, const int *rdispl, char *err, size_t errlen);

/* ---- the ABI we use ---- */
typedef int ncResult;                /* ncclResult_t: 0 = ncclSuccess, 7 = ncclInProgress */
typedef int cuError;                 /* cudaError_t: 0 = cudaSuccess, 600 = cudaErrorNotReady */
typedef struct ncOpaque *ncComm;     /* ncclComm_t */
typedef struct cuStreamOpaque *cuStream;
typedef struct { char internal[128]; } ncUniqueId;
enum { NC_SUCCESS = 0, NC_IN_PROGRESS = 7, NC_SUM = 0, NC_MAX = 2, NC_FLOAT32 = 7, NC_FLOAT64 = 8, CU_NOT_READY = 600 };

#ifdef TS_HAVE_NCCL_H
#include <nccl.h>
_Static_assert(sizeof(ncUniqueId) == sizeof(ncclUniqueId), "ncclUniqueId size");
_Static_assert(NC_SUM == (int)ncclSum && NC_MAX == (int)ncclMax && NC_FLOAT32 == (int)ncclFloat32 && NC_FLOAT64 == (int)ncclFloat64 &&
               NC_SUCCESS == (int)ncclSuccess && NC_IN_PROGRESS == (int)ncclInProgress, "NCCL enums");
_Static_assert(CU_NOT_READY == (int)cudaErrorNotReady, "cudaErrorNotReady");
#endif

static struct {
  int tried;
  char why[256];                     /* why loading failed ("" = loaded) */
  cuError (*GetDeviceCount)(int *);
  cuError (*SetDevice)(int);
  cuError (*StreamCreate)(cuStream *);
  cuError (*StreamDestroy)(cuStream);
  cuError (*StreamQuery)(cuStream);
  const char *(*GetErrorString)(cuError);
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
} L;

static void *open_first(const char *const *names) {
  for (int i = 0; names[i]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
  }
  return NULL;
}

/* Loads both libraries once per process (handles stay open: the symbols
 * are used until exit).  0 on success, else L.why says what is missing. */
static int load_libs(void) {
  if (L.tried) return L.why[0] ? -1 : 0;
  L.tried = 1;
  static const char *const cudart[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", NULL};
  static const char *const nccl[] = {"libnccl.so.2", "libnccl.so", NULL};
  void *hc = open_first(cudart);
  if (!hc) { snprintf(L.why, sizeof L.why, "cannot load the CUDA runtime (libcudart.so): %s", dlerror()); return -1; }
  void *hn = open_first(nccl);
  if (!hn) { snprintf(L.why, sizeof L.why, "cannot load NCCL (libnccl.so.2): %s (hint: LD_LIBRARY_PATH)", dlerror()); return -1; }
  const char *miss = NULL;
#define SYM(h, field, name) do { *(void **)&L.field = dlsym(h, name); if (!L.field && !miss) miss = name; } while (0)
  SYM(hc, GetDeviceCount, "cudaGetDeviceCount"); SYM(hc, SetDevice, "cudaSetDevice");
  SYM(hc, StreamCreate, "cudaStreamCreate"); SYM(hc, StreamDestroy, "cudaStreamDestroy");
  SYM(hc, StreamQuery, "cudaStreamQuery"); SYM(hc, GetErrorString, "cudaGetErrorString");
  SYM(hn, GetUniqueId, "ncclGetUniqueId"); SYM(hn, CommInitRank, "ncclCommInitRank");
  SYM(hn, CommDestroy, "ncclCommDestroy"); SYM(hn, CommAbort, "ncclCommAbort");
  SYM(hn, CommGetAsyncError, "ncclCommGetAsyncError"); SYM(hn, ncGetErrorString, "ncclGetErrorString");
  SYM(hn, AllReduce, "ncclAllReduce"); SYM(hn, AllGather, "ncclAllGather");
  SYM(hn, ReduceScatter, "ncclReduceScatter"); SYM(hn, Send, "ncclSend"); SYM(hn, Recv, "ncclRecv");
  SYM(hn, GroupStart, "ncclGroupStart"); SYM(hn, GroupEnd, "ncclGroupEnd");
#undef SYM
  if (miss) { snprintf(L.why, sizeof L.why, "%s not found (CUDA runtime or NCCL too old?)", miss); return -1; }
  return 0;
}

struct RtNccl {
  ncComm comm;
  cuStream stream;           /* the group's own (default mode) */
  cuStream bound;            /* a device's comm stream (rt_comm_nccl_bind), not owned; NULL: none */
  RtCollKind last;           /* the last operation enqueued, for rt_comm_nccl_wait's messages */
  int device;
  VEC(RtCommReq *) queued;   /* sends of rt_comm_isend not posted yet */
};

/* Where c's operations go. */
static cuStream nstream(const RtComm *c) { return c->nccl->bound ? c->nccl->bound : c->nccl->stream; }
int rt_nccl_device(const RtNccl *n) { return n->device; }

static const char *cu_str(cuError e) { return L.GetErrorString ? L.GetErrorString(e) : "?"; }
static const char *nc_str(ncResult r) { return L.ncGetErrorString ? L.ncGetErrorString(r) : "?"; }

/* Setup checks: message into err, jump to fail.  Communication checks
 * (inside rt_nccl_run): print and end the job. */
#define CU_TRY(call, hint) do { cuError e_ = (call); if (e_ != 0) { \
    ts_errf(err, errlen, "%s failed: %s (hint: %s)", #call, cu_str(e_), hint); goto fail; } } while (0)
#define NC_TRY(call, hint) do { ncResult r_ = (call); if (r_ != NC_SUCCESS) { \
    ts_errf(err, errlen, "%s failed: %s (hint: %s)", #call, nc_str(r_), hint); goto fail; } } while (0)
#define NC_FATAL(c, k, call, hint) do { ncResult r_ = (call); if (r_ != NC_SUCCESS) { \
    if ((c)->nccl->comm) L.CommAbort((c)->nccl->comm); \
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
  char why[300] = "";
  int ndev = 0;
  if (mpi->nccl) { ts_errf(err, errlen, "rt_comm_init_nccl: group %s is already a NCCL group", mpi->name); return NULL; }
  if (load_libs() < 0) snprintf(why, sizeof why, "%s", L.why);
  else {
    cuError e = L.GetDeviceCount(&ndev);
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
  c->nccl = ts_xcalloc(1, sizeof *c->nccl);
  int ok = 1;
  /* Each setup step that can fail on one rank only is followed by an
   * agreement, so that all ranks leave together instead of one waiting in
   * the next collective. */
  c->nccl->device = device >= 0 ? device : local_rank(mpi) % ndev;
  cuError se = L.SetDevice(c->nccl->device);
  if (se != 0) {
    ts_errf(err, errlen, "cudaSetDevice failed: %s (hint: is the device visible? CUDA_VISIBLE_DEVICES)", cu_str(se));
    ok = 0;
  }
  agree_min(c, &ok);
  if (!ok) { if (!se) ts_errf(err, errlen, "cudaSetDevice failed on another rank of group %s", c->name); rt_comm_free(c); return NULL; }
  struct { int ok; ncUniqueId id; } boot;
  memset(&boot, 0, sizeof boot);
  boot.ok = 1;
  if (c->rank == 0 && L.GetUniqueId(&boot.id) != NC_SUCCESS) boot.ok = 0;
  MPI_Request r;
  if (MPI_Ibcast(&boot, (int)sizeof boot, MPI_BYTE, 0, c->comm, &r) != MPI_SUCCESS)
    rt_comm_abort(c, "MPI_Ibcast of the NCCL id failed on group %s", c->name);
  rt_comm_wait_mpi(c, &r, RT_COLL_ALL_REDUCE, -1);
  if (!boot.ok) { ts_errf(err, errlen, "ncclGetUniqueId failed on rank 0 of group %s (hint: NCCL_DEBUG=INFO)", c->name); goto fail; }
  NC_TRY(L.CommInitRank(&c->nccl->comm, c->size, boot.id, c->rank), "NCCL_DEBUG=INFO shows why; are the ranks' GPUs visible to each other?");
  CU_TRY(L.StreamCreate(&c->nccl->stream), "out of GPU memory?");
  agree_min(c, &ok);
  return c;
fail:
  ok = 0;
  agree_min(c, &ok);   /* the others must not keep a half-made group either */
  rt_comm_free(c);
  return NULL;
}

void rt_nccl_free(RtNccl *n) {
  free(n->queued.a);
  if (n->stream) L.StreamDestroy(n->stream);
  if (n->comm) L.CommDestroy(n->comm);
  free(n);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for the group's stream, checking NCCL's async error, until the
 * deadline; then aborts the NCCL communicator and the job.  peer: the group
 * rank of a send/recv partner, or -1 for a collective. */
static void wait_stream(RtComm *c, RtCollKind k, int peer) {
  double end = now_s() + c->timeout;
  for (;;) {
    cuError e = L.StreamQuery(nstream(c));
    if (e == 0) return;
    if (e != CU_NOT_READY) {
      L.CommAbort(c->nccl->comm);
      rt_comm_abort(c, "%s on group %s failed: %s (hint: a kernel before it failed, or a rank died)", rt_coll_name(k), c->name, cu_str(e));
    }
    ncResult ae = NC_SUCCESS;
    if (L.CommGetAsyncError(c->nccl->comm, &ae) == NC_SUCCESS && ae != NC_SUCCESS && ae != NC_IN_PROGRESS) {
      L.CommAbort(c->nccl->comm);
      rt_comm_abort(c, "%s on group %s failed: %s (hint: NCCL_DEBUG=INFO; a rank died?)", rt_coll_name(k), c->name, nc_str(ae));
    }
    if (now_s() > end) {
      char who[512];
      L.CommAbort(c->nccl->comm);
      if (peer >= 0) snprintf(who, sizeof who, "waiting for rank %d?", c->world_ranks[peer]);
      else rt_comm_diagnose(c, k, who, sizeof who);   /* the peers time out too and answer over MPI */
      rt_comm_abort(c, "collective %s on group %s timed out after %g s (%s)", rt_coll_name(k), c->name, c->timeout, who);
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

int rt_nccl_run(RtComm *c, RtCollKind k, IrDtype dt, const void *send, void *recv, size_t count,
                int peer, char *err, size_t errlen) {
  int t = dt == IR_F64 ? NC_FLOAT64 : NC_FLOAT32;
  size_t es = ir_dtype_size(dt);
  ncComm nc = c->nccl->comm;
  cuStream s = nstream(c);
  const char *hint = "NCCL_DEBUG=INFO shows why; are the buffers device memory of this rank's GPU?";
  if (k != RT_COLL_SEND && k != RT_COLL_RECV) c->seq++;
  c->nccl->last = k;
  switch (k) {
  case RT_COLL_ALL_REDUCE: NC_FATAL(c, k, L.AllReduce(send, recv, count, t, NC_SUM, nc, s), hint); break;
  case RT_COLL_ALL_GATHER: NC_FATAL(c, k, L.AllGather(send, recv, count, t, nc, s), hint); break;
  case RT_COLL_REDUCE_SCATTER: NC_FATAL(c, k, L.ReduceScatter(send, recv, count, t, NC_SUM, nc, s), hint); break;
  case RT_COLL_SEND: NC_FATAL(c, k, L.Send(send, count, t, peer, nc, s), hint); break;
  case RT_COLL_RECV: {
    /* the queued sends go in the same NCCL group as the receive (comm.h) */
    RtNccl *q = c->nccl;
    NC_FATAL(c, k, L.GroupStart(), hint);
    for (int i = 0; i < q->queued.n; i++) {
      RtCommReq *r = q->queued.a[i];
      int rt = r->dt == IR_F64 ? NC_FLOAT64 : NC_FLOAT32;
      NC_FATAL(c, RT_COLL_SEND, L.Send(r->buf, r->count, rt, r->peer, nc, s), hint);
    }
    NC_FATAL(c, k, L.Recv(recv, count, t, peer, nc, s), hint);
    NC_FATAL(c, k, L.GroupEnd(), hint);
    if (!q->bound) wait_stream(c, k, peer);   /* bound: done in stream order */
    for (int i = 0; i < q->queued.n; i++) q->queued.a[i]->queued = 0, q->queued.a[i]->done = 1;
    q->queued.n = 0;
    return 0;
  }
  case RT_COLL_ALL_TO_ALL:
    /* block j of send goes to rank j, block j of recv comes from rank j;
     * one NCCL group so the sends and receives progress together. */
    NC_FATAL(c, k, L.GroupStart(), hint);
    for (int j = 0; j < c->size; j++) {
      NC_FATAL(c, k, L.Send((const char *)send + (size_t)j * count * es, count, t, j, nc, s), hint);
      NC_FATAL(c, k, L.Recv((char *)recv + (size_t)j * count * es, count, t, j, nc, s), hint);
    }
    NC_FATAL(c, k, L.GroupEnd(), hint);
    break;
  default:
    return ts_errf(err, errlen, "%s is not a NCCL operation", rt_coll_name(k));
  }
  if (!c->nccl->bound) wait_stream(c, k, k == RT_COLL_SEND || k == RT_COLL_RECV ? peer : -1);
  return 0;
}

/* all_reduce max (in place); NaN-propagation is NCCL's (its max is not
 * specified for NaN). */
int rt_nccl_all_reduce_max(RtComm *c, IrDtype dt, void *buf, size_t count, char *err, size_t errlen) {
  const RtCollKind k = RT_COLL_ALL_REDUCE;
  const char *hint = "NCCL_DEBUG=INFO shows why; are the buffers device memory of this rank's GPU?";
  c->seq++;
  c->nccl->last = k;
  NC_FATAL(c, k, L.AllReduce(buf, buf, count, dt == IR_F64 ? NC_FLOAT64 : NC_FLOAT32, NC_MAX, c->nccl->comm, nstream(c)),
           hint);
  if (!c->nccl->bound) wait_stream(c, k, -1);
  return 0;
}

/* Variable-count all-to-all: one NCCL group of a send and a receive per
 * peer with a nonzero count (counts agree pairwise, so both sides skip the
 * same pairs). */
int rt_nccl_all_to_all_v(RtComm *c, IrDtype dt, const void *send, const int *scount, const int *sdispl, void *recv,
                         const int *rcount, const int *rdispl, char *err, size_t errlen) {
  if (!scount || !sdispl || !rcount || !rdispl)
    return ts_errf(err, errlen, "all_to_all_v on group %s: NULL counts or displacements", c->name);
  for (int j = 0; j < c->size; j++)
    if (scount[j] < 0 || sdispl[j] < 0 || rcount[j] < 0 || rdispl[j] < 0 || (scount[j] && !send) ||
        (rcount[j] && !recv))
      return ts_errf(err, errlen, "all_to_all_v on group %s: peer %d has count %d at %d to send, %d at %d to receive",
                     c->name, j, scount[j], sdispl[j], rcount[j], rdispl[j]);
  int t = dt == IR_F64 ? NC_FLOAT64 : NC_FLOAT32;
  size_t es = ir_dtype_size(dt);
  ncComm nc = c->nccl->comm;
  cuStream s = nstream(c);
  const RtCollKind k = RT_COLL_ALL_TO_ALL;
  const char *hint = "NCCL_DEBUG=INFO shows why; do the counts agree pairwise between the ranks?";
  c->seq++;
  c->nccl->last = k;
  NC_FATAL(c, k, L.GroupStart(), hint);
  for (int j = 0; j < c->size; j++) {
    if (scount[j])
      NC_FATAL(c, k, L.Send((const char *)send + (size_t)sdispl[j] * es, (size_t)scount[j], t, j, nc, s), hint);
    if (rcount[j]) NC_FATAL(c, k, L.Recv((char *)recv + (size_t)rdispl[j] * es, (size_t)rcount[j], t, j, nc, s), hint);
  }
  NC_FATAL(c, k, L.GroupEnd(), hint);
  if (!c->nccl->bound) wait_stream(c, k, -1);
  return 0;
}

int rt_comm_nccl_bind(RtComm *c, RtDev *dev, char *err, size_t errlen) {
  if (!c->nccl) return ts_errf(err, errlen, "group %s is not a NCCL group: only NCCL groups run on a device stream",
                               c->name);
  if (c->nccl->queued.n)
    return ts_errf(err, errlen, "group %s has %d send(s) not posted yet: wait for them before changing its stream",
                   c->name, c->nccl->queued.n);
  if (!dev) {   /* back to the group's own stream, after what is on the device's */
    if (c->nccl->bound) wait_stream(c, c->nccl->last, -1);
    c->nccl->bound = NULL;
    return 0;
  }
  void *s = dev->ops->stream_handle ? dev->ops->stream_handle(dev, RT_STREAM_COMM) : NULL;
  if (!s)
    return ts_errf(err, errlen, "group %s: device %s has no CUDA stream for NCCL (the %s device)", c->name, dev->label,
                   dev->ops->name);
  if (dev->ordinal != c->nccl->device)
    return ts_errf(err, errlen, "group %s runs on GPU %d but the device is GPU %d (%s)", c->name, c->nccl->device,
                   dev->ordinal, dev->label);
  if (c->nccl->bound && c->nccl->bound != s) wait_stream(c, c->nccl->last, -1);
  c->nccl->bound = s;
  return 0;
}

int rt_comm_nccl_wait(RtComm *c, char *err, size_t errlen) {
  if (!c->nccl) return ts_errf(err, errlen, "group %s is not a NCCL group", c->name);
  wait_stream(c, c->nccl->last, -1);   /* failures end the job, as every NCCL wait */
  return 0;
}

void rt_nccl_queue_send(RtComm *c, RtCommReq *r) {
  r->queued = 1;
  VEC_PUSH(c->nccl->queued, r);
}

void rt_nccl_flush(RtComm *c) {
  RtNccl *q = c->nccl;
  if (!q || !q->queued.n) return;
  const char *hint = "NCCL_DEBUG=INFO shows why; are the buffers device memory of this rank's GPU?";
  q->last = RT_COLL_SEND;
  NC_FATAL(c, RT_COLL_SEND, L.GroupStart(), hint);
  for (int i = 0; i < q->queued.n; i++) {
    RtCommReq *r = q->queued.a[i];
    int t = r->dt == IR_F64 ? NC_FLOAT64 : NC_FLOAT32;
    NC_FATAL(c, RT_COLL_SEND, L.Send(r->buf, r->count, t, r->peer, q->comm, nstream(c)), hint);
  }
  NC_FATAL(c, RT_COLL_SEND, L.GroupEnd(), hint);
  if (!q->bound) wait_stream(c, RT_COLL_SEND, q->queued.a[0]->peer);   /* bound: done in stream order */
  for (int i = 0; i < q->queued.n; i++) q->queued.a[i]->queued = 0, q->queued.a[i]->done = 1;
  q->queued.n = 0;
}
