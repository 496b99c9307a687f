/* generate.c - mrun --generate: text from a trained model with the blocks
 * pass decode derives from its forward (passes/decode.c,
 * docs/generation.md): "prefill" once over the prompt (a whole window at
 * batch 1, positions 0 .. seq-1, filling the KV cache), then "step" once
 * per new token (one token at position pos against the cache).  Both leave
 * the next token's logits, over the whole vocabulary, in the state
 * decode.logits on every rank; every rank samples the same token from them
 * (the same logits, the same seeded draws), so no rank waits for another
 * to tell it the token.
 *
 * Sampling: greedy (argmax, the lowest id on a tie) when the temperature
 * is 0; otherwise softmax(logits / T) restricted to the top_k most likely
 * ids (0: all) and then to the smallest set whose probability reaches
 * top_p (1: all), drawn with u = rt_u01(H(seed, 7, t)) for the t-th new
 * token (rng.c's hash), so a seed gives the same text on any layout. */
#include "train.h"
#include "runtime/data/tokenizer.h"
#include <math.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct { double p; int32_t id; } Cand;
static int by_prob(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  if (x->p != y->p) return x->p < y->p ? 1 : -1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* The next token from logits[V] (vocab V, the model's unpadded size). */
static int32_t sample(const RtGenOpts *o, const double *lg, int64_t V, int64_t t, Cand *c) {
  int32_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (lg[i] > lg[best]) best = (int32_t)i;
  if (o->temperature <= 0) return best;
  double mx = lg[best], sum = 0;
  for (int64_t i = 0; i < V; i++) {
    c[i].p = exp((lg[i] - mx) / o->temperature);
    c[i].id = (int32_t)i;
  }
  qsort(c, (size_t)V, sizeof *c, by_prob);
  int64_t n = o->top_k > 0 && o->top_k < V ? o->top_k : V;
  for (int64_t i = 0; i < n; i++) sum += c[i].p;
  if (o->top_p < 1) {   /* the smallest prefix whose probability reaches top_p */
    double acc = 0;
    int64_t k = 0;
    while (k < n && (acc += c[k].p / sum, k++, acc < o->top_p)) {}
    n = k;
    sum = 0;
    for (int64_t i = 0; i < n; i++) sum += c[i].p;
  }
  uint64_t w[3] = {o->seed, 7, (uint64_t)t};
  double u = rt_u01(rt_hash_words(w, 3)) * sum, acc = 0;
  for (int64_t i = 0; i < n; i++)
    if ((acc += c[i].p) > u) return c[i].id;
  return c[n - 1].id;
}

/* The logits state as double (first V of them). */
static int read_logits(RtProgram *p, int ls, double *lg, int64_t V, char *err, size_t errlen) {
  if (rt_program_sync_states(p, err, errlen) != 0) return -1;
  const IrState *s = &rt_program_module(p)->states.a[ls];
  const void *d = rt_state_data(p, ls);
  for (int64_t i = 0; i < V; i++) lg[i] = s->type.dtype == IR_F32 ? ((const float *)d)[i] : ((const double *)d)[i];
  return 0;
}

/* Runs prefill over ids[0, n) (padded with id 0 to the window) and reads
 * the logits of position n - 1. */
static int prefill(RtProgram *p, int pb, int ls, const int32_t *ids, int64_t n, int64_t T, int32_t *win, double *lg,
                   int64_t V, char *err, size_t errlen) {
  memset(win, 0, (size_t)T * sizeof *win);
  memcpy(win, ids, (size_t)n * sizeof *win);
  int32_t last = (int32_t)(n - 1);
  RtFeed f[2] = {{"tokens", win}, {"last", &last}};
  RtRunInfo info = {0, 0, 0, 0};
  if (rt_run_block(p, pb, f, 2, &info, err, errlen) != 0) return -1;
  return read_logits(p, ls, lg, V, err, errlen);
}

int rt_generate(RtProgram *p, RtComm *world, const RtGenOpts *o, FILE *out, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  int pb = ir_block_find(m, "prefill"), sb = ir_block_find(m, "step"), ls = ir_state_find(m, "decode.logits");
  if (pb < 0 || sb < 0 || ls < 0)
    return ts_errf(err, errlen, "--generate: the program has no blocks prefill and step (pass decode)");
  int lead = !world || rt_comm_world_rank(world) == 0;
  int64_t T = 0, Vs = ir_type_numel(&m->states.a[ls].type);
  const IrBlock *b = &m->blocks.a[pb];
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_INPUT && b->nodes[i].sa && strcmp(b->nodes[i].sa, "tokens") == 0)
      T = b->nodes[i].type.dim[1];
  /* ids the text can hold: the tokenizer's (a model's vocabulary padded past
   * it has rows no text spells), else the model's */
  int64_t vt = o->tok ? rt_tok_vocab_size(o->tok) : o->vocab;
  int64_t V = vt > 0 && vt < Vs ? vt : Vs;
  /* the prompt's ids */
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  if (o->tok) {
    if (rt_tok_encode(o->tok, o->prompt, o->prompt_len, &ids, &n, &cap) != 0) return ts_errf(err, errlen, "out of memory");
  } else {
    ids = ts_xmalloc((o->prompt_len ? o->prompt_len : 1) * sizeof *ids);
    for (size_t i = 0; i < o->prompt_len; i++) ids[i] = (unsigned char)o->prompt[i];
    n = o->prompt_len;
  }
  int rc = -1;
  int32_t *win = ts_xmalloc((size_t)(T ? T : 1) * sizeof *win), *gen = NULL;
  double *lg = ts_xmalloc((size_t)V * sizeof *lg), *seen = NULL;   /* seen: each token's logits (check_full) */
  Cand *cand = ts_xmalloc((size_t)V * sizeof *cand);
  char *text = NULL;
  size_t tl = 0, tc = 0;
  if (n == 0) { ts_errf(err, errlen, "--generate: the prompt is empty (it needs at least one token)"); goto out; }
  if ((int64_t)n > T) {
    ts_errf(err, errlen, "--generate: the prompt is %zu tokens, longer than the model's window (seq_len %lld, the "
            "KV cache's size)", n, (long long)T);
    goto out;
  }
  if ((int64_t)n + o->max_tokens > T) {
    ts_errf(err, errlen, "--generate: %zu prompt tokens + --max-tokens %lld is past the model's window (seq_len %lld, "
            "the KV cache's size): at most %lld new tokens", n, (long long)o->max_tokens, (long long)T,
            (long long)(T - (int64_t)n));
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V) {
      ts_errf(err, errlen, "--generate: prompt token %zu has id %d, outside the model's vocabulary of %lld", i, ids[i],
              (long long)V);
      goto out;
    }
  gen = ts_xmalloc((size_t)(n + (size_t)o->max_tokens + 1) * sizeof *gen);
  if (o->check_full) seen = ts_xmalloc((size_t)(o->max_tokens ? o->max_tokens : 1) * (size_t)V * sizeof *seen);
  memcpy(gen, ids, n * sizeof *gen);
  int64_t len = (int64_t)n;
  double t0 = now_s(), t_first = 0;
  if (o->max_tokens > 0) {
    if (prefill(p, pb, ls, gen, len, T, win, lg, V, err, errlen) != 0) goto out;
    t_first = now_s() - t0;
  }
  for (int64_t t = 0; t < o->max_tokens; t++) {
    if (t > 0) {   /* the token just sampled, at position len - 1 */
      int32_t tok = gen[len - 1], pos = (int32_t)(len - 1);
      RtFeed f[2] = {{"tokens", &tok}, {"pos", &pos}};
      RtRunInfo info = {0, 0, 0, 0};
      if (rt_run_block(p, sb, f, 2, &info, err, errlen) != 0) goto out;
      if (read_logits(p, ls, lg, V, err, errlen) != 0) goto out;
    }
    if (seen) memcpy(seen + t * V, lg, (size_t)V * sizeof *lg);
    gen[len++] = sample(o, lg, V, t, cand);
  }
  double el = now_s() - t0;
  /* the text */
  if (o->tok) {
    if (rt_tok_decode(o->tok, gen, (size_t)len, &text, &tl, &tc, err, errlen) != 0) goto out;
  } else {
    StrBuf b = {0};   /* one byte per id; an id past the bytes (a model of a larger vocabulary) as <|id|> */
    for (int64_t i = 0; i < len; i++) {
      if (gen[i] < 256) sb_putc(&b, (char)gen[i]);
      else sb_printf(&b, "<|%d|>", gen[i]);
    }
    text = b.p ? b.p : ts_xstrdup("");
    tl = b.n;
  }
  if (lead) {
    fwrite(text, 1, tl, out);
    fprintf(out, "\n");
    if (o->print_ids) {
      fprintf(out, "ids:");
      for (int64_t i = (int64_t)n; i < len; i++) fprintf(out, " %d", gen[i]);
      fprintf(out, "\n");
    }
    int64_t k = len - (int64_t)n;
    fprintf(o->quiet ? stderr : out, "generated %lld tokens after a %zu-token prompt in %.3f s: %.1f tokens/s "
            "(prefill %.3f s, then %.1f tokens/s)\n", (long long)k, n, el, el > 0 ? (double)k / el : 0.0, t_first,
            k > 1 && el > t_first ? (double)(k - 1) / (el - t_first) : 0.0);
  }
  /* the full-sequence check: the prefill (the training forward) of every
   * prefix predicts, by argmax, the token generated after it, and its
   * logits are the ones the token was drawn from, within tol */
  if (o->check_full) {
    int64_t bad = -1;
    /* bf16 storage (docs/precision.md): the step and the full forward sum
     * in f32 in other orders, so a value rounds to a neighbouring bf16
     * (2^-8 relative) now and then, and it compounds through the layers */
    double worst = 0, tol = m->train.lowp != IR_VOID ? 3e-2 : m->states.a[ls].type.dtype == IR_F32 ? 1e-4 : 1e-9;
    for (int64_t t = (int64_t)n; t < len && bad < 0; t++) {
      if (prefill(p, pb, ls, gen, t, T, win, lg, V, err, errlen) != 0) goto out;
      int32_t best = 0;
      const double *s = seen + (t - (int64_t)n) * V;
      for (int64_t i = 0; i < V; i++) {
        if (lg[i] > lg[best]) best = (int32_t)i;
        double d = fabs(s[i] - lg[i]) / (fabs(lg[i]) > 1 ? fabs(lg[i]) : 1);
        if (d > worst) worst = d;
      }
      if (best != gen[t] || worst > tol) bad = t;
      if (bad >= 0 && lead)
        fprintf(out, "full-forward check: FAIL at new token %lld: generated %d, the full forward's argmax %d; "
                "logits differ by %.3g (relative; tolerance %g)\n", (long long)(t - (int64_t)n), gen[t], best, worst, tol);
    }
    if (bad < 0 && lead)
      fprintf(out, "full-forward check: all %lld tokens equal the full forward's argmax; logits within %.3g "
              "(relative; tolerance %g)\n", (long long)(len - (int64_t)n), worst, tol);
    if (bad >= 0) { ts_errf(err, errlen, "--generate-check: the decode differs from the full forward"); goto out; }
  }
  rc = 0;
out:
  free(ids);
  free(win);
  free(gen);
  free(lg);
  free(seen);
  free(cand);
  free(text);
  return rc;
}
