/* par.c - runs a compiled kernel's parallel space across threads
 * (cg_par_run, cg.h).  Iterations are independent by the kernel IR's
 * contract, so the space is cut into nthreads contiguous chunks: each
 * thread touches one contiguous slice of every buffer indexed by gid (no
 * false sharing except at the chunk edges).  cg_par_run creates threads
 * per call (simple; fine for large kernels); CgPool keeps them. */
#include "cg.h"
#include <pthread.h>

typedef struct { CgFn fn; void **bufs; int64_t begin, end; } Chunk;

static void *run_chunk(void *p) {
  Chunk *c = p;
  if (c->begin < c->end) c->fn(c->bufs, c->begin, c->end);
  return NULL;
}

void cg_par_run(CgFn fn, void **bufs, int64_t n, int nthreads) {
  if (n <= 0) return;
  if (nthreads > n) nthreads = (int)n;
  if (nthreads <= 1) { fn(bufs, 0, n); return; }
  enum { MAXT = 256 };
  if (nthreads > MAXT) nthreads = MAXT;
  Chunk c[MAXT];
  pthread_t th[MAXT];
  int started[MAXT] = {0};
  for (int t = 0; t < nthreads; t++)
    c[t] = (Chunk){fn, bufs, n * t / nthreads, n * (t + 1) / nthreads};
  for (int t = 1; t < nthreads; t++)
    started[t] = pthread_create(&th[t], NULL, run_chunk, &c[t]) == 0;
  run_chunk(&c[0]);
  /* a thread that could not start: its chunk runs here */
  for (int t = 1; t < nthreads; t++) {
    if (started[t]) pthread_join(th[t], NULL);
    else run_chunk(&c[t]);
  }
}

/* ---- a persistent pool ----
 * nthreads - 1 workers sleep on a condition variable; a run publishes the
 * job under the mutex with a new generation number, wakes them, runs chunk
 * 0 itself and waits until every worker has reported its chunk done.
 * One run at a time per pool (the caller's thread drives it). */
struct CgPool {
  int nthreads;
  pthread_t *th;
  int nstarted;
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  uint64_t gen;        /* bumped per run */
  int pending;         /* workers still running the current job */
  int quit;
  CgFn fn;
  void **bufs;
  int64_t n;
};

typedef struct { CgPool *p; int t; } Worker;

static void *pool_main(void *arg) {
  Worker w = *(Worker *)arg;
  free(arg);
  CgPool *p = w.p;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->quit && p->gen == seen) pthread_cond_wait(&p->work, &p->mu);
    if (p->quit) break;
    seen = p->gen;
    Chunk c = {p->fn, p->bufs, p->n * w.t / p->nthreads, p->n * (w.t + 1) / p->nthreads};
    pthread_mutex_unlock(&p->mu);
    run_chunk(&c);
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

CgPool *cg_pool_new(int nthreads) {
  CgPool *p = ts_xcalloc(1, sizeof *p);
  p->nthreads = nthreads < 1 ? 1 : nthreads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  p->th = ts_xcalloc((size_t)p->nthreads, sizeof *p->th);
  for (int t = 1; t < p->nthreads; t++) {
    Worker *w = ts_xmalloc(sizeof *w);
    *w = (Worker){p, t};
    if (pthread_create(&p->th[t], NULL, pool_main, w) != 0) {
      free(w);
      break;   /* fewer threads than asked: the chunks are cut for those that started */
    }
    p->nstarted++;
  }
  p->nthreads = p->nstarted + 1;
  return p;
}

int cg_pool_threads(const CgPool *p) { return p->nthreads; }

void cg_pool_run(CgPool *p, CgFn fn, void **bufs, int64_t n) {
  if (n <= 0) return;
  if (p->nthreads == 1 || n == 1) { fn(bufs, 0, n); return; }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->bufs = bufs;
  p->n = n;
  p->pending = p->nthreads - 1;
  p->gen++;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  Chunk c = {fn, bufs, 0, n / p->nthreads};
  run_chunk(&c);
  pthread_mutex_lock(&p->mu);
  while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void cg_pool_free(CgPool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->quit = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int t = 1; t <= p->nstarted; t++) pthread_join(p->th[t], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  free(p->th);
  free(p);
}
