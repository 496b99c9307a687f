/* comm.h - the communication layer between ranks: the one narrow interface
 * the executor calls for collectives, over MPI for CPU ranks (comm_mpi.c)
 * and over NCCL for GPU ranks (comm_nccl.c, bootstrapped through MPI).
 *
 * An RtComm is one group of ranks.  Every group is an MPI communicator (its
 * setup, barrier and diagnostics go over MPI); its collectives run on the
 * backend its table names (RtCommOps, below): MPI for host memory, NCCL
 * for device memory.  The core (comm_mpi.c) dispatches through the table
 * and never names a backend; comm_nccl.c fills the NCCL table.
 *
 * runtime/comm may use: ir/ (dtypes, utilities) and plan/ (the mesh).
 * Nothing else of the runtime: a device reaches NCCL as a raw stream
 * (rt_comm_nccl_bind), and the executor and kernels call only this header.
 *
 * Buffers are contiguous arrays of IR_F32 or IR_F64 (host memory for MPI
 * groups, device memory for NCCL groups).  "count" is always a number of
 * elements, never bytes.  Every collective must be called by every rank of
 * the group, in the same order, with the same dtype and count (the verifier
 * checks this for the plan; here it is the caller's contract).
 *
 * Failure guarantees (what a user can rely on):
 *  - Setup calls (init, split, mesh groups) return NULL / -1 with a message
 *    in err; argument errors of a collective (bad dtype, count too large,
 *    peer out of range) return -1 with a message and communicate nothing.
 *  - A communication failure is fatal for the whole job: every collective
 *    and send/recv is a nonblocking MPI call polled against a deadline (the
 *    group's timeout, default 60 s).  When the MPI library reports an error
 *    (MPI_ERRORS_RETURN is set on every communicator), or the deadline
 *    passes, the rank prints
 *      rank R: collective all_reduce on group tp timed out after 60 s (waiting for rank K?)
 *    on stderr and calls MPI_Abort, which makes mpirun kill every rank.  So
 *    a rank that stalls makes the job stop within timeout + 2 s (grace); a
 *    rank that dies is reported by mpirun at once (OpenMPI kills the job
 *    when a process exits without MPI_Finalize) or, at the latest, by the
 *    peers' deadline.
 *  - "waiting for rank K?" is a best guess: on timeout, each rank tells its
 *    group peers (on a side communicator) which collective it is in and
 *    listens for a short grace period; the peers it does not hear from are
 *    named (world ranks), and peers that are in a different collective are
 *    named as such (a mismatched program).  A peer that has not timed out
 *    yet (it arrived much later) can be named wrongly, hence the '?'.
 *  - Threads: MPI is initialized single-threaded; call every rt_comm_*
 *    function from the thread that called rt_comm_init_mpi.
 *  - Not guaranteed: detecting a wrong count or dtype on one rank (MPI may
 *    then corrupt memory or report a truncation error), progress of a rank
 *    that never calls into MPI again, or a clean MPI_Finalize after an error.
 */
#ifndef RT_COMM_H
#define RT_COMM_H
#include <stddef.h>
#include "ir/ir.h"
#include "plan/plan.h"

typedef struct RtComm RtComm;

#define RT_COMM_DEFAULT_TIMEOUT 60.0   /* seconds */

/* The mesh axes, in Megatron's order dp-pp-cp-ep-tp (outer to inner: ranks
 * that differ only in tp are adjacent, so tp groups stay inside a node). */
typedef enum { RT_AXIS_DP, RT_AXIS_PP, RT_AXIS_CP, RT_AXIS_EP, RT_AXIS_TP, RT_AXIS_COUNT } RtMeshAxis;
const char *rt_mesh_axis_name(RtMeshAxis a);            /* "dp" ... "tp" */

/* ---- pure mesh arithmetic (no MPI; testable anywhere) ----
 * rank = ((((dp*PP + pp)*CP + cp)*EP + ep)*TP + tp).  Axis sizes < 1 count
 * as 1.  rt_mesh_size: product of the axes. */
