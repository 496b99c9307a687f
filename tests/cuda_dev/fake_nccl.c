/* fake_nccl.c - a fake NCCL (libnccl.so.2) for test_cuda_dev_nccl: the
 * calls of runtime/comm_nccl.c, carried out at once over MPI (buffers are
 * host memory: the fake CUDA driver's device memory is).  Only the world
 * group: ncclCommInitRank must be called by every MPI rank with its world
 * rank.  Between ncclGroupStart and ncclGroupEnd, sends and receives are
 * collected and then posted together (nonblocking, then waited), as NCCL
 * progresses a group's operations together; a call outside a group is a
 * group of one.  Every operation records the stream it was given, so a
 * test can check which stream the communication layer used.  Our reading
 * of NCCL's documentation, not NCCL's behaviour. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct { char internal[128]; } Id;
typedef struct { MPI_Comm comm; int rank, size; } Comm;
typedef struct { int send; void *buf; size_t count; int dt, peer; } P2p;

enum { OK = 0, INTERNAL = 3, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };

static int depth;
static P2p *pend;
static int npend, cappend;
static void *last_stream;
static long ops;

static MPI_Datatype mpi_dt(int dt) { return dt == 8 ? MPI_DOUBLE : MPI_FLOAT; }
static int dt_ok(int dt) { return dt == 7 || dt == 8; }

EXPORT const char *ncclGetErrorString(int r) { return r == OK ? "no error" : "fake NCCL error"; }

EXPORT int ncclGetUniqueId(Id *id) {
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-nccl");
  return OK;
}

EXPORT int ncclCommInitRank(Comm **out, int nranks, Id id, int rank) {
  int wr, ws;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  if (strcmp(id.internal, "fake-nccl") || nranks != ws || rank != wr) return INVALID_USAGE;   /* world only */
  Comm *c = calloc(1, sizeof *c);
  if (!c || MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) { free(c); return INTERNAL; }
  c->rank = rank;
  c->size = nranks;
  *out = c;
  return OK;
}

EXPORT int ncclCommDestroy(Comm *c) {
  if (!c) return INVALID_ARGUMENT;
  MPI_Comm_free(&c->comm);
  free(c);
  return OK;
}
EXPORT int ncclCommAbort(Comm *c) { return ncclCommDestroy(c); }
EXPORT int ncclCommGetAsyncError(Comm *c, int *r) {
  *r = OK;
  return OK;
}

static Comm *the_comm;   /* of the pending sends / receives */

static int flush(void) {
  if (!npend) return OK;
  MPI_Request *r = calloc((size_t)npend, sizeof *r);
  for (int i = 0; i < npend; i++) {
    P2p *p = &pend[i];
    if (p->send) MPI_Isend(p->buf, (int)p->count, mpi_dt(p->dt), p->peer, 77, the_comm->comm, &r[i]);
    else MPI_Irecv(p->buf, (int)p->count, mpi_dt(p->dt), p->peer, 77, the_comm->comm, &r[i]);
  }
  int rc = MPI_Waitall(npend, r, MPI_STATUSES_IGNORE);
  free(r);
  npend = 0;
  return rc == MPI_SUCCESS ? OK : INTERNAL;
}

static int p2p(int send, const void *buf, size_t count, int dt, int peer, Comm *c, void *stream) {
  if (!c || !dt_ok(dt) || peer < 0 || peer >= c->size || (count && !buf)) return INVALID_ARGUMENT;
  if (the_comm && the_comm != c && npend) return INVALID_USAGE;
  last_stream = stream;
  ops++;
  the_comm = c;
  if (npend == cappend) {
    cappend = cappend ? 2 * cappend : 16;
    pend = realloc(pend, (size_t)cappend * sizeof *pend);
  }
  pend[npend++] = (P2p){send, (void *)buf, count, dt, peer};
  return depth ? OK : flush();
}

EXPORT int ncclSend(const void *buf, size_t count, int dt, int peer, Comm *c, void *stream) {
  return p2p(1, buf, count, dt, peer, c, stream);
}
EXPORT int ncclRecv(void *buf, size_t count, int dt, int peer, Comm *c, void *stream) {
  return p2p(0, buf, count, dt, peer, c, stream);
}
EXPORT int ncclGroupStart(void) {
  depth++;
  return OK;
}
EXPORT int ncclGroupEnd(void) {
  if (depth <= 0) return INVALID_USAGE;
  return --depth ? OK : flush();
}

static int coll_check(Comm *c, int dt, void *stream) {
  if (!c || !dt_ok(dt)) return INVALID_ARGUMENT;
  if (depth) return INVALID_USAGE;   /* the fake does not mix collectives into groups */
  last_stream = stream;
  ops++;
  return OK;
}

EXPORT int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, Comm *c, void *stream) {
  int e = coll_check(c, dt, stream);
  if (e || op != 0) return e ? e : INVALID_ARGUMENT;
  return MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, (int)n, mpi_dt(dt), MPI_SUM, c->comm) ? INTERNAL : OK;
}
EXPORT int ncclAllGather(const void *s, void *r, size_t n, int dt, Comm *c, void *stream) {
  int e = coll_check(c, dt, stream);
  if (e) return e;
  return MPI_Allgather(s, (int)n, mpi_dt(dt), r, (int)n, mpi_dt(dt), c->comm) ? INTERNAL : OK;
}
EXPORT int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, Comm *c, void *stream) {
  int e = coll_check(c, dt, stream);
  if (e || op != 0) return e ? e : INVALID_ARGUMENT;
  return MPI_Reduce_scatter_block(s, r, (int)n, mpi_dt(dt), MPI_SUM, c->comm) ? INTERNAL : OK;
}

/* for the test */
EXPORT void *fake_nccl_last_stream(void) { return last_stream; }
EXPORT long fake_nccl_ops(void) { return ops; }

__attribute__((destructor)) static void fake_nccl_fini(void) { free(pend); }
