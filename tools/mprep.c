/* mprep.c - text or JSONL to Megatron's indexed dataset (PREFIX.bin +
 * PREFIX.idx, docs/data.md "Indexed datasets"), the job of Megatron's
 * tools/preprocess_data.py.
 *
 *   input --(main thread: reads batches of documents, ~1 MiB each)-->
 *   workers (tokenize a round of batches in parallel) -->
 *   main thread (writes the round's batches in input order)
 *
 * Each document is tokenized on its own, so the output does not depend on
 * how documents fall into batches or on --workers: the files are identical
 * for any N.  The input is streamed line by line, never read whole; the
 * outputs are streamed through runtime/data/indexed.c (ir/io.c's rules:
 * atomic, nothing left behind on failure).
 *
 * Documents: in text input, the runs of non-blank lines (a blank line is
 * empty or only spaces, tabs and CR), each line with its newline; in JSONL,
 * one object per line whose key holds a string (one sequence) or an array
 * of strings (one sequence each, as Megatron's sentences).  As Megatron,
 * a sentence that gives no token is dropped and --append-eod adds the
 * end-of-document id to the document's last sequence; unlike it, a
 * document that gives no token is skipped (counted in the summary) rather
 * than written as an empty document.
 *
 * Exit codes: 0 ok, 1 bad input or I/O failure, 2 usage error. */
#include "ir/json.h"
#include "ir/util.h"
#include "runtime/data/indexed.h"
#include "runtime/data/tokenizer.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: mprep --input FILE --output-prefix P --tokenizer PATH|bytes [options]\n"
    "Tokenizes text or JSONL into Megatron's indexed dataset P.bin + P.idx.\n"
    "  --input FILE          text (documents separated by blank lines; each document's\n"
    "                        lines are kept with their newlines) or, with --json-keys,\n"
    "                        JSONL (one object per line); - is standard input\n"
    "  --output-prefix P     writes P.bin and P.idx (with several --json-keys, P_KEY.bin\n"
    "                        and P_KEY.idx for each key)\n"
    "  --tokenizer PATH      a tokenizer.json, a vocab.json (merges.txt beside it) or a\n"
    "                        directory holding one; 'bytes': each byte is its id\n"
    "                        (vocabulary 256; 257 with --append-eod, whose id is 256)\n"
    "  --json-keys K[,K...]  JSONL input: the key(s) whose string (or array of strings,\n"
    "                        one sequence each) is the document; several keys make\n"
    "                        several datasets\n"
    "  --append-eod          end every document with the end-of-document id\n"
    "  --workers N           threads that tokenize (default 1); the output is the same\n"
    "                        for any N\n"
    "  --dtype auto|u16|i32  the token dtype (auto: u16 below 65500 ids, else i32)\n"
    "  --max-document-mb M   refuse a document (or a line) longer than M MB (default and\n"
    "                        most 1024: a sequence holds fewer than 2^31 tokens)\n"
    "  --quiet               no progress lines\n"
    "  --help                this text\n"
    "Blank JSONL lines are skipped; a document that gives no token is skipped and counted.\n"
    "Exit: 0 ok, 1 bad input or I/O failure, 2 usage error.\n";

enum { MAX_KEYS = 16, BATCH_BYTES = 1 << 20, JOBS_PER_WORKER = 4 };

typedef struct {
  const char *input, *prefix, *tok_path;
  const char *keys[MAX_KEYS];
  char *keys_buf;                                 /* what keys point into */
  int nkeys, append_eod, workers, dtype, quiet;   /* dtype 0: auto */
  long max_mb;                                    /* --max-document-mb */
} Args;

/* ---- the tokenizer: bytes, or a BPE through runtime/data/tokenizer.h ---- */
typedef struct {
  RtTokenizer *bpe;   /* NULL: bytes */
  int64_t vocab;
  int32_t eod;        /* -1: none */
} Tok;

typedef struct { int32_t *a; size_t n, cap; } Ids;

