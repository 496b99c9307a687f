/* par.c - the worker pool behind rt_par_for (par.h).
 *
 * Workers are started on first use and sleep on a condition variable
 * between calls: the caller publishes a job (fn, ctx, ranges) under a new
 * generation number, runs range 0 itself, then waits until every worker
 * has reported.  Sleeping (not spinning) matters on small shared machines:
 * OpenBLAS's own threads spin for a while after each GEMM, and spinning
 * workers of ours would take their cores.  The pool is joined at exit.
 * Assumes: kernels call it from one thread at a time (the executor is
 * sequential); a concurrent or nested call finds the pool busy and runs
 * its loop serially instead of waiting. */
#include "par.h"
#include "ir/util.h"
#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  pthread_t tid[RT_PAR_MAX];
  unsigned long born[RT_PAR_MAX]; /* gen when worker i+1 started: it runs only later jobs */
  int nworkers;          /* threads started (threads - 1) */
  int want;              /* thread count wanted, 0 = not decided yet */
  unsigned long gen;     /* job generation: workers run each once */
  int pending;           /* workers still running the current job */
  int stop;
  RtParFn fn;
  void *ctx;
  int64_t n, per;        /* range r is [r * per, min(n, (r + 1) * per)) */
  int nranges;
} Pool;

static Pool pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};
/* held by the caller for the whole of a parallel call: a second caller
 * that cannot take it runs serially */
static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER;

/* The ranks of this job on this machine (Open MPI, MPICH / Hydra), 1
 * outside MPI. */
static int local_ranks(void) {
  const char *names[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (v && atoi(v) >= 1) return atoi(v);
  }
  return 1;
}

/* The thread count from the environment; *set says whether a variable
 * chose it.  Unset, the cores are shared among the machine's ranks. */
static int env_threads_set(int *set) {
  const char *names[] = {"TS_NUM_THREADS", "TS_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
  *set = 1;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) {
      int n = atoi(v);
      if (n >= 1) return n < RT_PAR_MAX ? n : RT_PAR_MAX;
    }
  }
  *set = 0;
  long c = sysconf(_SC_NPROCESSORS_ONLN) / local_ranks();
  return c < 1 ? 1 : c > RT_PAR_MAX ? RT_PAR_MAX : (int)c;
}
static int env_threads(void) {
  int set;
  return env_threads_set(&set);
}

static void run_range(RtParFn fn, void *ctx, int64_t n, int64_t per, int r) {
  int64_t lo = (int64_t)r * per, hi = lo + per < n ? lo + per : n;
  if (lo < hi) fn(ctx, lo, hi);
}

