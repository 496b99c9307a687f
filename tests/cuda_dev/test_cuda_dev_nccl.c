/* test_cuda_dev_nccl - NCCL groups on a device's comm stream
 * (runtime/comm/comm_nccl.c: rt_comm_nccl_bind, rt_comm_nccl_wait,
 * all_to_all_v on a NCCL group), under mpirun (tests/comm/run_mpi.sh) with fakes
 * for everything below: the CUDA driver (TS_CUDA_DRIVER: fake_cuda.c), the
 * CUDA runtime and NCCL (LD_LIBRARY_PATH: fake_cudart.c as libcudart.so,
 * fake_nccl.c as libnccl.so.2, which carries NCCL's operations out over
 * MPI at once).
 *   test_cuda_dev_nccl MODE TOKEN      (MODE: bound)
 * Checks, on every rank: a group not bound to a device runs on its own
 * stream and waits for it after every operation; bound, it hands every
 * operation the device's comm stream and does not wait (rt_comm_nccl_wait
 * does); all_reduce and the variable-count all-to-all (counts with zeros,
 * displacements with gaps) give the values computed locally; refusals.
 * Exit 0 iff every check on every rank passed. */
#include "runtime/comm/comm.h"
#include "runtime/device/device.h"
#include <dlfcn.h>
#include "../check.h"


static int rank;
static char err[1024];
#define OK(call)                                 \
  do {                                           \
    err[0] = 0;                                  \
    int rc_ = (call);                            \
    CHECK(rc_ == 0, "%s: %s", #call, err);       \
  } while (0)

static long (*queries)(void);
static void *(*last_queried)(void);
static void *(*last_stream)(void);

static void *must(void *h, const char *lib, const char *name) {
  void *p = h ? dlsym(h, name) : NULL;
  if (!p) {
    fprintf(stderr, "rank %d: FAIL: %s from %s: %s\n", rank, name, lib, dlerror());
    exit(1);
  }
  return p;
}

/* Element i of what rank r sends to rank j (exact in f32). */
static double val(int r, int j, int i) { return r * 100 + j * 10 + i + 0.25; }
static int count_of(int r, int j) { return (r * 3 + j * 5) % 4; }   /* zeros among them */

static void put(IrDtype dt, void *p, size_t i, double v) {
  if (dt == IR_F32) ((float *)p)[i] = (float)v;
  else ((double *)p)[i] = v;
}
static double get(IrDtype dt, const void *p, size_t i) {
  return dt == IR_F32 ? ((const float *)p)[i] : ((const double *)p)[i];
}

static void all_to_all_v(RtComm *n, RtDev *d, IrDtype dt) {
  int p = rt_comm_size(n);
  size_t es = ir_dtype_size(dt);
  int sc[16], sd[16], rc[16], rd[16], ns = 0, nr = 0;
  for (int j = 0; j < p; j++) {   /* displacements with gaps of 1 (send) and 2 (receive) elements */
    sc[j] = count_of(rank, j);
    sd[j] = ns + 1;
    ns += sc[j] + 1;
    rc[j] = count_of(j, rank);
    rd[j] = nr + 2;
    nr += rc[j] + 2;
  }
  void *hs = calloc((size_t)ns, es), *hr = calloc((size_t)nr, es);
  for (int j = 0; j < p; j++)
    for (int i = 0; i < sc[j]; i++) put(dt, hs, (size_t)(sd[j] + i), val(rank, j, i));
  for (int i = 0; i < nr; i++) put(dt, hr, (size_t)i, -1);
  void *ds = NULL, *dr = NULL;
  OK(d->ops->alloc(d, (size_t)ns * es, &ds, err, sizeof err));
  OK(d->ops->alloc(d, (size_t)nr * es, &dr, err, sizeof err));
  OK(d->ops->h2d(d, ds, hs, (size_t)ns * es, RT_STREAM_COMM, err, sizeof err));
  OK(d->ops->h2d(d, dr, hr, (size_t)nr * es, RT_STREAM_COMM, err, sizeof err));
  OK(d->ops->sync(d, RT_STREAM_COMM, err, sizeof err));
  OK(rt_comm_all_to_all_v(n, dt, ds, sc, sd, dr, rc, rd, err, sizeof err));
  /* the executor's pattern: compute waits for the comm stream through an event */
  OK(d->ops->event_record(d, 0, RT_STREAM_COMM, err, sizeof err));
  OK(d->ops->stream_wait(d, RT_STREAM_COMPUTE, 0, err, sizeof err));
  OK(d->ops->d2h(d, hr, dr, (size_t)nr * es, RT_STREAM_COMPUTE, err, sizeof err));
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, err, sizeof err));
  int bad = 0;
  for (int j = 0; j < p; j++) {
    for (int i = 0; i < rc[j]; i++) bad += get(dt, hr, (size_t)(rd[j] + i)) != val(j, rank, i);
    bad += get(dt, hr, (size_t)(rd[j] - 1)) != -1 || get(dt, hr, (size_t)(rd[j] - 2)) != -1;   /* gaps untouched */
  }
  CHECK(!bad, "all_to_all_v %s: %d wrong elements", ir_dtype_name(dt), bad);
  d->ops->free(d, ds);
  d->ops->free(d, dr);
  free(hs);
  free(hr);
}