static int tok_encode(const Tok *t, const char *s, size_t n, Ids *out) {
  if (t->bpe) return rt_tok_encode(t->bpe, s, n, &out->a, &out->n, &out->cap);
  if (out->n + n > out->cap) {
    out->cap = 2 * (out->n + n) + 64;
    out->a = ts_xrealloc(out->a, out->cap * sizeof *out->a);
  }
  for (size_t k = 0; k < n; k++) out->a[out->n++] = (unsigned char)s[k];
  return 0;
}

static void ids_push(Ids *v, int32_t id) {
  if (v->n == v->cap) {
    v->cap = 2 * v->cap + 64;
    v->a = ts_xrealloc(v->a, v->cap * sizeof *v->a);
  }
  v->a[v->n++] = id;
}

static int tok_load(Tok *t, const Args *a) {
  memset(t, 0, sizeof *t);
  if (strcmp(a->tok_path, "bytes") == 0) {
    t->vocab = a->append_eod ? 257 : 256;
    t->eod = a->append_eod ? 256 : -1;
    return 0;
  }
  char err[1024];
  t->bpe = rt_tok_load(a->tok_path, err, sizeof err);
  if (!t->bpe) { fprintf(stderr, "mprep: error: %s\n", err); return -1; }
  t->vocab = rt_tok_vocab_size(t->bpe);
  t->eod = rt_tok_eod(t->bpe);
  if (a->append_eod && t->eod < 0) {
    fprintf(stderr, "mprep: error: %s: --append-eod, but the tokenizer has none of the end-of-document tokens "
                    "<|endoftext|>, <|end_of_text|>, </s>, <eos>\n", a->tok_path);
    return -1;
  }
  return 0;
}

/* ---- a batch of input units (documents in text input, lines in JSONL) ---- */
typedef struct {
  Ids ids;                /* every token of the batch, back to back */
  VEC(int32_t) seq;       /* tokens per sequence */
  VEC(int32_t) doc;       /* sequences per (non-empty) document */
  long empty;             /* documents skipped: no token */
} KeyOut;

typedef struct {
  StrBuf text;            /* the units back to back */
  VEC(size_t) start;      /* unit u is text[start[u], start[u + 1]) */
  VEC(long) line;         /* the input line each unit starts on */
  KeyOut out[MAX_KEYS];
  char err[1024];         /* the batch's first error, "" if none */
} Job;

static void job_reset(Job *j, int nkeys) {
  j->text.n = 0;
  j->start.n = 0;
  j->line.n = 0;
  j->err[0] = 0;
  for (int k = 0; k < nkeys; k++) {
    j->out[k].ids.n = 0;
    j->out[k].seq.n = 0;
    j->out[k].doc.n = 0;
    j->out[k].empty = 0;
  }
}

static void job_free(Job *j) {
  sb_free(&j->text);
  free(j->start.a);
  free(j->line.a);
  for (int k = 0; k < MAX_KEYS; k++) {
    free(j->out[k].ids.a);
    free(j->out[k].seq.a);
    free(j->out[k].doc.a);
  }
}

static int job_units(const Job *j) { return j->start.n ? j->start.n - 1 : 0; }

/* Appends one sentence's ids to o as a sequence of the current document;
 * no token, no sequence (Megatron drops empty sentences). */
static int add_sentence(const Tok *t, KeyOut *o, const char *s, size_t n, int *nseq) {
  size_t before = o->ids.n;
  if (tok_encode(t, s, n, &o->ids) != 0) return -1;
  size_t got = o->ids.n - before;
  if (got == 0) return 0;
  if (got >= INT32_MAX) return -1;
  int32_t len = (int32_t)got;
  VEC_PUSH(o->seq, len);
  (*nseq)++;
  return 0;
}

/* Closes a document of nseq sequences: the end-of-document id on its last
 * one, or skipped when it has no token. */