int  rt_mesh_size(const PlanMesh *m);
/* coord[RT_AXIS_COUNT] of rank; -1 if rank is outside the mesh. */
int  rt_mesh_coords(const PlanMesh *m, int rank, int coord[RT_AXIS_COUNT]);
int  rt_mesh_rank(const PlanMesh *m, const int coord[RT_AXIS_COUNT]);
/* The ranks of rank's group along axis a, ordered by their coordinate on
 * that axis; ranks_out needs room for the axis size.  Returns the group
 * size, or -1 if rank is outside the mesh. */
int  rt_mesh_group_ranks(const PlanMesh *m, int rank, RtMeshAxis a, int *ranks_out);

/* ---- groups ----
 * rt_comm_init_mpi: MPI_Init (unless already initialized; argc/argv may be
 * NULL), then the group of all ranks, named "world".  timeout_s <= 0 means
 * the environment variable TS_COMM_TIMEOUT if set, else 60 s.  Groups made
 * from it inherit its timeout.  Free every other group before the world
 * group: freeing the world group calls MPI_Finalize if init called MPI_Init. */
RtComm *rt_comm_init_mpi(int *argc, char ***argv, double timeout_s, char *err, size_t errlen);
void rt_comm_free(RtComm *c);                 /* NULL is fine */
int  rt_comm_rank(const RtComm *c);           /* rank within the group */
int  rt_comm_size(const RtComm *c);
int  rt_comm_world_rank(const RtComm *c);     /* this process in MPI_COMM_WORLD */
const char *rt_comm_name(const RtComm *c);
double rt_comm_timeout(const RtComm *c);
void rt_comm_set_timeout(RtComm *c, double seconds);
/* Collective over c: ranks with the same color form a group, ordered by key
 * (ties by rank in c).  name is used in messages ("tp", "dp"...). */
RtComm *rt_comm_split(RtComm *c, int color, int key, const char *name, char *err, size_t errlen);
/* Collective over c (whose size must equal the mesh size, rank i of c being
 * mesh rank i): the group of this rank along axis a, named after the axis. */
RtComm *rt_comm_mesh_group(RtComm *c, const PlanMesh *m, RtMeshAxis a, char *err, size_t errlen);
/* The same for a set of at least two axes (mask of 1u << RtMeshAxis): the
 * ranks that share every coordinate outside the set, group rank k the flat
 * index of the rank's coordinates on the set with the outer axis major
 * (dp+cp: k = dp_coord * cp + cp_coord), the order of the blocks of a
 * dim split over those axes (ir.h, IR_AXES_SET).  Named "dp+cp". */
RtComm *rt_comm_mesh_axes_group(RtComm *c, const PlanMesh *m, unsigned mask, char *err, size_t errlen);
/* Group rank of coord in the set's group (the key above). */
int rt_mesh_axes_index(const PlanMesh *m, unsigned mask, const int coord[RT_AXIS_COUNT]);

/* ---- collectives (dtype IR_F32 or IR_F64; 0 on success, -1 + err on an
 * argument error; communication failures abort the job, see above) ---- */
/* buf[count], in place: element-wise sum over the group. */
int rt_comm_all_reduce(RtComm *c, IrDtype dt, void *buf, size_t count, char *err, size_t errlen);
/* buf[count], in place: element-wise maximum over the group (MPI groups;
 * a NCCL group returns -1 with a message). */
int rt_comm_all_reduce_max(RtComm *c, IrDtype dt, void *buf, size_t count, char *err, size_t errlen);
/* send[count] -> recv[size*count]: rank i's block lands at recv + i*count
 * (concatenation along the leading dim). */
int rt_comm_all_gather(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count,
                       char *err, size_t errlen);
/* send[size*count] -> recv[count]: rank i gets the sum over ranks of block i
 * (sum, then split along the leading dim). */
int rt_comm_reduce_scatter(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count,
                           char *err, size_t errlen);
/* send[size*count] -> recv[size*count]: block j of rank i's send lands as
 * block i of rank j's recv. */
