/* fake_nccl.c - a fake NCCL (libnccl.so.2) for test_cuda_dev_nccl: the
 * calls of runtime/comm/comm_nccl.c, carried out at once over MPI (buffers are
 * host memory: the fake CUDA driver's device memory is).  Any group of
 * ranks: ncclGetUniqueId makes an id no other call has, and the members
 * calling ncclCommInitRank with it meet in a file named by it (each writes
 * its world rank at its group rank), then make an MPI communicator of
 * exactly them (MPI_Comm_create_group: collective over the members only,
 * as NCCL's init is).  Sends are MPI_Isend: small ones complete before
 * their receive is posted (MPI buffers them), which NCCL's rendezvous
 * protocol for large messages does not promise.  Synchronous sends
 * (MPI_Issend) would model it, but this fake runs a stream's NCCL work on
 * the host thread that drains the stream, so a send blocked there also
 * blocks that rank's other stream, which a GPU does not: the interleaved
 * pipeline (fake_gpu_vpp2_f32) then hangs for the fake's sake.  Data
 * types: int32, float32, float64; float16 and bfloat16 moved (sends,
 * receives, all-gathers), not summed.
 * Between ncclGroupStart and ncclGroupEnd, sends and receives are
 * collected and then posted together (nonblocking, then waited), as NCCL
 * progresses a group's operations together; a call outside a group is a
 * group of one.  Every operation records the stream it was given, so a
 * test can check which stream the communication layer used.  With
 * FAKE_NCCL_STREAM_ORDER=1 the collectives and the groups of sends and
 * receives run in stream order instead, through the fake driver's
 * cuLaunchHostFunc
 * (dlopen of TS_CUDA_DRIVER, the instance the device layer uses): a
 * collective issued before the kernels that produce its operand are done
 * then reads what is really there, and one issued inside a graph capture
 * is replayed with it, as NCCL's are.  Our reading of NCCL's
 * documentation, not NCCL's behaviour. */
#include <dlfcn.h>
#include <fcntl.h>
#include <mpi.h>
#include <time.h>
#include <unistd.h>
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

/* ncclInt32 = 2, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8,
 * ncclBfloat16 = 9.  The 16-bit types are moved as their bit patterns
 * (sends, receives, all-gathers); the fake does not sum them. */
static int dt16(int dt) { return dt == 6 || dt == 9; }
static MPI_Datatype mpi_dt(int dt) {
  return dt == 8 ? MPI_DOUBLE : dt == 2 ? MPI_INT : dt16(dt) ? MPI_UINT16_T : MPI_FLOAT;
}
static int dt_ok(int dt) { return dt == 2 || dt == 7 || dt == 8 || dt16(dt); }

EXPORT const char *ncclGetErrorString(int r) { return r == OK ? "no error" : "fake NCCL error"; }

static long ids_made;

static void rendezvous_path(const Id *id, char *path, size_t n) {
  const char *tmp = getenv("TMPDIR");
  snprintf(path, n, "%s/%s", tmp && *tmp ? tmp : "/tmp", id->internal);
}

/* The id names the rendezvous file; made here, empty, before any member
 * can know the id (a file a killed run left under a reused pid is gone). */
EXPORT int ncclGetUniqueId(Id *id) {
  memset(id, 0, sizeof *id);
  int wr;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(id->internal, sizeof id->internal, "fake-nccl-%d-%d-%ld-%lld%09ld", (int)getpid(), wr, ++ids_made,
           (long long)ts.tv_sec, ts.tv_nsec);
  char path[512];
  rendezvous_path(id, path, sizeof path);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return INTERNAL;
  close(fd);
  return OK;
}