static void end_document(const Tok *t, KeyOut *o, int nseq, int append_eod) {
  if (nseq == 0) { o->empty++; return; }
  if (append_eod) {
    ids_push(&o->ids, t->eod);
    o->seq.a[o->seq.n - 1]++;
  }
  int32_t n = nseq;
  VEC_PUSH(o->doc, n);
}

typedef struct {
  const Args *a;
  const Tok *t;
  Job *jobs;
  int njobs;
  atomic_int next;
} Round;

/* "FILE:L:COL: error: ..." of a parse of one input line (L counts from 1
 * within it: a newline inside the line's text is impossible, but the
 * parser numbers what it sees), renumbered to the input's line. */
static void json_error_at(char *out, size_t n, const char *file, long line, const char *err) {
  size_t nf = strlen(file);
  char *end;
  long l = strncmp(err, file, nf) == 0 && err[nf] == ':' ? strtol(err + nf + 1, &end, 10) : 0;
  if (l >= 1) snprintf(out, n, "%s:%ld%s", file, line + l - 1, end);
  else snprintf(out, n, "%s:%ld: error: %s", file, line, err);
}

static int is_blank(const char *s, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (!strchr(" \t\r\n\f\v", s[k])) return 0;
  return 1;
}

/* One JSONL line: each key's string (or array of strings) is a document. */
static int encode_json_line(Round *r, Job *j, Arena *ar, const char *s, size_t n, long line) {
  const char *file = r->a->input;
  char err[512];
  TsJson *v = ts_json_parse(ar, s, n, file, err, sizeof err);
  if (!v) { json_error_at(j->err, sizeof j->err, file, line, err); return -1; }
  if (v->kind != TS_JSON_OBJECT)
    return ts_errf(j->err, sizeof j->err, "%s:%ld: error: %s, not a JSON object", file, line, ts_json_kind_name(v->kind));
  for (int k = 0; k < r->a->nkeys; k++) {
    const char *key = r->a->keys[k];
    const TsJson *x = ts_json_get(v, key);
    if (!x) return ts_errf(j->err, sizeof j->err, "%s:%ld: error: the object has no key \"%s\"", file, line, key);
    int ok = x->kind == TS_JSON_STRING || x->kind == TS_JSON_ARRAY, nseq = 0;
    for (int i = 0; x->kind == TS_JSON_ARRAY && i < x->n; i++) ok &= x->items[i]->kind == TS_JSON_STRING;
    if (!ok)
      return ts_errf(j->err, sizeof j->err, "%s:%ld: error: \"%s\" is %s, not a string (or an array of strings)", file,
                     line, key, x->kind == TS_JSON_ARRAY ? "an array holding a non-string" : ts_json_kind_name(x->kind));
    KeyOut *o = &j->out[k];
    int rc = 0;
    if (x->kind == TS_JSON_STRING) rc = add_sentence(r->t, o, x->str, strlen(x->str), &nseq);
    for (int i = 0; rc == 0 && x->kind == TS_JSON_ARRAY && i < x->n; i++)
      rc = add_sentence(r->t, o, x->items[i]->str, strlen(x->items[i]->str), &nseq);
    if (rc != 0) return ts_errf(j->err, sizeof j->err, "%s:%ld: error: cannot tokenize (out of memory or a sequence of 2^31 tokens)", file, line);
    end_document(r->t, o, nseq, r->a->append_eod);
  }
  return 0;
}

static void encode_job(Round *r, Job *j) {
  Arena ar;
  arena_init(&ar);
  for (int u = 0; u < job_units(j); u++) {
    const char *s = j->text.p + j->start.a[u];
    size_t n = j->start.a[u + 1] - j->start.a[u];
    if (r->a->nkeys) {
      int rc = encode_json_line(r, j, &ar, s, n, j->line.a[u]);
      arena_free(&ar);
      arena_init(&ar);
      if (rc != 0) break;
    } else {
      int nseq = 0;
      if (add_sentence(r->t, &j->out[0], s, n, &nseq) != 0) {
        ts_errf(j->err, sizeof j->err, "%s:%ld: error: cannot tokenize (out of memory or a document of 2^31 tokens)",
                r->a->input, j->line.a[u]);
        break;
      }
      end_document(r->t, &j->out[0], nseq, r->a->append_eod);
    }
  }
  arena_free(&ar);
}