int rt_comm_all_to_all(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count,
                       char *err, size_t errlen);
/* Variable counts (elements): rank i sends scount[j] elements from
 * send + sdispl[j] to rank j, and receives rcount[j] from rank j into
 * recv + rdispl[j].  Counts must agree pairwise (MPI checks). */
int rt_comm_all_to_all_v(RtComm *c, IrDtype dt, const void *send, const int *scount, const int *sdispl, void *recv,
                         const int *rcount, const int *rdispl, char *err, size_t errlen);
/* buf[count] to / from rank peer of the group; tag >= 0 tells apart
 * messages between the same pair. */
int rt_comm_send(RtComm *c, IrDtype dt, const void *buf, size_t count, int peer, int tag,
                 char *err, size_t errlen);
int rt_comm_recv(RtComm *c, IrDtype dt, void *buf, size_t count, int peer, int tag,
                 char *err, size_t errlen);
int rt_comm_barrier(RtComm *c, char *err, size_t errlen);

/* ---- nonblocking sends (pipeline parallelism: docs/pipeline.md) ----
 * rt_comm_isend posts buf[count] to group rank `peer` and returns at once
 * with a request in *req; buf must stay unchanged until the request has
 * completed.  Messages from one rank to another with the same tag are
 * received in the order they were posted (rt_comm_recv matches by tag).
 * Tags go from 0 to the MPI library's MPI_TAG_UB (at least 32767).
 * rt_comm_test never waits: 1 when the request has completed (the handle
 * is then freed and *req set to NULL; NULL counts as completed), 0 while it
 * is in flight.  rt_comm_wait_all waits for every non-NULL reqs[i] against
 * ONE deadline (the longest timeout of their groups, from the call), frees
 * them and sets them to NULL; a peer that never receives ends the job like
 * a stalled collective ("send to rank K on group pp timed out ...").
 * NCCL groups: a send is only queued here and posted together with the
 * group's next receive in one ncclGroupStart/End (or by rt_comm_wait_all),
 * because NCCL operations on one stream run in order: two ranks that each
 * send before they receive would otherwise wait for each other forever. */
typedef struct RtCommReq RtCommReq;
int rt_comm_isend(RtComm *c, IrDtype dt, const void *buf, size_t count, int peer, int tag, RtCommReq **req,
                  char *err, size_t errlen);
int rt_comm_test(RtCommReq **req);
int rt_comm_wait_all(RtCommReq **reqs, int n, char *err, size_t errlen);
/* ---- nonblocking collectives (the data-parallel gradient reduction
 * issued during the last micro batch's backward: docs/sharding.md,
 * "Overlapped gradient reduction") ----
 * rt_comm_iall_reduce posts the sum of buf[count] over the group, in
 * place; rt_comm_ireduce_scatter posts send[size*count] -> recv[count]
 * (as rt_comm_reduce_scatter).  Both return at once with a request in
 * *req; the buffers must stay untouched until it has completed.
 * rt_comm_test polls it (and so drives the MPI library's progress, which
 * moves only inside MPI calls); rt_comm_coll_wait waits for it against
 * the group's deadline (a stalled peer ends the job as a blocking
 * collective does) and frees it.  Every rank of the group posts the same
 * collectives in the same order, interleaved with its blocking ones in
 * the same order.  MPI groups only: a NCCL group returns -1 with a
 * message. */
int rt_comm_iall_reduce(RtComm *c, IrDtype dt, void *buf, size_t count, RtCommReq **req, char *err, size_t errlen);
int rt_comm_ireduce_scatter(RtComm *c, IrDtype dt, const void *send, void *recv, size_t count, RtCommReq **req,
                            char *err, size_t errlen);