EXPORT int ncclCommInitRank(Comm **out, int nranks, Id id, int rank) {
  if (strncmp(id.internal, "fake-nccl-", 10) || memchr(id.internal, 0, sizeof id.internal) == NULL ||
      strchr(id.internal, '/'))
    return INVALID_USAGE;
  int wr, ws;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  if (nranks < 1 || nranks > ws || rank < 0 || rank >= nranks) return INVALID_ARGUMENT;
  /* the members meet in a file: slot r holds group rank r's world rank + 1 */
  char path[512];
  rendezvous_path(&id, path, sizeof path);
  int fd = open(path, O_RDWR | O_CREAT, 0600);
  if (fd < 0) return INTERNAL;
  int me = wr + 1, *slot = calloc((size_t)nranks, sizeof *slot), got = 0;
  if (!slot || pwrite(fd, &me, sizeof me, (off_t)rank * (off_t)sizeof me) != (ssize_t)sizeof me) {
    close(fd);
    free(slot);
    return INTERNAL;
  }
  for (int waited_ms = 0; waited_ms < 60000; waited_ms++) {
    got = 0;
    if (pread(fd, slot, (size_t)nranks * sizeof *slot, 0) == (ssize_t)((size_t)nranks * sizeof *slot))
      for (int r = 0; r < nranks; r++) got += slot[r] > 0;
    if (got == nranks) break;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  close(fd);
  if (got != nranks) { free(slot); return INTERNAL; }
  for (int r = 0; r < nranks; r++) slot[r]--;   /* world ranks, in group-rank order */
  MPI_Group world, g;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, nranks, slot, &g);
  unsigned tag = 0;
  for (const char *s = id.internal; *s; s++) tag = tag * 31 + (unsigned char)*s;
  Comm *c = calloc(1, sizeof *c);
  int rc = c ? MPI_Comm_create_group(MPI_COMM_WORLD, g, (int)(tag % 30000), &c->comm) : MPI_ERR_OTHER;
  MPI_Group_free(&g);
  MPI_Group_free(&world);
  free(slot);
  if (rc != MPI_SUCCESS) { free(c); return INTERNAL; }
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  MPI_Barrier(c->comm);   /* every member has read the file */
  if (c->rank == 0) unlink(path);
  if (c->rank != rank || c->size != nranks) { MPI_Comm_free(&c->comm); free(c); return INTERNAL; }
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
static void *p2p_stream;  /* the stream of the last of them */

/* Posts the sends and receives p[0 .. n) on c together and waits. */
static int p2p_run(const P2p *p, int n, Comm *c) {
  MPI_Request *r = calloc((size_t)n, sizeof *r);
  for (int i = 0; i < n; i++) {
    if (p[i].send) MPI_Isend(p[i].buf, (int)p[i].count, mpi_dt(p[i].dt), p[i].peer, 77, c->comm, &r[i]);
    else MPI_Irecv(p[i].buf, (int)p[i].count, mpi_dt(p[i].dt), p[i].peer, 77, c->comm, &r[i]);
  }
  int rc = MPI_Waitall(n, r, MPI_STATUSES_IGNORE);
  free(r);
  return rc == MPI_SUCCESS ? 0 : -1;
}

static int p2p_in_order(const P2p *p, int n, Comm *c, void *stream);   /* below: with the collectives */

static int flush(void) {
  if (!npend) return OK;
  const char *e = getenv("FAKE_NCCL_STREAM_ORDER");
  int rc = e && *e == '1' ? p2p_in_order(pend, npend, the_comm, p2p_stream) : p2p_run(pend, npend, the_comm) ? INTERNAL : OK;
  npend = 0;
  return rc;
}

static int p2p(int send, const void *buf, size_t count, int dt, int peer, Comm *c, void *stream) {
  if (!c || !dt_ok(dt) || peer < 0 || peer >= c->size || (count && !buf)) return INVALID_ARGUMENT;
  if (the_comm && the_comm != c && npend) return INVALID_USAGE;
  last_stream = p2p_stream = stream;
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

/* ---- collectives, at once or in stream order ---- */
enum { C_ALL_REDUCE, C_ALL_REDUCE_MAX, C_ALL_GATHER, C_REDUCE_SCATTER, C_P2P };
/* C_P2P: the group's sends and receives, p2p[0 .. n) (owned) */
typedef struct { int kind; const void *s; void *r; size_t n; int dt; Comm *c; P2p *p2p; } Coll;

static int coll_run(const Coll *k) {
  MPI_Datatype t = mpi_dt(k->dt);
  switch (k->kind) {
  case C_P2P: return p2p_run(k->p2p, (int)k->n, k->c) ? MPI_ERR_OTHER : MPI_SUCCESS;
  case C_ALL_REDUCE: case C_ALL_REDUCE_MAX:
    return MPI_Allreduce(k->s == k->r ? MPI_IN_PLACE : k->s, k->r, (int)k->n, t,
                         k->kind == C_ALL_REDUCE ? MPI_SUM : MPI_MAX, k->c->comm);
  case C_ALL_GATHER: return MPI_Allgather(k->s, (int)k->n, t, k->r, (int)k->n, t, k->c->comm);
  default: return MPI_Reduce_scatter_block(k->s, k->r, (int)k->n, t, MPI_SUM, k->c->comm);
  }
}

static struct {
  int tried;
  int (*host_fn)(void *stream, void (*fn)(void *), void *user);
  int (*is_capturing)(void *stream, int *status);
} drv;

static void coll_host(void *u) {
  Coll *k = u;
  if (coll_run(k) != MPI_SUCCESS) { fprintf(stderr, "fake NCCL: an MPI collective failed\n"); abort(); }
}

static void coll_host_once(void *u) {
  coll_host(u);
  free(((Coll *)u)->p2p);
  free(u);
}

/* A captured collective's arguments live until the process ends, as the
 * graph may replay them until then. */
static Coll **kept;
static int nkept;

static int coll(Coll k, void *stream) {
  const char *e = getenv("FAKE_NCCL_STREAM_ORDER");
  if (!(e && *e == '1')) return coll_run(&k) ? INTERNAL : OK;
  if (!drv.tried) {
    drv.tried = 1;
    const char *p = getenv("TS_CUDA_DRIVER");
    void *h = dlopen(p && *p ? p : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) {
      *(void **)&drv.host_fn = dlsym(h, "cuLaunchHostFunc");
      *(void **)&drv.is_capturing = dlsym(h, "cuStreamIsCapturing");
    }
  }
  if (!drv.host_fn || !drv.is_capturing) return INTERNAL;
  Coll *u = malloc(sizeof *u);
  if (!u) return INTERNAL;
  *u = k;
  int status = 0;
  if (drv.is_capturing(stream, &status) != 0) { free(u); return INTERNAL; }
  if (status) {
    Coll **q = realloc(kept, (size_t)(nkept + 1) * sizeof *q);
    if (!q) { free(u); return INTERNAL; }
    kept = q;
    kept[nkept++] = u;
  }
  /* run once (not captured): the fake driver calls it and we free it there */
  if (drv.host_fn(stream, status ? coll_host : coll_host_once, u) != 0) return INTERNAL;
  return OK;
}

static int p2p_in_order(const P2p *p, int n, Comm *c, void *stream) {
  P2p *copy = malloc((size_t)n * sizeof *copy);
  if (!copy) return INTERNAL;
  memcpy(copy, p, (size_t)n * sizeof *copy);
  return coll((Coll){C_P2P, NULL, NULL, (size_t)n, 7, c, copy}, stream);
}

EXPORT int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, Comm *c, void *stream) {
  int e = coll_check(c, dt, stream);
  if (e || (op != 0 && op != 2) || dt16(dt)) return e ? e : INVALID_ARGUMENT;   /* ncclSum, ncclMax */
  return coll((Coll){op == 0 ? C_ALL_REDUCE : C_ALL_REDUCE_MAX, s, r, n, dt, c, NULL}, stream);
}
EXPORT int ncclAllGather(const void *s, void *r, size_t n, int dt, Comm *c, void *stream) {
  int e = coll_check(c, dt, stream);
  if (e) return e;
  return coll((Coll){C_ALL_GATHER, s, r, n, dt, c, NULL}, stream);
}
EXPORT int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, Comm *c, void *stream) {
  int e = coll_check(c, dt, stream);
  if (e || op != 0 || dt16(dt)) return e ? e : INVALID_ARGUMENT;
  return coll((Coll){C_REDUCE_SCATTER, s, r, n, dt, c, NULL}, stream);
}

/* for the test */
EXPORT void *fake_nccl_last_stream(void) { return last_stream; }
EXPORT long fake_nccl_ops(void) { return ops; }

__attribute__((destructor)) static void fake_nccl_fini(void) {
  free(pend);
  for (int i = 0; i < nkept; i++) {
    free(kept[i]->p2p);
    free(kept[i]);
  }
  free(kept);
}