int main(int argc, char **argv) {
  RtComm *w = rt_comm_init_mpi(&argc, &argv, 30, err, sizeof err);
  if (!w) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  check_rank = rank = rt_comm_rank(w);
  int p = rt_comm_size(w);
  void *hc = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL), *hn = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  *(void **)&queries = must(hc, "libcudart.so", "fake_cudart_queries");
  *(void **)&last_queried = must(hc, "libcudart.so", "fake_cudart_last_queried");
  *(void **)&last_stream = must(hn, "libnccl.so.2", "fake_nccl_last_stream");
  RtDev *d = rt_dev_cuda_open(0, err, sizeof err), *d1 = rt_dev_cuda_open(1, err, sizeof err);
  CHECK(d && d1, "opening the fake GPUs: %s", err);
  RtComm *n = d ? rt_comm_init_nccl(w, 0, err, sizeof err) : NULL;
  CHECK(n && rt_comm_is_nccl(n), "NCCL group over the fakes: %s", err);
  if (n && d1) {
    void *comm = d->ops->stream_handle(d, RT_STREAM_COMM);
    double *buf = NULL, x[4];
    OK(d->ops->alloc(d, sizeof x, (void **)&buf, err, sizeof err));
    /* not bound: the group's own stream, waited for */
    for (int i = 0; i < 4; i++) x[i] = rank + i;
    OK(d->ops->h2d(d, buf, x, sizeof x, RT_STREAM_COMPUTE, err, sizeof err));
    OK(d->ops->sync(d, RT_STREAM_COMPUTE, err, sizeof err));
    long q0 = queries();
    OK(rt_comm_all_reduce(n, IR_F64, buf, 4, err, sizeof err));
    void *own = last_stream();
    CHECK(own && own != comm && queries() > q0 && last_queried() == own,
          "an unbound group: stream %p (device's %p), %ld waits", own, comm, queries() - q0);
    /* bound: the device's comm stream, not waited for */
    OK(rt_comm_nccl_bind(n, comm, d->ordinal, err, sizeof err));
    q0 = queries();
    OK(rt_comm_all_reduce(n, IR_F64, buf, 4, err, sizeof err));
    CHECK(last_stream() == comm && queries() == q0, "a bound group: stream %p (device's %p), %ld waits",
          last_stream(), comm, queries() - q0);
    all_to_all_v(n, d, IR_F32);
    all_to_all_v(n, d, IR_F64);
    CHECK(last_stream() == comm && queries() == q0, "bound all_to_all_v: stream %p, %ld waits", last_stream(),
          queries() - q0);
    OK(rt_comm_nccl_wait(n, err, sizeof err));
    CHECK(queries() > q0 && last_queried() == comm, "rt_comm_nccl_wait did not wait for the comm stream");
    OK(d->ops->d2h(d, x, buf, sizeof x, RT_STREAM_COMPUTE, err, sizeof err));
    OK(d->ops->sync(d, RT_STREAM_COMPUTE, err, sizeof err));
    for (int i = 0; i < 4; i++) {   /* two all_reduces of rank + i */
      double want = p * (double)p * i + (double)p * (p * (p - 1) / 2);
      CHECK(x[i] == want, "all_reduce twice [%d]: %g, want %g", i, x[i], want);
    }
    /* refusals */
    CHECK(rt_comm_nccl_bind(n, d1->ops->stream_handle(d1, RT_STREAM_COMM), d1->ordinal, err, sizeof err) == -1 &&
              strstr(err, "runs on GPU 0 but the stream is on GPU 1"),
          "bound to another GPU: %s", err);
    CHECK(rt_comm_nccl_bind(w, comm, d->ordinal, err, sizeof err) == -1 && strstr(err, "not a NCCL group"),
          "an MPI group bound: %s", err);
    int bad[16], zero[16] = {0};
    for (int j = 0; j < 16; j++) bad[j] = j == 0 ? -1 : 0;
    CHECK(rt_comm_all_to_all_v(n, IR_F32, buf, bad, zero, buf, zero, zero, err, sizeof err) == -1 &&
          strstr(err, "peer 0 has count -1"), "a negative count: %s", err);
    /* unbound again: its own stream */
    OK(rt_comm_nccl_bind(n, NULL, 0, err, sizeof err));
    OK(rt_comm_all_reduce(n, IR_F64, buf, 4, err, sizeof err));
    CHECK(last_stream() == own, "unbound again: stream %p, own %p", last_stream(), own);
    d->ops->free(d, buf);
  }
  rt_comm_free(n);
  if (d) d->ops->close(d);
  if (d1) d1->ops->close(d1);
  double all = check_bad();
  if (rt_comm_all_reduce(w, IR_F64, &all, 1, err, sizeof err) != 0) all = 1;
  char name[64];
  snprintf(name, sizeof name, "test_cuda_dev_nccl on %d rank(s)", p);
  rt_comm_free(w);
  return check_exit_all(name, all);
}