int rt_comm_coll_wait(RtCommReq **req, char *err, size_t errlen);
/* Prints "rank R: <message>" on stderr and ends every rank of the job. */
void rt_comm_abort(RtComm *c, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

/* ---- NCCL (GPU ranks) ----
 * Collective over mpi (an MPI group): the same group over NCCL on CUDA
 * device `device` (-1: local rank modulo the device count).  libcudart and
 * libnccl.so.2 are loaded with dlopen here, so binaries start on machines
 * without them.  Returns NULL with a message ("no GPU: ...") on every rank
 * if any rank lacks a usable GPU or the libraries.  The result keeps using
 * mpi for bootstrap, barrier and split: free it before mpi.  Buffers passed
 * to its collectives are device pointers. */
RtComm *rt_comm_init_nccl(RtComm *mpi, int device, char *err, size_t errlen);
int rt_comm_is_nccl(const RtComm *c);
/* A NCCL group on a CUDA device's comm stream (`stream`, a CUstream, on
 * GPU `gpu`): its operations are enqueued there and return at once; order
 * them against compute with the device's events and wait with
 * rt_comm_nccl_wait (deadline and diagnostics as above) or the device's
 * sync.  stream NULL: back to the group's own stream, waited for after
 * every operation.  -1 with a message for an MPI group, another GPU, or
 * sends not yet posted. */
int rt_comm_nccl_bind(RtComm *c, void *stream, int gpu, char *err, size_t errlen);
int rt_comm_nccl_wait(RtComm *c, char *err, size_t errlen);

/* ---- where a rank sits in the device mesh, and its groups ----
 * group[a] is the rank's group along mesh axis a (ordered by the
 * coordinate on a, as rt_comm_mesh_group makes them), NULL when the axis
 * has size 1.  The kernels use coord[] to find a local element's global
 * index (see docs/sharding.md) and group[] for the collectives.
 * dev_group[a]: the same groups for a rank on a CUDA device, NCCL groups
 * bound to the device's comm stream (rt_comm_nccl_bind), which the device
 * executor's collectives use on device memory; group[] keeps serving host
 * memory (losses, parameter files).  NULL on CPU ranks.  Indexed by IrAxis
 * (the IR's mesh axes, the same order as RtMeshAxis). */
typedef struct RtRank {
  PlanMesh mesh;
  int coord[IR_AXIS_COUNT];
  RtComm *group[IR_AXIS_COUNT];
  RtComm *dev_group[IR_AXIS_COUNT];
  /* sets[mask], dev_sets[mask]: the groups over a set of axes
   * (rt_comm_mesh_axes_group), made by rt_rank_axes_groups for the sets
   * the ZeRO optimizer shards over (data-parallel axes: dp with cp and/or
   * ep) whose axes have size > 1; NULL elsewhere.  Reach them with
   * rt_rank_axes_group. */
  RtComm *sets[1u << IR_AXIS_COUNT];
  RtComm *dev_sets[1u << IR_AXIS_COUNT];
} RtRank;
/* The group of a collective's axis attribute v (ir_axes_mask): one axis'
 * group, or the set's; axes of size 1 dropped (a set with one axis of
 * size > 1 left is that axis' group); NULL when every axis has size 1 or
 * the group was not made.  dev: the NCCL groups. */
RtComm *rt_rank_axes_group(const RtRank *r, int64_t v, int dev);
/* Product of the sizes of v's axes. */
int rt_rank_axes_size(const RtRank *r, int64_t v);
/* Makes r->sets (over world, rank i of world being mesh rank i): the sets
 * {dp, cp}, {dp, ep}, {dp, cp, ep} restricted to axes of size > 1, when at
 * least two are left.  Collective over world.  rt_rank_axes_groups_free
 * frees them (and nothing else). */
int rt_rank_axes_groups(RtRank *r, RtComm *world, char *err, size_t errlen);
void rt_rank_axes_groups_free(RtRank *r);
/* The single-rank context: 1x1x1x1x1 mesh, coordinates 0, no groups. */
RtRank rt_rank_single(void);
/* Size of axis a of r's mesh (sizes < 1 count as 1). */
int rt_rank_axis_size(const RtRank *r, IrAxis a);

/* ---- internal to comm_mpi.c and comm_nccl.c (define RT_COMM_INTERNAL
 * before including); callers use only the functions above. ---- */
#ifdef RT_COMM_INTERNAL
#include <mpi.h>
typedef enum { RT_COLL_ALL_REDUCE, RT_COLL_ALL_GATHER, RT_COLL_REDUCE_SCATTER, RT_COLL_ALL_TO_ALL,
               RT_COLL_SEND, RT_COLL_RECV, RT_COLL_BARRIER, RT_COLL_COUNT } RtCollKind;
/* A backend: what runs a group's collectives.  The public functions check
 * their arguments, count the collective (seq) and call these.
 *   coll: one operation of kind k (all_reduce: max != 0 for the maximum,
 *         in place in recv; all_gather / reduce_scatter / all_to_all:
 *         count elements per block; send / recv: peer, tag);
 *   all_to_all_v: the variable-count form;
 *   isend: posts (or queues) r's send; req_done: one poll of r (1 when it
 *         has completed); flush: posts what is queued (NULL: never any);
 *   derive: the same backend over mpi_sub, a split of parent's MPI group
 *         (NULL: the MPI group itself);
 *   free_impl: releases c->impl (NULL: nothing to release);
 *   device_buffers: buffers are device pointers. */
typedef struct RtCommOps {
  const char *name;
  int (*coll)(RtComm *c, RtCollKind k, int max, IrDtype dt, const void *send, void *recv, size_t count, int peer,
              int tag, char *err, size_t errlen);
  int (*all_to_all_v)(RtComm *c, IrDtype dt, const void *send, const int *scount, const int *sdispl, void *recv,
                      const int *rcount, const int *rdispl, char *err, size_t errlen);
  void (*isend)(RtComm *c, RtCommReq *r);
  int (*req_done)(RtCommReq *r);
  void (*flush)(RtComm *c);
  RtComm *(*derive)(RtComm *parent, RtComm *mpi_sub, char *err, size_t errlen);
  void (*free_impl)(RtComm *c);
  int device_buffers;
} RtCommOps;
extern const RtCommOps rt_comm_mpi_ops;
struct RtComm {
  const RtCommOps *ops; /* the backend (rt_comm_mpi_ops unless a backend replaced it) */
  void *impl;           /* the backend's state (NULL for MPI) */
  MPI_Comm comm;        /* the group; owned (freed with the RtComm) unless world */
  MPI_Comm side;        /* a dup of comm, only for the timeout diagnostics */
  int rank, size, world_rank;
  int *world_ranks;     /* group rank -> rank in MPI_COMM_WORLD, for messages */
  char name[32];
  double timeout;       /* seconds */
  int is_world;         /* comm is MPI_COMM_WORLD: not freed */
  int owns_mpi;         /* we called MPI_Init: MPI_Finalize when freed */
  unsigned long seq;    /* collectives started on this group (for diagnostics) */
  int tag_ub;           /* the largest tag MPI allows (MPI_TAG_UB) */
};
/* A posted (MPI) or queued (NCCL) send of rt_comm_isend. */
struct RtCommReq {
  RtComm *c;
  MPI_Request r;        /* MPI groups */
  int peer, tag;
  IrDtype dt;
  const void *buf;
  size_t count;
  int coll;             /* a nonblocking collective (RtCollKind + 1), 0 for a send */
  int queued;           /* NCCL: not posted yet */
  int done;             /* NCCL: posted and its stream finished */
};
const char *rt_coll_name(RtCollKind k);
/* A new MPI group over comm (taken over: freed with the group). */
RtComm *rt_comm_wrap_mpi(MPI_Comm comm, const char *name, double timeout, char *err, size_t errlen);
/* Waits for req until c's deadline; on error or timeout prints the
 * message and aborts the job (peer: group rank of a point-to-point
 * partner, or -1 for a collective). */
void rt_comm_wait_mpi(RtComm *c, MPI_Request *req, RtCollKind k, int peer);
/* After a timeout in collective k, asks the peers (over c->side) where
 * they are; writes "waiting for rank K?"-style text. */
void rt_comm_diagnose(RtComm *c, RtCollKind k, char *out, size_t n);
#endif

#endif