static void *worker(void *p) {
  Round *r = p;
  int i;
  while ((i = atomic_fetch_add(&r->next, 1)) < r->njobs) encode_job(r, &r->jobs[i]);
  return NULL;
}

/* Tokenizes the round's jobs on a->workers threads (the main thread among
 * them). */
static void encode_round(Round *r) {
  int nt = r->a->workers < r->njobs ? r->a->workers : r->njobs;
  pthread_t th[256];
  int started = 0;
  atomic_store(&r->next, 0);
  for (int k = 1; k < nt; k++)
    if (pthread_create(&th[started], NULL, worker, r) == 0) started++;   /* fewer threads: slower, same output */
  worker(r);
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
}

/* ---- reading the input into jobs ---- */
/* A window over the input: lines are found with memchr in a buffer filled
 * by fread, so the input is streamed and a line is bounded (a file with no
 * newline, /dev/zero, is refused instead of filling memory). */
typedef struct {
  FILE *f;
  const char *path;
  size_t max;       /* bytes in a line or a document, at most */
  char *buf;
  size_t cap, pos, end;
  long line;        /* lines read */
  double bytes;     /* bytes read */
  int drained;      /* fread saw the end */
  int eof;          /* no more lines (the end, or err) */
  char err[512];
} Input;

static const char *take_line(Input *in, size_t len, size_t *n) {
  const char *s = in->buf + in->pos;
  in->pos += len;
  in->line++;
  in->bytes += (double)len;
  *n = len;
  return s;
}

/* The next line with its newline (the last may lack it), valid until the
 * next call; NULL at the end or on an error (in->err). */
static const char *next_line(Input *in, size_t *n) {
  for (;;) {
    char *nl = in->pos < in->end ? memchr(in->buf + in->pos, '\n', in->end - in->pos) : NULL;
    if (nl) return take_line(in, (size_t)(nl + 1 - (in->buf + in->pos)), n);
    size_t have = in->end - in->pos;
    if (in->drained) {
      if (have) return take_line(in, have, n);
      in->eof = 1;
      return NULL;
    }
    if (have && in->pos) memmove(in->buf, in->buf + in->pos, have);   /* the partial line to the front */
    in->pos = 0;
    in->end = have;
    if (have == in->cap) {
      if (in->cap >= in->max) {
        snprintf(in->err, sizeof in->err, "%s:%ld: error: a line longer than %zu MB (--max-document-mb)", in->path,
                 in->line + 1, in->max >> 20);
        in->eof = 1;
        return NULL;
      }
      in->cap = in->cap ? 2 * in->cap : 1 << 20;
      in->buf = ts_xrealloc(in->buf, in->cap);
    }
    size_t k = fread(in->buf + in->end, 1, in->cap - in->end, in->f);
    in->end += k;
    if (k == 0 && ferror(in->f)) {
      snprintf(in->err, sizeof in->err, "mprep: error: %s: cannot read: %s", in->path, strerror(errno));
      in->eof = 1;
      return NULL;
    }
    if (k == 0) in->drained = 1;
  }
}

static void unit_open(Job *j, long line) {
  if (!j->start.n) VEC_PUSH(j->start, j->text.n);
  VEC_PUSH(j->line, line);
}

static void unit_close(Job *j) { VEC_PUSH(j->start, j->text.n); }

/* Fills j with units until it holds BATCH_BYTES or the input ends.  A text
 * document open at the batch's end carries on in the batch (never split).
 * -1 with in->err on a read error or a document over in->max bytes. */
