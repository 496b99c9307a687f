/* prefetch.c - training batches prepared by a thread one step ahead
 * (train.h RtPrefetch), so a step does not wait on reading samples from
 * the mapped dataset and building the rank's tokens / targets.
 *
 * Two slots (a double buffer: bounded memory, two steps' feeds of this
 * rank): while step s runs from slot s % 2, the thread fills step s + 1
 * into the other; it fills step s + 2 only after the trainer released s.
 * The thread calls the same fill function, for the same (step, micro), as
 * the trainer would, so the batches are identical with and without it.
 * A fill error is kept in its slot and reported by rt_prefetch_get for
 * that step, in the trainer's thread.  A slot also holds the global
 * tokens of each micro batch when the trainer asks for them (ng > 0): the
 * packed-sequence inputs of a rank whose tokens are split (cp, sp) are made
 * from the whole micro batch (packed.c), so the thread delivers those rows
 * too and every run can prefetch.  SIGINT / SIGTERM are blocked in
 * the thread: the trainer's handler sees them, as without prefetch. */
#include "train.h"
#include "rt_priv.h"
#include <pthread.h>
#include <signal.h>

typedef struct {
  int64_t step;           /* the step it holds, or -1 */
  int ready, rc;
  char err[1024];
  int32_t *tok, *tgt;     /* [nmicro][n] */
  int32_t *gtok;          /* [nmicro][ng], or NULL (ng = 0) */
} PfSlot;

struct RtPrefetch {
  RtPrefetchFill fill;
  void *ctx;
  int64_t next, end, nmicro;
  size_t n, ng;
  PfSlot slot[2];
  int quit;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th;
  int started;
};

static void *pf_main(void *arg) {
  RtPrefetch *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->quit && p->next < p->end) {
    PfSlot *sl = &p->slot[p->next % 2];
    if (sl->step >= 0) { pthread_cond_wait(&p->cv, &p->mu); continue; }   /* still in use */
    int64_t s = p->next;
    sl->step = s, sl->ready = 0;
    pthread_mutex_unlock(&p->mu);
    int rc = 0;
    char err[1024] = "";
    for (int64_t j = 0; j < p->nmicro && rc == 0; j++)
      rc = p->fill(p->ctx, s, j, sl->tok + (size_t)j * p->n, sl->tgt + (size_t)j * p->n,
                   sl->gtok ? sl->gtok + (size_t)j * p->ng : NULL, err, sizeof err);
    pthread_mutex_lock(&p->mu);
    sl->rc = rc;
    snprintf(sl->err, sizeof sl->err, "%s", err);
    sl->ready = 1;
    p->next++;
    pthread_cond_broadcast(&p->cv);
    if (rc != 0) break;   /* the trainer stops at this step */
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

RtPrefetch *rt_prefetch_start(RtPrefetchFill fill, void *ctx, int64_t first, int64_t end, int64_t nmicro, size_t n,
                              size_t ng, char *err, size_t errlen) {
  RtPrefetch *p = ts_xcalloc(1, sizeof *p);
  p->fill = fill, p->ctx = ctx, p->next = first, p->end = end, p->nmicro = nmicro, p->n = n, p->ng = ng;
  for (int k = 0; k < 2; k++) {
    p->slot[k].step = -1;
    p->slot[k].tok = ts_xcalloc((size_t)nmicro * n + 1, sizeof(int32_t));
    p->slot[k].tgt = ts_xcalloc((size_t)nmicro * n + 1, sizeof(int32_t));
    p->slot[k].gtok = ng ? ts_xcalloc((size_t)nmicro * ng, sizeof(int32_t)) : NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);   /* inherited by the thread */
  int rc = pthread_create(&p->th, NULL, pf_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    ts_errf(err, errlen, "cannot start the data prefetch thread: %s (try --no-prefetch)", strerror(rc));
    p->started = 0;
    rt_prefetch_stop(p);
    return NULL;
  }
  p->started = 1;
  return p;
}

int rt_prefetch_get(RtPrefetch *p, int64_t step, int64_t j, int32_t *tok, int32_t *tgt, int32_t *gtok, char *err,
                    size_t errlen) {
  PfSlot *sl = &p->slot[step % 2];
  pthread_mutex_lock(&p->mu);
  if (step >= p->end || j < 0 || j >= p->nmicro || (sl->step >= 0 && sl->step != step)) {
    /* the trainer asks in order: a bug */
    pthread_mutex_unlock(&p->mu);
    return ts_errf(err, errlen, "data prefetch: step %lld micro %lld asked out of order (a bug)", (long long)step,
                   (long long)j);   /* internal */
  }
  while (!(sl->step == step && sl->ready)) pthread_cond_wait(&p->cv, &p->mu);
  int rc = sl->rc;
  if (rc != 0) snprintf(err, errlen, "%s", sl->err);
  pthread_mutex_unlock(&p->mu);
  if (rc != 0) return -1;
  if (tok) memcpy(tok, sl->tok + (size_t)j * p->n, p->n * sizeof *tok);
  if (tgt) memcpy(tgt, sl->tgt + (size_t)j * p->n, p->n * sizeof *tgt);
  if (gtok && sl->gtok) memcpy(gtok, sl->gtok + (size_t)j * p->ng, p->ng * sizeof *gtok);
  return 0;
}

void rt_prefetch_release(RtPrefetch *p, int64_t step) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  PfSlot *sl = &p->slot[step % 2];
  if (sl->step == step && sl->ready) sl->step = -1, sl->ready = 0;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void rt_prefetch_stop(RtPrefetch *p) {
  if (!p) return;
  if (p->started) {
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);   /* a fill under way finishes first: it only reads the data */
  }
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  for (int k = 0; k < 2; k++) free(p->slot[k].tok), free(p->slot[k].tgt), free(p->slot[k].gtok);
  free(p);
}
