/* par.c - runs a compiled kernel's parallel space across threads
 * (cg_par_run, cg.h).  Iterations are independent by the kernel IR's
 * contract, so the space is cut into nthreads contiguous chunks: each
 * thread touches one contiguous slice of every buffer indexed by gid (no
 * false sharing except at the chunk edges).  Threads are created per call:
 * simple, and negligible for the large kernels it is meant for; a
 * persistent pool is the runtime's business when it integrates codegen. */
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