static int fill_job(Input *in, Job *j, int json) {
  int open = 0;
  size_t n, at = 0;   /* at: where the open document starts in j->text */
  const char *s;
  while (j->text.n < BATCH_BYTES || open) {
    if (!(s = next_line(in, &n))) break;
    int blank = is_blank(s, n);
    if (json) {
      if (blank) continue;
      unit_open(j, in->line);
      sb_write(&j->text, s, n);
      unit_close(j);
    } else if (blank) {
      if (open) unit_close(j);
      open = 0;
    } else {
      if (!open) unit_open(j, in->line), at = j->text.n;
      open = 1;
      sb_write(&j->text, s, n);
      if (j->text.n - at > in->max) {
        snprintf(in->err, sizeof in->err, "%s:%ld: error: the document that starts here is longer than %zu MB "
                 "(--max-document-mb; documents are separated by blank lines)", in->path, j->line.a[j->line.n - 1],
                 in->max >> 20);
        return -1;
      }
    }
  }
  if (open) unit_close(j);
  return in->err[0] ? -1 : 0;
}

/* ---- writing ---- */
typedef struct {
  RtIndexedWriter *w[MAX_KEYS];
  char *prefix[MAX_KEYS];
  long docs[MAX_KEYS], empty[MAX_KEYS];
  double seqs[MAX_KEYS], toks[MAX_KEYS];
} Out;

static int write_job(const Args *a, Out *o, const Job *j, int dtype) {
  char err[1024];
  int nk = a->nkeys ? a->nkeys : 1;
  for (int k = 0; k < nk; k++) {
    const KeyOut *ko = &j->out[k];
    size_t at = 0;
    int s = 0;
    for (int d = 0; d < ko->doc.n; d++) {
      for (int q = 0; q < ko->doc.a[d]; q++, s++) {
        if (rt_indexed_add(o->w[k], ko->ids.a + at, (size_t)ko->seq.a[s], err, sizeof err) != 0) {
          fprintf(stderr, "mprep: error: %s%s\n", err,
                  strstr(err, "does not fit") && dtype == RT_IDX_U16 ? " (use --dtype i32 or auto)" : "");
          return -1;
        }
        at += (size_t)ko->seq.a[s];
        o->toks[k] += ko->seq.a[s];
      }
      rt_indexed_end_doc(o->w[k]);
    }
    o->docs[k] += ko->doc.n;
    o->seqs[k] += ko->seq.n;
    o->empty[k] += ko->empty;
  }
  return 0;
}

static int open_outputs(const Args *a, Out *o, int dtype) {
  char err[1024];
  int nk = a->nkeys ? a->nkeys : 1;
  for (int k = 0; k < nk; k++) {
    size_t n = strlen(a->prefix) + (a->nkeys > 1 ? strlen(a->keys[k]) + 2 : 1);
    o->prefix[k] = ts_xmalloc(n);
    if (a->nkeys > 1) snprintf(o->prefix[k], n, "%s_%s", a->prefix, a->keys[k]);
    else snprintf(o->prefix[k], n, "%s", a->prefix);
    if (!(o->w[k] = rt_indexed_create(o->prefix[k], dtype, err, sizeof err))) {
      fprintf(stderr, "mprep: error: %s\n", err);
      return -1;
    }
  }
  return 0;
}

static void close_outputs(Out *o, int nk, int commit, int *rc) {
  char err[1024];
  for (int k = 0; k < nk; k++) {
    if (!o->w[k]) continue;
    if (commit && *rc == 0) {
      if (rt_indexed_finish(o->w[k], err, sizeof err) != 0) { fprintf(stderr, "mprep: error: %s\n", err); *rc = 1; }
    } else rt_indexed_abort(o->w[k]);
    o->w[k] = NULL;
  }
}