static void *worker(void *arg) {
  int me = (int)(intptr_t)arg;   /* range index: 1..nworkers */
  pthread_mutex_lock(&pool.mu);
  unsigned long seen = pool.born[me - 1];
  for (;;) {
    while (!pool.stop && pool.gen == seen) pthread_cond_wait(&pool.go, &pool.mu);
    if (pool.stop) break;
    seen = pool.gen;
    RtParFn fn = pool.fn;
    void *ctx = pool.ctx;
    int64_t n = pool.n, per = pool.per;
    int mine = me < pool.nranges;
    pthread_mutex_unlock(&pool.mu);
    if (mine) run_range(fn, ctx, n, per, me);
    pthread_mutex_lock(&pool.mu);
    if (--pool.pending == 0) pthread_cond_signal(&pool.done);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

static void pool_stop(void) {
  pthread_mutex_lock(&busy);
  pthread_mutex_lock(&pool.mu);
  pool.stop = 1;
  pthread_cond_broadcast(&pool.go);
  pthread_mutex_unlock(&pool.mu);
  for (int i = 0; i < pool.nworkers; i++) pthread_join(pool.tid[i], NULL);
  pool.nworkers = 0;
  pool.stop = 0;
  pthread_mutex_unlock(&busy);
}

/* Starts workers up to want - 1 (caller holds `busy`).  A thread that
 * cannot be created just leaves the pool smaller. */
static void pool_grow(void) {
  static int registered;
  if (!registered) { atexit(pool_stop); registered = 1; }
  while (pool.nworkers < pool.want - 1) {
    pool.born[pool.nworkers] = pool.gen;   /* no job is in flight: the caller holds `busy` */
    if (pthread_create(&pool.tid[pool.nworkers], NULL, worker, (void *)(intptr_t)(pool.nworkers + 1)) != 0) break;
    pool.nworkers++;
  }
}

int rt_par_threads(void) {
  if (!pool.want) {
    int set;
    pool.want = env_threads_set(&set);
    /* ranks started by an outside mpirun: OpenBLAS would start a thread per
     * core in every rank; give it the same share as the pool */
    if (!set && local_ranks() > 1) openblas_set_num_threads(pool.want);
  }
  return pool.want;
}

void rt_par_set_threads(int n) {
  int want = n >= 1 ? (n < RT_PAR_MAX ? n : RT_PAR_MAX) : env_threads();
  if (pool.nworkers > want - 1) pool_stop();
  pool.want = want;
}

void rt_par_for(int64_t n, int64_t grain, RtParFn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int t = rt_par_threads();
  int64_t most = n / grain;   /* ranges of at least `grain` */
  if (most < t) t = (int)most;
  if (t < 2 || pthread_mutex_trylock(&busy) != 0) { fn(ctx, 0, n); return; }
  pool_grow();
  if (pool.nworkers + 1 < t) t = pool.nworkers + 1;
  if (t < 2) { pthread_mutex_unlock(&busy); fn(ctx, 0, n); return; }
  int64_t per = (n + t - 1) / t;
  pthread_mutex_lock(&pool.mu);
  pool.fn = fn;
  pool.ctx = ctx;
  pool.n = n;
  pool.per = per;
  pool.nranges = t;
  pool.pending = pool.nworkers;   /* every worker reports, with a range or not */
  pool.gen++;
  pthread_cond_broadcast(&pool.go);
  pthread_mutex_unlock(&pool.mu);
  run_range(fn, ctx, n, per, 0);
  pthread_mutex_lock(&pool.mu);
  while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&busy);
}

typedef struct { char *d; const char *s; } CopyJob;
static void copy_range(void *c, int64_t lo, int64_t hi) {
  CopyJob *j = c;
  memcpy(j->d + lo, j->s + lo, (size_t)(hi - lo));
}

void rt_par_memcpy(void *dst, const void *src, size_t bytes) {
  if (bytes < RT_PAR_MEM_MIN) { memcpy(dst, src, bytes); return; }
  CopyJob j = {dst, src};
  rt_par_for((int64_t)bytes, (int64_t)RT_PAR_MEM_MIN / 2, copy_range, &j);
}

typedef struct { char *d; int c; } SetJob;
static void set_range(void *c, int64_t lo, int64_t hi) {
  SetJob *j = c;
  memset(j->d + lo, j->c, (size_t)(hi - lo));
}

void rt_par_memset(void *dst, int c, size_t bytes) {
  if (bytes < RT_PAR_MEM_MIN) { memset(dst, c, bytes); return; }
  SetJob j = {dst, c};
  rt_par_for((int64_t)bytes, (int64_t)RT_PAR_MEM_MIN / 2, set_range, &j);
}

void rt_par_blas_serial(RtParFn fn, void *ctx, int64_t n, int64_t grain) {
  if (rt_par_threads() < 2 || n < 2 * grain) { fn(ctx, 0, n); return; }
  int prev = openblas_get_num_threads();
  if (prev > 1) openblas_set_num_threads(1);
  rt_par_for(n, grain, fn, ctx);
  if (prev > 1) openblas_set_num_threads(prev);
}

/* ---- rt_scratch: per-thread buffers, freed by the key's destructor at
 * thread exit (the main thread's stay reachable until the process ends) */
typedef struct { void *p[RT_SCRATCH_SLOTS]; size_t n[RT_SCRATCH_SLOTS]; } Scratch;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *v) {
  Scratch *s = v;
  for (int i = 0; i < RT_SCRATCH_SLOTS; i++) free(s->p[i]);
  free(s);
}
static void scratch_init(void) { TS_ASSERT(pthread_key_create(&scratch_key, scratch_free) == 0); }

void *rt_scratch(int slot, size_t bytes) {
  TS_ASSERT(slot >= 0 && slot < RT_SCRATCH_SLOTS);
  pthread_once(&scratch_once, scratch_init);
  Scratch *s = pthread_getspecific(scratch_key);
  if (!s) {
    s = ts_xcalloc(1, sizeof *s);
    TS_ASSERT(pthread_setspecific(scratch_key, s) == 0);
  }
  if (bytes == 0) bytes = 1;
  if (s->n[slot] < bytes) {
    free(s->p[slot]);
    s->p[slot] = ts_xmalloc(bytes);
    s->n[slot] = bytes;
  }
  return s->p[slot];
}

void rt_scratch_done(int slot) {
  TS_ASSERT(slot >= 0 && slot < RT_SCRATCH_SLOTS);
  pthread_once(&scratch_once, scratch_init);
  Scratch *s = pthread_getspecific(scratch_key);
  if (!s || s->n[slot] <= RT_SCRATCH_KEEP) return;
  free(s->p[slot]);
  s->p[slot] = NULL;
  s->n[slot] = 0;
}