/* ---- the run ---- */
static void progress(const Args *a, const Input *in, const Out *o, double t0, double *last) {
  double now = ts_now_s();
  if (a->quiet || now - *last < 2) return;
  *last = now;
  fprintf(stderr, "mprep: %ld lines, %.1f MB read, %ld documents, %.0f tokens, %.1f MB/s\n", in->line,
          in->bytes / 1e6, o->docs[0], o->toks[0], in->bytes / 1e6 / (now - t0 + 1e-9));
}

static void summary(const Args *a, const Out *o, const Input *in, double secs, int dtype) {
  int nk = a->nkeys ? a->nkeys : 1;
  static const char *dn[] = {"?", "u8", "i8", "i16", "i32", "i64", "f64", "f32", "u16"};
  for (int k = 0; k < nk; k++)
    printf("mprep: %s.bin + .idx: %ld documents (%ld empty skipped), %.0f sequences, %.0f tokens (%s); "
           "%.2f MB in %.2f s, %.1f MB/s, %d worker%s\n",
           o->prefix[k], o->docs[k], o->empty[k], o->seqs[k], o->toks[k], dn[dtype], in->bytes / 1e6, secs,
           in->bytes / 1e6 / (secs > 1e-9 ? secs : 1e-9), a->workers, a->workers == 1 ? "" : "s");
}

static int run(const Args *a, const Tok *t, FILE *f) {
  int dtype = a->dtype ? a->dtype : rt_idx_dtype_for_vocab(t->vocab);
  int nk = a->nkeys ? a->nkeys : 1, rc = 0;
  Out o = {0};
  if (open_outputs(a, &o, dtype) != 0) { close_outputs(&o, nk, 0, &rc); rc = 1; goto done; }
  int njobs = a->workers * JOBS_PER_WORKER;
  Job *jobs = ts_xcalloc((size_t)njobs, sizeof *jobs);
  Input in = {.f = f, .path = a->input, .max = (size_t)a->max_mb << 20};
  double t0 = ts_now_s(), last = t0;
  while (rc == 0 && !in.eof) {
    Round r = {.a = a, .t = t, .jobs = jobs, .njobs = 0};
    while (r.njobs < njobs && !in.eof) {
      job_reset(&jobs[r.njobs], nk);
      if (fill_job(&in, &jobs[r.njobs], a->nkeys > 0) != 0) {
        fprintf(stderr, "%s\n", in.err);
        rc = 1;
        break;
      }
      r.njobs++;
    }
    if (rc) break;
    encode_round(&r);
    for (int i = 0; i < r.njobs && rc == 0; i++) {
      if (jobs[i].err[0]) { fprintf(stderr, "%s\n", jobs[i].err); rc = 1; }
      else if (write_job(a, &o, &jobs[i], dtype) != 0) rc = 1;
    }
    progress(a, &in, &o, t0, &last);
  }
  close_outputs(&o, nk, 1, &rc);
  if (rc == 0) summary(a, &o, &in, ts_now_s() - t0, dtype);
  for (int i = 0; i < njobs; i++) job_free(&jobs[i]);
  free(jobs);
  free(in.buf);
done:
  for (int k = 0; k < nk; k++) free(o.prefix[k]);
  return rc;
}

/* ---- options ---- */
static int parse_keys(Args *a, const char *v) {
  free(a->keys_buf);   /* a repeated --json-keys replaces the keys */
  a->nkeys = 0;
  char *s = a->keys_buf = ts_xstrdup(v), *save = NULL;
  for (char *k = strtok_r(s, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
    if (a->nkeys == MAX_KEYS) { fprintf(stderr, "mprep: --json-keys: at most %d keys\n", MAX_KEYS); return -1; }
    for (int i = 0; i < a->nkeys; i++)
      if (strcmp(a->keys[i], k) == 0) { fprintf(stderr, "mprep: --json-keys: '%s' twice\n", k); return -1; }
    a->keys[a->nkeys++] = k;
  }
  if (!a->nkeys) { fprintf(stderr, "mprep: --json-keys needs at least one key\n"); return -1; }
  return 0;
}

/* 0, -1 (usage error), 1 (--help). */
static int parse_args(Args *a, int argc, char **argv) {
  memset(a, 0, sizeof *a);
  a->workers = 1;
  a->max_mb = 1024;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *eq = strchr(o, '=');
    char name[64];
    snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - o) : (int)strlen(o), o);
    if (!strcmp(o, "-h") || !strcmp(o, "--help")) return 1;
    if (!strcmp(o, "--append-eod")) { a->append_eod = 1; continue; }
    if (!strcmp(o, "--quiet")) { a->quiet = 1; continue; }
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    int known = !strcmp(name, "--input") || !strcmp(name, "--output-prefix") || !strcmp(name, "--tokenizer") ||
                !strcmp(name, "--json-keys") || !strcmp(name, "--workers") || !strcmp(name, "--dtype") ||
                !strcmp(name, "--max-document-mb");
    if (!known) { fprintf(stderr, "mprep: unknown option '%s'\n%s", o, usage); return -1; }
    if (!v) { fprintf(stderr, "mprep: %s needs a value\n", name); return -1; }
    if (!strcmp(name, "--input")) a->input = v;
    else if (!strcmp(name, "--output-prefix")) a->prefix = v;
    else if (!strcmp(name, "--tokenizer")) a->tok_path = v;
    else if (!strcmp(name, "--json-keys")) { if (parse_keys(a, v) != 0) return -1; }
    else if (!strcmp(name, "--workers")) {
      char *end;
      long w = strtol(v, &end, 10);
      if (*end || end == v || w < 1 || w > 256) { fprintf(stderr, "mprep: --workers needs 1 to 256, got '%s'\n", v); return -1; }
      a->workers = (int)w;
    } else if (!strcmp(name, "--max-document-mb")) {
      char *end;
      long m = strtol(v, &end, 10);
      if (*end || end == v || m < 1 || m > 1024) {
        fprintf(stderr, "mprep: --max-document-mb needs 1 to 1024, got '%s'\n", v);
        return -1;
      }
      a->max_mb = m;
    } else if (!strcmp(v, "auto")) a->dtype = 0;
    else if (!strcmp(v, "u16")) a->dtype = RT_IDX_U16;
    else if (!strcmp(v, "i32")) a->dtype = RT_IDX_I32;
    else { fprintf(stderr, "mprep: --dtype is auto, u16 or i32, got '%s'\n", v); return -1; }
  }
  const char *missing = !a->input ? "--input" : !a->prefix ? "--output-prefix" : !a->tok_path ? "--tokenizer" : NULL;
  if (missing) { fprintf(stderr, "mprep: %s is required\n%s", missing, usage); return -1; }
  if (!*a->prefix) { fprintf(stderr, "mprep: --output-prefix is empty\n"); return -1; }
  return 0;
}

static FILE *open_input(const char *path) {
  if (strcmp(path, "-") == 0) return stdin;
  FILE *f = fopen(path, "rb");
  struct stat st;
  if (f && fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { fclose(f); f = NULL; errno = EISDIR; }
  if (!f) { fprintf(stderr, "mprep: error: %s: cannot read: %s\n", path, strerror(errno)); return NULL; }
  ts_note_input(path);   /* no output may replace it */
  return f;
}

int main(int argc, char **argv) {
  ts_check_stdout_at_exit("mprep");
  Args a;
  int p = parse_args(&a, argc, argv);
  int rc = p == 1 ? 0 : p != 0 ? 2 : 1;
  Tok t = {0};
  FILE *f = NULL;
  if (p == 1) fputs(usage, stdout);
  else if (p == 0 && tok_load(&t, &a) == 0 && (f = open_input(a.input))) rc = run(&a, &t, f);
  if (f && f != stdin) fclose(f);
  if (t.bpe) rt_tok_free(t.bpe);
  free(a.keys_buf);
  return rc;
}
