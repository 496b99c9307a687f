/* ckpt.c - distributed checkpoints (mrun --save / --load; the on-disk
 * format is docs/checkpoints.md).
 *
 * A checkpoint of step K is the directory DIR/iter_<K, 7 digits>:
 *   rank_<world rank, 5 digits>.bin   every state of that rank's program
 *                                      (a walk over the program's states:
 *                                      parameters, gradients, optimizer
 *                                      moments, whatever passes add), each
 *                                      with its own 64-bit hash;
 *   rank_<world rank>.idx             the same states described in text
 *                                      (global shape, the shard's offsets);
 *   metadata.json                     written by world rank 0 from the
 *                                      .idx files: every tensor, its global
 *                                      shape and dtype, each shard's rank,
 *                                      file, byte range and global offsets;
 *                                      the layout; the step; a model hash.
 * Everything is written into DIR/iter_K.tmp (every file fsync'd), which
 * rank 0 renames to DIR/iter_K once all ranks have written theirs; DIR/latest
 * ("iter_K") is replaced last, atomically.  A kill at any point leaves
 * either the previous `latest` or the new one, each complete.
 *
 * Nothing else is needed to resume exactly: the data windows, dropout masks
 * and the learning rate are functions of (seed, step, row / micro batch),
 * so the step is the whole position (runtime/exec/train.h). */
#include "train.h"
#include "rt_priv.h"
#include "runtime/comm/comm.h"
#include "ckpt_index.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_MAGIC "TSCKPT01"
#define CK_VERSION 1u

static const char *kind_name(IrStateKind k) {
  return (unsigned)k < IR_STATE_KIND_COUNT ? ir_state_kind_name(k) : "state";
}

/* Fault injection for the kill tests (tests/ckpt): with
 * TS_FAULT_CKPT_RANK=R (default 0) and TS_FAULT_CKPT_KILL=K, world rank R
 * SIGKILLs itself at the K-th point of its saves (points counted from 1
 * over the whole run): before a save, after each step of it (the .tmp
 * directory made, each file written, the metadata, the rename, `latest`,
 * the --keep cleanup), and once in the middle of its shard file (a part of
 * it written straight to its final name). */
static int fault_at(int wr) {
  static long long count;
  const char *k = getenv("TS_FAULT_CKPT_KILL"), *r = getenv("TS_FAULT_CKPT_RANK");
  if (!k || (r ? atoi(r) : 0) != wr) return 0;
  return ++count == atoll(k);
}
static void fault_point(int wr, const char *where) {
  if (!fault_at(wr)) return;
  fprintf(stderr, "rank %d: TS_FAULT_CKPT_KILL: killing myself %s\n", wr, where);
  raise(SIGKILL);
}

static void put_u32(StrBuf *b, uint32_t v) { sb_write(b, &v, 4); }
static void put_u64(StrBuf *b, uint64_t v) { sb_write(b, &v, 8); }

static int world_rank(RtComm *w) { return w ? rt_comm_world_rank(w) : 0; }

/* fsync of a directory (the renames and new names in it) */
static int sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

/* rm -r of a directory of plain files (a checkpoint: no subdirectories) */
static int remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -1;
  struct dirent *e;
  char path[8192];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  return rmdir(dir);
}

/* The block of the global tensor that the local value of state s holds on
 * rank r: per dim, the block index over the dim's split axes (outermost axis
 * first, as params.c gathers them) times the local size.  A ZeRO-flat state
 * (the optimizer moments) is a chunk of the flattened local tensor of its
 * parameter: its offsets are the parameter's, and *flat_index / *flat_count
 * say which chunk. */
/* ZeRO-3 (pass zero3): a sharded parameter holds nothing and is not
 * saved; its shard state is saved under the parameter's name and kind, a
 * flat chunk of the parameter's block like a ZeRO moment, so checkpoints
 * load across --zero 1 / 3 and any dp like every other state. */
static int ck_skip(const IrState *s) { return s->kind == IR_STATE_PARAM && (s->flags & IR_STATE_SHARDED); }
static const char *ck_name(const IrModule *m, const IrState *s) {
  return s->kind == IR_STATE_SHARD && s->of >= 0 && s->of < m->states.n ? m->states.a[s->of].name : s->name;
}
static int ck_kind(const IrState *s) { return s->kind == IR_STATE_SHARD ? IR_STATE_PARAM : (int)s->kind; }
static int ck_nsaved(const IrModule *m) {
  int n = 0;
  for (int s = 0; s < m->states.n; s++) n += !ck_skip(&m->states.a[s]);
  return n;
}

/* The state whose local shape is s's block: its parameter for a ZeRO-flat
 * state, else s itself. */
static const IrState *block_state(const IrModule *m, const IrState *s) {
  return s->sh.flat && s->of >= 0 && s->of < m->states.n ? &m->states.a[s->of] : s;
}

static void shard_of(const IrModule *m, const RtRank *r, const IrState *s, int64_t *gdim, int64_t *off,
                     int *flat_index, int *flat_count) {
  const IrState *b = block_state(m, s);
  *flat_index = 0;
  *flat_count = 1;
  if (b != s) {
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (s->sh.flat & (1u << a)) {
        int n = r ? rt_rank_axis_size(r, (IrAxis)a) : 1;
        *flat_index = *flat_index * n + (r ? r->coord[a] : 0);
        *flat_count *= n;
      }
  }
  for (int d = 0; d < b->type.rank; d++) {
    int64_t blk = 0, n = 1;
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (b->sh.split[d] & (1u << a)) {
        int k = r ? rt_rank_axis_size(r, (IrAxis)a) : 1;
        blk = blk * k + (r ? r->coord[a] : 0);
        n *= k;
      }
    off[d] = blk * b->type.dim[d];
    gdim[d] = b->type.dim[d] * n;
    if (b->logical[d] > 0) gdim[d] = b->logical[d];   /* the model's size; padding past it */
  }
}

/* This rank's shard file and its text index, into dir; the states' values
 * from data[s] (an asynchronous save's copies), or the program's own memory
 * when data is NULL.  Touches nothing but the files, the module (read) and
 * data: it runs on the writer thread of an asynchronous save. */
static int write_rank(RtProgram *p, const RtRank *r, const char *dir, int wr, int64_t step, void *const *data_of,
                      char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  /* bin: the headers only; the file is written from them and the states'
   * own memory, piece by piece (nothing copied) */
  StrBuf bin = {0}, idx = {0};
  size_t *hdr_end = ts_xmalloc((size_t)(m->states.n + 1) * sizeof *hdr_end), data_total = 0;
  sb_write(&bin, CK_MAGIC, 8);
  put_u32(&bin, CK_VERSION);
  put_u32(&bin, (uint32_t)ck_nsaved(m));
  put_u64(&bin, (uint64_t)step);
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    hdr_end[s] = bin.n;
    if (ck_skip(st)) continue;
    size_t nbytes = (size_t)ir_type_numel(&st->type) * ir_dtype_size(st->type.dtype);
    const void *data = data_of ? data_of[s] : rt_state_data(p, s);
    uint64_t h = ts_hash64(data, nbytes, 0);
    const char *name = ck_name(m, st);
    size_t nl = strlen(name);
    put_u32(&bin, (uint32_t)nl);
    sb_write(&bin, name, nl);
    put_u32(&bin, (uint32_t)ck_kind(st));
    put_u32(&bin, (uint32_t)st->type.dtype);
    put_u32(&bin, (uint32_t)st->type.rank);
    for (int d = 0; d < st->type.rank; d++) put_u64(&bin, (uint64_t)st->type.dim[d]);
    put_u64(&bin, (uint64_t)nbytes);
    put_u64(&bin, h);
    size_t at = bin.n + data_total;
    hdr_end[s] = bin.n;
    data_total += nbytes;
    int64_t gdim[IR_MAX_RANK], off[IR_MAX_RANK];
    int fi, fc;
    shard_of(m, r, st, gdim, off, &fi, &fc);
    const IrState *b = block_state(m, st);
    CkShard e = {(char *)name, ck_kind(st), (int)st->type.dtype, b->type.rank, st->type.rank, fi, fc,
                 st->sh.partial, wr, {0}, {0}, {0}, {0}, at, nbytes, h};
    memcpy(e.global, gdim, sizeof e.global);
    memcpy(e.off, off, sizeof e.off);
    memcpy(e.block, b->type.dim, sizeof e.block);
    memcpy(e.shape, st->type.dim, sizeof e.shape);
    ck_shard_print(&idx, &e);
  }
  char path[8192];
  int rc = 0;
  snprintf(path, sizeof path, "%s/rank_%05d.bin", dir, wr);
  if (fault_at(wr)) {   /* a torn shard file: half of it, then the kill */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0 && write(fd, bin.p, bin.n / 2) >= 0) fsync(fd);   /* some headers: the file ends early */
    fprintf(stderr, "rank %d: TS_FAULT_CKPT_KILL: killing myself inside %s\n", wr, path);
    raise(SIGKILL);
  }
  TsPiece *pc = ts_xmalloc((size_t)(2 * m->states.n + 1) * sizeof *pc);
  int npc = 0;
  size_t from = 0;
  for (int s = 0; s < m->states.n; s++) {
    if (ck_skip(&m->states.a[s])) continue;
    pc[npc++] = (TsPiece){bin.p + from, hdr_end[s] - from};
    pc[npc++] = (TsPiece){data_of ? data_of[s] : rt_state_data(p, s),
                          (size_t)ir_type_numel(&m->states.a[s].type) * ir_dtype_size(m->states.a[s].type.dtype)};
    from = hdr_end[s];
  }
  pc[npc++] = (TsPiece){bin.p + from, bin.n - from};
  if (ts_write_pieces(path, pc, npc) != 0) rc = ts_errf(err, errlen, "%s", ts_io_error());
  free(pc);
  free(hdr_end);
  fault_point(wr, "after writing its shard file");
  snprintf(path, sizeof path, "%s/rank_%05d.idx", dir, wr);
  if (rc == 0 && ts_write_file(path, idx.p ? idx.p : "", idx.n) != 0) rc = ts_errf(err, errlen, "%s", ts_io_error());
  fault_point(wr, "after writing its index");
  sb_free(&bin);
  sb_free(&idx);
  return rc;
}

/* Every rank's index of checkpoint directory ck, in rank order, sorted. */
static int index_read(const char *ck, int nranks, CkIndex *x, char *err, size_t errlen) {
  memset(x, 0, sizeof *x);
  char path[8192];
  for (int k = 0; k < nranks; k++) {
    snprintf(path, sizeof path, "%s/rank_%05d.idx", ck, k);
    size_t len = 0;
    char *text = ts_read_input_max(path, (size_t)1 << 30, &len);
    if (!text) return ts_errf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    int rc = strlen(text) != len ? ts_errf(err, errlen, "'%s' is corrupted: it holds a NUL byte", path)
                                 : ck_index_add_text(x, text, k, path, err, errlen);
    free(text);
    if (rc) return rc;
  }
  ck_index_sort(x);
  return 0;
}

/* metadata.json from the ranks' .idx files (world rank 0). */
static int write_metadata(const char *dir, const IrModule *m, const RtRank *r, int nranks, int64_t step,
                          int64_t consumed, char *err, size_t errlen) {
  CkIndex x;
  int rc = index_read(dir, nranks, &x, err, errlen);
  if (rc) { ck_index_free(&x); return rc; }
  /* the tensors in order of first appearance (rank 0's first), each with its shards in rank order */
  int *grp = ts_xmalloc((size_t)(x.n + 1) * sizeof *grp), ng = 0;
  for (int i = 0; i < x.n; i++)
    if (i == 0 || strcmp(x.a[x.ord[i]].name, x.a[x.ord[i - 1]].name)) grp[ng++] = i;
  for (int i = 1; i < ng; i++)   /* by the position of the first shard */
    for (int k = i; k > 0 && x.ord[grp[k - 1]] > x.ord[grp[k]]; k--) {
      int t = grp[k];
      grp[k] = grp[k - 1];
      grp[k - 1] = t;
    }
  uint64_t hash = 0x6d6f64656cULL;   /* the model: every tensor's name, kind, dtype, global shape */
  StrBuf j = {0}, h = {0};
  sb_printf(&j, "{\n  \"format\": \"tessera-checkpoint\",\n  \"version\": %u,\n  \"step\": %lld,\n", CK_VERSION,
            (long long)step);
  sb_printf(&j, "  \"consumed_samples\": %lld,\n", (long long)consumed);
  sb_printf(&j, "  \"model\": \"%s\",\n", m->name ? m->name : "");
  sb_printf(&j, "  \"mesh\": {\"dp\": %d, \"pp\": %d, \"cp\": %d, \"ep\": %d, \"tp\": %d},\n", rt_rank_axis_size(r, IR_AXIS_DP),
            rt_rank_axis_size(r, IR_AXIS_PP), rt_rank_axis_size(r, IR_AXIS_CP), rt_rank_axis_size(r, IR_AXIS_EP), rt_rank_axis_size(r, IR_AXIS_TP));
  sb_printf(&j, "  \"layout\": {\"sp\": %d, \"zero\": %d, \"vpp\": %d},\n", m->par.sp, m->par.zero,
            m->par.vpp > 0 ? m->par.vpp : 1);
  sb_printf(&j, "  \"ranks\": %d,\n  \"tensors\": [", nranks);
  for (int g = 0; g < ng; g++) {
    const CkShard *t = &x.a[x.ord[grp[g]]];
    h.n = 0;
    ck_shard_head(&h, t);
    hash = ts_hash64(h.p, h.n, hash);
    sb_printf(&j, "%s\n    {\"name\": \"%s\", \"kind\": \"%s\", \"dtype\": \"%s\", \"global_shape\": ", g ? "," : "", t->name,
              kind_name((IrStateKind)t->kind), ir_dtype_name((IrDtype)t->dtype));
    ck_dims_text(&j, t->global, t->rank);
    sb_puts(&j, ", \"shards\": [");
    for (int i = grp[g]; i < x.n && !strcmp(x.a[x.ord[i]].name, t->name); i++) {
      const CkShard *e = &x.a[x.ord[i]];
      sb_printf(&j, "%s\n      {\"rank\": %d, \"file\": \"rank_%05d.bin\", \"at\": %zu, \"bytes\": %zu, \"hash\": \"%016llx\", "
                "\"offsets\": ", i > grp[g] ? "," : "", e->owner, e->owner, e->at, e->bytes, (unsigned long long)e->hash);
      ck_dims_text(&j, e->off, e->rank);
      sb_puts(&j, ", \"shape\": ");
      ck_dims_text(&j, e->shape, e->lrank);
      sb_puts(&j, ", \"block\": ");
      ck_dims_text(&j, e->block, e->rank);
      sb_printf(&j, ", \"flat\": [%d, %d], \"partial\": [", e->fi, e->fc);
      for (int a = 0, np = 0; a < IR_AXIS_COUNT; a++)
        if (e->partial & (1u << a)) sb_printf(&j, "%s\"%s\"", np++ ? ", " : "", ir_axis_name((IrAxis)a));
      sb_puts(&j, "]}");
    }
    sb_puts(&j, "\n    ]}");
  }
  sb_printf(&j, "\n  ],\n  \"model_hash\": \"%016llx\"\n}\n", (unsigned long long)hash);
  char path[8192];
  snprintf(path, sizeof path, "%s/metadata.json", dir);
  if (ts_write_file(path, j.p, j.n) != 0) rc = ts_errf(err, errlen, "%s", ts_io_error());
  sb_free(&j);
  sb_free(&h);
  free(grp);
  ck_index_free(&x);
  return rc;
}

/* Steps of the checkpoints in dir (iter_NNNNNNN), ascending. */
static int list_iters(const char *dir, int64_t **out) {
  DIR *d = opendir(dir);
  int n = 0, cap = 0;
  *out = NULL;
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long k;
    char tail;
    if (sscanf(e->d_name, "iter_%lld%c", &k, &tail) != 1 || strlen(e->d_name) != 12) continue;
    if (n == cap) { cap = cap ? 2 * cap : 16; *out = ts_xrealloc(*out, (size_t)cap * sizeof **out); }
    (*out)[n++] = k;
  }
  closedir(d);
  for (int i = 1; i < n; i++)   /* insertion sort: a handful of entries */
    for (int k = i; k > 0 && (*out)[k - 1] > (*out)[k]; k--) {
      int64_t t = (*out)[k];
      (*out)[k] = (*out)[k - 1];
      (*out)[k - 1] = t;
    }
  return n;
}

/* A save's first phase (collective): world rank 0 makes DIR/iter_K.tmp (a
 * .tmp left by a killed save is removed).  1 if it failed anywhere. */
static int save_begin(RtComm *world, const RtCkptOpts *o, int64_t step, char *why, size_t n) {
  int wr = world_rank(world), bad = 0;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s/iter_%07lld.tmp", o->save_dir, (long long)step);
  fault_point(wr, "before a save");
  if (wr == 0) {
    if (mkdir(o->save_dir, 0777) != 0 && errno != EEXIST)
      bad = ts_errf(why, n, "--save: cannot create '%s': %s", o->save_dir, strerror(errno)) != 0;
    else if (remove_dir(tmp) != 0 || mkdir(tmp, 0777) != 0)
      bad = ts_errf(why, n, "--save: cannot create '%s': %s", tmp, strerror(errno)) != 0;
  }
  if (rt_any_failed(world, bad, NULL, why, n)) return 1;
  fault_point(wr, "after making the .tmp directory");
  return 0;
}

/* The last phase (collective), once every rank has written its files (bad:
 * this rank could not): world rank 0 writes metadata.json, renames the
 * .tmp, points `latest` at it and applies --keep.  1 if it failed anywhere. */
static int save_end(RtProgram *p, RtComm *world, const RtCkptOpts *o, int64_t step, int bad, char *why, size_t n) {
  int wr = world_rank(world), nranks = world ? rt_comm_size(world) : 1;
  if (rt_any_failed(world, bad, NULL, why, n)) return 1;
  if (wr == 0) {
    char tmp[4096], fin[4096], latest[4096], text[64];
    snprintf(tmp, sizeof tmp, "%s/iter_%07lld.tmp", o->save_dir, (long long)step);
    snprintf(fin, sizeof fin, "%s/iter_%07lld", o->save_dir, (long long)step);
    snprintf(latest, sizeof latest, "%s/latest", o->save_dir);
    snprintf(text, sizeof text, "iter_%07lld\n", (long long)step);
    if (write_metadata(tmp, rt_program_module(p), rt_program_rank(p), nranks, step, rt_samples_before(p, step), why, n) != 0) bad = 1;
    else if (fault_point(wr, "after writing metadata.json"), sync_dir(tmp) != 0 || remove_dir(fin) != 0 ||
             rename(tmp, fin) != 0 || sync_dir(o->save_dir) != 0)
      bad = ts_errf(why, n, "--save: cannot rename '%s' to '%s': %s", tmp, fin, strerror(errno)) != 0;
    else if (fault_point(wr, "between the rename and latest"), ts_write_file(latest, text, strlen(text)) != 0)
      bad = ts_errf(why, n, "--save: %s", ts_io_error()) != 0;
    if (!bad) fault_point(wr, "after writing latest");
    if (!bad && o->keep > 0) {   /* the newest K; never the one just written */
      int64_t *its;
      int k = list_iters(o->save_dir, &its);
      for (int i = 0; i + o->keep < k; i++) {
        if (its[i] == step) continue;
        char old[4096];
        snprintf(old, sizeof old, "%s/iter_%07lld", o->save_dir, (long long)its[i]);
        remove_dir(old);
      }
      free(its);
      fault_point(wr, "after the --keep cleanup");
    }
  }
  return rt_any_failed(world, bad, NULL, why, n);
}

static int save_failed(int64_t step, char *why, char *err, size_t errlen) {
  if (!why[0]) strcpy(why, "another rank could not write its part of the checkpoint");
  return ts_errf(err, errlen, "checkpoint of step %lld: %s", (long long)step, why);
}

int rt_ckpt_save(RtProgram *p, RtComm *world, const RtCkptOpts *o, int64_t step, char *err, size_t errlen) {
  char tmp[4096], why[2048] = "";
  snprintf(tmp, sizeof tmp, "%s/iter_%07lld.tmp", o->save_dir, (long long)step);
  if (save_begin(world, o, step, why, sizeof why)) return save_failed(step, why, err, errlen);
  int bad = rt_program_sync_states(p, why, sizeof why) != 0 ||
            write_rank(p, rt_program_rank(p), tmp, world_rank(world), step, NULL, why, sizeof why) != 0;
  if (save_end(p, world, o, step, bad, why, sizeof why)) return save_failed(step, why, err, errlen);
  return 0;
}

/* ---- asynchronous saves (--async-save) ----
 * The states are copied to host buffers (allocated at the first save, kept)
 * and a thread writes this rank's files from them while training goes on;
 * the save's last phase, which is collective, runs on the training thread
 * at the first step boundary where every rank's thread is done, else at
 * the next save or at the end (rt_ckpt_finish).  Only the copy stalls
 * training, unless the previous save is still being written. */
struct RtCkptWriter {
  pthread_t thread;
  int running;          /* 1: a thread was started (not joined yet); -1: written here; 0: nothing pending */
  int done;             /* the thread has written its files (atomic) */
  void **copy;          /* per state */
  int ncopy;
  RtProgram *p;
  int wr;
  int64_t step;
  char dir[4096];
  int rc;
  char err[2048];
};

RtCkptWriter *rt_ckpt_writer_new(void) { return ts_xcalloc(1, sizeof(RtCkptWriter)); }

static void *writer_main(void *arg) {
  RtCkptWriter *w = arg;
  w->rc = write_rank(w->p, rt_program_rank(w->p), w->dir, w->wr, w->step, w->copy, w->err, sizeof w->err);
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

int rt_ckpt_writer_pending(const RtCkptWriter *w) { return w && w->running != 0; }
int rt_ckpt_writer_busy(const RtCkptWriter *w) {
  return w && w->running > 0 && !__atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
}

int rt_ckpt_save_async(RtCkptWriter *w, RtProgram *p, RtComm *world, const RtCkptOpts *o, int64_t step, double *copy_s,
                       char *err, size_t errlen) {
  *copy_s = 0;
  if (rt_ckpt_finish(w, world, o, err, errlen) != 0) return -1;
  char why[2048] = "";
  if (save_begin(world, o, step, why, sizeof why)) return save_failed(step, why, err, errlen);
  const IrModule *m = rt_program_module(p);
  double t0 = ts_now_s();
  if (rt_program_sync_states(p, why, sizeof why) != 0) {
    save_end(p, world, o, step, 1, why, sizeof why);
    return save_failed(step, why, err, errlen);
  }
  if (!w->copy) {
    w->ncopy = m->states.n;
    w->copy = ts_xcalloc((size_t)(w->ncopy ? w->ncopy : 1), sizeof *w->copy);
    for (int s = 0; s < w->ncopy; s++)
      w->copy[s] = ts_xmalloc(ir_state_bytes(&m->states.a[s]) + 1);
  }
  for (int s = 0; s < w->ncopy; s++)   /* (a ZeRO-3 sharded parameter: nothing, its shard holds it) */
    memcpy(w->copy[s], rt_state_data(p, s), ir_state_bytes(&m->states.a[s]));
  *copy_s = ts_now_s() - t0;
  w->p = p;
  w->wr = world_rank(world);
  w->step = step;
  w->rc = 0;
  w->err[0] = 0;
  __atomic_store_n(&w->done, 0, __ATOMIC_RELEASE);
  snprintf(w->dir, sizeof w->dir, "%s/iter_%07lld.tmp", o->save_dir, (long long)step);
  if (pthread_create(&w->thread, NULL, writer_main, w) != 0) writer_main(w);   /* no thread: written here */
  else w->running = 1;
  if (!w->running) w->running = -1;   /* written already; its last phase is still to run */
  return 0;
}

int rt_ckpt_finish(RtCkptWriter *w, RtComm *world, const RtCkptOpts *o, char *err, size_t errlen) {
  if (!w || !w->running) return 0;
  if (w->running > 0) pthread_join(w->thread, NULL);
  w->running = 0;
  char why[2048];
  snprintf(why, sizeof why, "%s", w->rc ? w->err : "");
  if (save_end(w->p, world, o, w->step, w->rc != 0, why, sizeof why)) return save_failed(w->step, why, err, errlen);
  return 0;
}

void rt_ckpt_writer_free(RtCkptWriter *w) {
  if (!w) return;
  if (w->running > 0) pthread_join(w->thread, NULL);   /* a failed run: the .tmp stays, never chosen */
  for (int s = 0; s < w->ncopy; s++) free(w->copy[s]);
  free(w->copy);
  free(w);
}

/* ---- loading ---- */

/* The checkpoint directory --load names: DIR itself when it holds a
 * metadata.json, else DIR/<the iter named by DIR/latest>. */
static int resolve_load(const char *dir, char *out, size_t n, char *err, size_t errlen) {
  char path[8192];
  struct stat st;
  if (stat(dir, &st) != 0)
    return ts_errf(err, errlen, "--load: cannot read '%s': %s (give the --save directory of an earlier run)", dir,
                   strerror(errno));
  if (!S_ISDIR(st.st_mode)) return ts_errf(err, errlen, "--load: '%s' is not a directory", dir);
  snprintf(path, sizeof path, "%s/metadata.json", dir);
  if (stat(path, &st) == 0) { snprintf(out, n, "%s", dir); return 0; }
  snprintf(path, sizeof path, "%s/latest", dir);
  size_t len = 0;
  char *text = ts_read_file_max(path, 64, &len);
  if (!text) return ts_errf(err, errlen, "--load: '%s' has no checkpoint ('%s': %s)", dir, path, strerror(errno));
  long long k;
  char tail = 0;
  int ok = sscanf(text, "iter_%lld%c", &k, &tail) >= 1 && (tail == '\n' || tail == 0) && k >= 0;
  free(text);
  if (!ok) return ts_errf(err, errlen, "--load: '%s' does not name a checkpoint (expected iter_NNNNNNN)", path);
  snprintf(out, n, "%s/iter_%07lld", dir, k);
  if (stat(out, &st) != 0) return ts_errf(err, errlen, "--load: '%s' names '%s', which is missing", path, out);
  return 0;
}

/* The value of "key": N in the metadata text (our own writer's layout). */
static int meta_int(const char *text, const char *key, long long *v) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *s = strstr(text, pat);
  return s && sscanf(s + strlen(pat), "%lld", v) == 1 ? 0 : -1;
}

static uint32_t get_u32(const char *b, size_t *pos) { uint32_t v; memcpy(&v, b + *pos, 4); *pos += 4; return v; }
static uint64_t get_u64(const char *b, size_t *pos) { uint64_t v; memcpy(&v, b + *pos, 8); *pos += 8; return v; }

/* A shard file, mapped (not read: it is as large as the rank's states),
 * its header checked: magic, version, the step.  NULL with a message. */
static char *map_shard_file(const char *path, int64_t step, size_t *len_out, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  struct stat fst;
  if (fd < 0 || fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
    int e = fd < 0 ? errno : EINVAL;
    if (fd >= 0) close(fd);
    ts_errf(err, errlen, "cannot read '%s': %s", path, strerror(e));
    return NULL;
  }
  size_t len = (size_t)fst.st_size, pos = 8;
  char *b = len >= 24 ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (len < 24) { ts_errf(err, errlen, "'%s' is truncated (%zu bytes)", path, len); return NULL; }
  if (b == MAP_FAILED) { ts_errf(err, errlen, "cannot map '%s': %s", path, strerror(errno)); return NULL; }
  ts_note_input(path);
  uint32_t ver = get_u32(b, &pos);
  pos += 4;
  uint64_t fstep = get_u64(b, &pos);
  const char *why = NULL;
  if (memcmp(b, CK_MAGIC, 8) != 0) why = "is not a Tessera checkpoint shard";
  else if (ver != CK_VERSION) ts_errf(err, errlen, "'%s' has format version %u; this mrun reads %u", path, ver, CK_VERSION);
  else if ((int64_t)fstep != step)
    ts_errf(err, errlen, "'%s' is of step %llu, its metadata says %lld", path, (unsigned long long)fstep, (long long)step);
  else { *len_out = len; return b; }
  if (why) ts_errf(err, errlen, "'%s' %s", path, why);
  munmap(b, len);
  return NULL;
}

/* Reads this rank's shard file into the program's states (the checkpoint
 * was saved in this layout: its index says the file holds exactly the
 * program's states, so a file that does not is not the one saved with
 * that index). */
static int read_rank(RtProgram *p, const char *path, int64_t step, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  size_t len = 0, pos = 12;   /* the tensor count, after magic and version */
  char *b = map_shard_file(path, step, &len, err, errlen);
  if (!b) return -1;
  int rc = 0;
  unsigned char *got = ts_xcalloc((size_t)(m->states.n ? m->states.n : 1), 1);
#define NEED(k) do { if (len - pos < (size_t)(k)) { rc = ts_errf(err, errlen, "'%s' is truncated (at byte %zu of %zu)", path, pos, len); goto out; } } while (0)
  uint32_t n = get_u32(b, &pos);
  pos = 24;
  for (uint32_t i = 0; i < n; i++) {
    NEED(4);
    uint32_t nl = get_u32(b, &pos);
    NEED((size_t)nl + 12);
    char name[1024];
    snprintf(name, sizeof name, "%.*s", (int)(nl < 1023 ? nl : 1023), b + pos);
    pos += nl;
    uint32_t kind = get_u32(b, &pos), dt = get_u32(b, &pos), rank = get_u32(b, &pos);
    if (rank > IR_MAX_RANK) { rc = ts_errf(err, errlen, "'%s' is corrupted: tensor '%s' has rank %u", path, name, rank); goto out; }
    NEED((size_t)rank * 8 + 16);
    int64_t dim[IR_MAX_RANK];
    for (uint32_t d = 0; d < rank; d++) dim[d] = (int64_t)get_u64(b, &pos);
    uint64_t nbytes = get_u64(b, &pos), h = get_u64(b, &pos);
    NEED(nbytes);
    int s = ir_state_find(m, name);
    if (s >= 0 && ck_skip(&m->states.a[s])) s = ir_state_shard_of(m, s);   /* ZeRO-3: its shard */
    const IrState *st = s >= 0 ? &m->states.a[s] : NULL;
    int same = st && (uint32_t)ck_kind(st) == kind && (uint32_t)st->type.dtype == dt && (uint32_t)st->type.rank == rank;
    for (uint32_t d = 0; same && d < rank; d++) same = st->type.dim[d] == dim[d];
    if (!same) {
      char have[128] = "", want[128] = "";
      IrType t = {0};
      t.dtype = (IrDtype)dt;
      t.rank = (int)rank;
      for (uint32_t d = 0; d < rank; d++) t.dim[d] = dim[d];
      ir_type_str(&t, have, sizeof have);
      if (st) ir_type_str(&st->type, want, sizeof want);
      /* the index beside the file matched this program (index_is_mine),
       * so the file itself is not what was saved with it */
      rc = ts_errf(err, errlen, "'%s' does not match its index (.idx), which fits this program: tensor '%s' is %s %s "
                   "in the file, %s%s%s in the index: the file is from another checkpoint or was replaced; restore the "
                   "checkpoint directory as it was saved", path, name, kind_name((IrStateKind)kind), have,
                   st ? kind_name((IrStateKind)ck_kind(st)) : "not", st ? " " : "", st ? want : "");
      goto out;
    }
    if (ts_hash64(b + pos, nbytes, 0) != h) {
      rc = ts_errf(err, errlen, "'%s' is corrupted: tensor '%s' does not match its hash", path, name);
      goto out;
    }
    memcpy(rt_state_data(p, s), b + pos, nbytes);
    got[s] = 1;
    pos += nbytes;
  }
  if (pos != len) { rc = ts_errf(err, errlen, "'%s' is corrupted: %zu bytes after its last tensor", path, len - pos); goto out; }
  for (int s = 0; s < m->states.n; s++)
    if (!got[s] && !ck_skip(&m->states.a[s])) {
      rc = ts_errf(err, errlen, "'%s' does not match its index (.idx), which fits this program: it lacks tensor '%s' "
                   "the index lists: the file is from another checkpoint or was replaced; restore the checkpoint "
                   "directory as it was saved", path, m->states.a[s].name);
      goto out;
    }
#undef NEED
out:
  free(got);
  munmap(b, len);
  return rc;
}

/* ---- loading into another layout (resharding) ----
 * Every state of this rank is assembled from the saved shards of the same
 * name, whatever layout wrote them: the block of the global tensor the
 * state holds here (shard_of) is filled from every saved block that
 * overlaps it, the ZeRO chunks of a saved block read as one; the padding
 * past the model's size is zero; a flat (ZeRO) state takes its chunk of
 * the assembled block.  Values that are partial sums (gradients between
 * micro batches) are zero at every step boundary; they load as zero, and a
 * checkpoint whose partial sums are not zero is refused. */

/* The saved shard files, each mapped when first needed; each shard's hash
 * checked the first time it is read. */
typedef struct CkFiles {
  const char *ck;
  int64_t step;
  char **map;
  size_t *len;
  unsigned char *checked;   /* per shard of the index */
} CkFiles;

static const char *shard_bytes(CkFiles *f, const CkIndex *x, int i, char *err, size_t errlen) {
  const CkShard *e = &x->a[i];
  char path[8192];
  snprintf(path, sizeof path, "%s/rank_%05d.bin", f->ck, e->owner);
  if (!f->map[e->owner] && !(f->map[e->owner] = map_shard_file(path, f->step, &f->len[e->owner], err, errlen)))
    return NULL;
  size_t len = f->len[e->owner];
  if (e->at > len || e->bytes > len - e->at) {
    ts_errf(err, errlen, "'%s' is truncated: tensor '%s' would end at byte %zu of %zu", path, e->name, e->at + e->bytes, len);
    return NULL;
  }
  const char *d = f->map[e->owner] + e->at;
  if (!f->checked[i] && ts_hash64(d, e->bytes, 0) != e->hash) {
    ts_errf(err, errlen, "'%s' is corrupted: tensor '%s' does not match its hash", path, e->name);
    return NULL;
  }
  f->checked[i] = 1;
  return d;
}

/* A saved block of a global tensor: its offsets and shape, its values as
 * nchunk chunks of csize values each (one chunk unless it is ZeRO-flat). */
typedef struct CkBlock {
  int rank;
  const int64_t *off, *shape;
  int64_t csize;
  const char *const *chunk;
  int nchunk;
} CkBlock;

/* Copies the values of src inside the block (doff, dshape) and inside the
 * model's size lim into dst, laid out as that block; returns how many.
 * *missing is set when a chunk of src that is needed is absent. */
static int64_t copy_block(char *dst, const int64_t *doff, const int64_t *dshape, const CkBlock *s, const int64_t *lim,
                          size_t es, int *missing) {
  int R = s->rank;
  int64_t lo[IR_MAX_RANK], hi[IR_MAX_RANK], i[IR_MAX_RANK];
  for (int d = 0; d < R; d++) {
    lo[d] = doff[d] > s->off[d] ? doff[d] : s->off[d];
    hi[d] = doff[d] + dshape[d];
    if (s->off[d] + s->shape[d] < hi[d]) hi[d] = s->off[d] + s->shape[d];
    if (lim[d] < hi[d]) hi[d] = lim[d];
    if (hi[d] <= lo[d]) return 0;
    i[d] = lo[d];
  }
  int64_t run = R ? hi[R - 1] - lo[R - 1] : 1, total = 0;
  for (;;) {
    int64_t ls = 0, ld = 0;
    for (int d = 0; d < R; d++) {
      ls = ls * s->shape[d] + (i[d] - s->off[d]);
      ld = ld * dshape[d] + (i[d] - doff[d]);
    }
    char *out = dst + (size_t)ld * es;
    for (int64_t n = run; n > 0;) {   /* a row of src may cross chunks */
      int64_t c = ls / s->csize, o = ls % s->csize, k = s->csize - o < n ? s->csize - o : n;
      if (c >= s->nchunk || !s->chunk[c]) { *missing = 1; return total; }
      memcpy(out, s->chunk[c] + (size_t)o * es, (size_t)k * es);
      out += (size_t)k * es;
      ls += k;
      n -= k;
    }
    total += run;
    int d = R - 2;
    while (d >= 0 && ++i[d] == hi[d]) i[d] = lo[d], d--;
    if (d < 0) break;
  }
  return total;
}

static int same_dims(const int64_t *a, const int64_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

static void type_text(StrBuf *b, int kind, int dtype, const int64_t *d, int n) {
  sb_printf(b, "%s %s", kind_name((IrStateKind)kind), ir_dtype_name((IrDtype)dtype));
  ck_dims_text(b, d, n);
}

/* State s of this rank from the shards in x->ord[lo, hi) (its name). */
static int load_state(RtProgram *p, int s, const CkIndex *x, int lo, int hi, CkFiles *f, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  const IrState *st = &m->states.a[s];
  const IrState *b = block_state(m, st);
  int64_t gdim[IR_MAX_RANK], off[IR_MAX_RANK];
  int fi, fc, R = b->type.rank;
  shard_of(m, rt_program_rank(p), st, gdim, off, &fi, &fc);
  StrBuf t = {0};
  int rc = 0;
  if (lo == hi) {
    type_text(&t, ck_kind(st), st->type.dtype, gdim, R);
    rc = ts_errf(err, errlen, "the checkpoint does not fit this model: it has no tensor '%s' (%s here)", ck_name(m, st),
                 t.p);
  }
  unsigned partial = st->sh.partial;
  for (int i = lo; i < hi && rc == 0; i++) {
    const CkShard *e = &x->a[x->ord[i]];
    partial |= e->partial;
    if (e->kind == ck_kind(st) && e->dtype == (int)st->type.dtype && e->rank == R && same_dims(e->global, gdim, R)) continue;
    type_text(&t, e->kind, e->dtype, e->global, e->rank);
    sb_puts(&t, " in the checkpoint, ");
    type_text(&t, ck_kind(st), st->type.dtype, gdim, R);
    rc = ts_errf(err, errlen, "the checkpoint does not fit this model: tensor '%s' is %s here", ck_name(m, st), t.p);
  }
  sb_free(&t);
  if (rc) return rc;
  size_t es = ir_dtype_size(st->type.dtype), nbytes = (size_t)ir_type_numel(&st->type) * es;
  char *dst = rt_state_data(p, s);
  memset(dst, 0, nbytes);
  if (partial) {   /* zero at a step boundary: checked, loaded as zero */
    for (int i = lo; i < hi; i++) {
      const CkShard *e = &x->a[x->ord[i]];
      const char *d = shard_bytes(f, x, x->ord[i], err, errlen);
      if (!d) return -1;
      for (size_t k = 0; k < e->bytes; k++)
        if (d[k])
          return ts_errf(err, errlen, "tensor '%s' holds partial sums in the checkpoint (values that add up across "
                         "ranks) that are not zero: it loads only into the layout it was saved from", ck_name(m, st));
    }
    return 0;
  }
  int64_t bn = ir_type_numel(&b->type), need = 1, got = 0;
  for (int d = 0; d < R; d++) {   /* the values of the block inside the model's size */
    int64_t h = (off[d] + b->type.dim[d] < gdim[d] ? off[d] + b->type.dim[d] : gdim[d]) - off[d];
    need *= h > 0 ? h : 0;
  }
  char *blk = st->sh.flat ? ts_xcalloc((size_t)(bn ? bn : 1), es) : dst;
  int *heads = ts_xmalloc((size_t)(hi - lo) * sizeof *heads), nh = 0;
  const char **chunk = NULL;
  for (int i = lo; i < hi && rc == 0; i++) {
    const CkShard *e = &x->a[x->ord[i]];
    int meets = 1;
    for (int d = 0; d < R && meets; d++)
      meets = e->off[d] < off[d] + b->type.dim[d] && off[d] < e->off[d] + e->block[d] && e->off[d] < gdim[d];
    if (!meets) continue;
    int dup = 0;   /* a replica of a block, or another chunk of one, read already */
    for (int h = 0; h < nh && !dup; h++) {
      const CkShard *q = &x->a[x->ord[heads[h]]];
      dup = q->fc == e->fc && same_dims(q->off, e->off, R) && same_dims(q->block, e->block, R);
    }
    if (dup) continue;
    heads[nh++] = i;
    chunk = ts_xrealloc(chunk, (size_t)e->fc * sizeof *chunk);
    memset(chunk, 0, (size_t)e->fc * sizeof *chunk);
    for (int k = i; k < hi && rc == 0; k++) {
      const CkShard *q = &x->a[x->ord[k]];
      if (q->fc != e->fc || chunk[q->fi] || !same_dims(q->off, e->off, R) || !same_dims(q->block, e->block, R)) continue;
      if (!(chunk[q->fi] = shard_bytes(f, x, x->ord[k], err, errlen))) rc = -1;
    }
    if (rc) break;
    CkBlock src = {R, e->off, e->block, e->fc == 1 ? ck_dims_numel(e->block, R) : ck_dims_numel(e->shape, e->lrank), chunk, e->fc};
    int missing = 0;
    got += copy_block(blk, off, b->type.dim, &src, gdim, es, &missing);
    if (missing)
      rc = ts_errf(err, errlen, "the checkpoint lacks chunks of tensor '%s' (saved in %d chunks, ZeRO): a rank's shard "
                   "file is missing from its index", ck_name(m, st), e->fc);
  }
  if (rc == 0 && got != need) {
    StrBuf o = {0};
    ck_dims_text(&o, off, R);
    rc = ts_errf(err, errlen, "the checkpoint holds %lld of the %lld values of tensor '%s' at offsets %s that this rank "
                 "needs", (long long)got, (long long)need, ck_name(m, st), o.p);
    sb_free(&o);
  }
  if (rc == 0 && st->sh.flat) {   /* chunk fi of the block, zero-padded */
    int64_t cs = ir_type_numel(&st->type), from = (int64_t)fi * cs, n = bn - from < cs ? bn - from : cs;
    if (n > 0) memcpy(dst, blk + (size_t)from * es, (size_t)n * es);
  }
  if (st->sh.flat) free(blk);
  free(heads);
  free(chunk);
  return rc;
}

/* 1 if rank wr's saved index is exactly this program's states (the layout
 * it was saved in): the shard file then loads as it is. */
static int index_is_mine(const CkIndex *x, int wr, RtProgram *p) {
  const IrModule *m = rt_program_module(p);
  if (wr >= x->nranks || x->first[wr + 1] - x->first[wr] != ck_nsaved(m)) return 0;
  for (int s = 0, k = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (ck_skip(st)) continue;
    const CkShard *e = &x->a[x->first[wr] + k++];
    const IrState *b = block_state(m, st);
    int64_t gdim[IR_MAX_RANK], off[IR_MAX_RANK];
    int fi, fc;
    shard_of(m, rt_program_rank(p), st, gdim, off, &fi, &fc);
    if (strcmp(e->name, ck_name(m, st)) || e->kind != ck_kind(st) || e->dtype != (int)st->type.dtype || e->rank != b->type.rank ||
        e->lrank != st->type.rank || !same_dims(e->shape, st->type.dim, e->lrank) || !same_dims(e->global, gdim, e->rank) ||
        !same_dims(e->off, off, e->rank) || !same_dims(e->block, b->type.dim, e->rank) || e->fi != fi || e->fc != fc ||
        e->partial != st->sh.partial)
      return 0;
  }
  return 1;
}

/* This rank's states from the checkpoint ck (saved by nsaved ranks in any
 * layout).  loaded[group[i]] (the tensor of x->ord[i]) is set to 1 for
 * each tensor this rank holds; *resharded to 1 unless the rank's own file
 * was read as it is. */
static int load_states(RtProgram *p, const CkIndex *x, const char *ck, int64_t step, int wr, int *resharded,
                       double *loaded, const int *group, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  char path[8192];
  int rc = 0;
  for (int s = 0; s < m->states.n; s++) {
    int lo, hi = ck_index_find(x, m->states.a[s].name, &lo);
    if (lo < hi) loaded[group[lo]] = 1;
  }
  *resharded = getenv("TS_CKPT_RESHARD") || !index_is_mine(x, wr, p);   /* the env: tests of the general path */
  if (!*resharded) {
    snprintf(path, sizeof path, "%s/rank_%05d.bin", ck, wr);
    return read_rank(p, path, step, err, errlen);
  }
  CkFiles f = {ck, step, ts_xcalloc((size_t)x->nranks, sizeof(char *)), ts_xcalloc((size_t)x->nranks, sizeof(size_t)),
               ts_xcalloc((size_t)(x->n ? x->n : 1), 1)};
  for (int s = 0; s < m->states.n && rc == 0; s++) {
    if (ck_skip(&m->states.a[s])) continue;   /* ZeRO-3: loaded into its shard */
    int lo, hi = ck_index_find(x, ck_name(m, &m->states.a[s]), &lo);
    if (lo == hi && m->states.a[s].kind == IR_STATE_CACHE) continue;   /* generation's KV cache: scratch, left at 0 */
    if (lo == hi && m->states.a[s].kind == IR_STATE_COPY) continue;    /* a 16-bit copy: remade from its master */
    if (lo == hi && m->states.a[s].kind == IR_STATE_SCALER) continue;  /* fp16's loss scaler from a bf16 / f32 run: starts anew */
    rc = load_state(p, s, x, lo, hi, &f, err, errlen);
  }
  for (int k = 0; k < x->nranks; k++)
    if (f.map[k]) munmap(f.map[k], f.len[k]);
  free(f.map);
  free(f.len);
  free(f.checked);
  return rc;
}

int rt_ckpt_load(RtProgram *p, RtComm *world, const char *dir, int64_t *step, char *how, size_t howlen, char *err,
                 size_t errlen) {
  int wr = world_rank(world);
  char ck[4096], path[8192], why[2048] = "";
  int bad = resolve_load(dir, ck, sizeof ck, why, sizeof why) != 0;
  long long k = -1, ranks = -1, mesh[5] = {1, 1, 1, 1, 1};
  static const char *const ax[5] = {"dp", "pp", "cp", "ep", "tp"};
  CkIndex x = {0};
  if (!bad) {
    snprintf(path, sizeof path, "%s/metadata.json", ck);
    size_t len = 0;
    char *text = ts_read_input(path, &len);
    if (!text) bad = ts_errf(why, sizeof why, "--load: cannot read '%s': %s", path, strerror(errno)) != 0;
    else if (!strstr(text, "\"format\": \"tessera-checkpoint\"") || meta_int(text, "step", &k) || k < 0 ||
             meta_int(text, "ranks", &ranks) || ranks < 1 || ranks > 99999)
      bad = ts_errf(why, sizeof why, "--load: '%s' is not a Tessera checkpoint's metadata", path) != 0;
    for (int a = 0; !bad && a < 5; a++) meta_int(text, ax[a], &mesh[a]);   /* for the message only */
    /* the run goes on from the samples the checkpoint records (Megatron's
     * consumed_train_samples): the data position and a ramp-up's batch and
     * lr follow them, whatever batch sizes this run gives.  Said when this
     * run's batches alone would put step k elsewhere. */
    const IrTrain *t = &rt_program_module(p)->train;
    long long was = -1, now = !bad ? (long long)ir_train_samples_before(t, k) : -1;
    if (!bad && (meta_int(text, "consumed_samples", &was) != 0 || was < 0)) was = now;   /* (older checkpoints) */
    if (!bad) rt_program_set_start(p, k, was);
    if (!bad && wr == 0 && was != now)
      fprintf(stderr, "mrun: note: --load: the checkpoint of step %lld was written after %lld samples; this run's "
              "batches (global_batch %lld%s) would put its step %lld after %lld: the data%s go%s on from sample %lld, "
              "as Megatron's consumed_train_samples\n", k, was, (long long)t->global_batch,
              ir_train_rampup(t) ? ", with a ramp-up" : "", k, now, ir_train_rampup(t) ? " and the ramp" : "",
              ir_train_rampup(t) ? "" : "es", was);
    free(text);
  }
  if (!bad && index_read(ck, (int)ranks, &x, why, sizeof why) != 0) bad = 1;
  int *group = NULL, ng = 0, resharded = 0;
  double *loaded = NULL;
  if (rt_any_failed(world, bad, NULL, why, sizeof why)) goto fail;
  /* the checkpoint's tensors: group[i] for x.ord[i] */
  group = ts_xmalloc((size_t)(x.n ? x.n : 1) * sizeof *group);
  for (int i = 0; i < x.n; i++) {
    if (i && strcmp(x.a[x.ord[i]].name, x.a[x.ord[i - 1]].name)) ng++;
    group[i] = ng;
  }
  ng = x.n ? ng + 1 : 0;
  loaded = ts_xcalloc((size_t)ng + 1, sizeof *loaded);   /* and loaded[ng]: some rank resharded */
  bad = load_states(p, &x, ck, k, wr, &resharded, loaded, group, why, sizeof why) != 0;
  loaded[ng] = resharded;
  if (rt_any_failed(world, bad, NULL, why, sizeof why)) goto fail;
  /* every tensor of the checkpoint is one of the model's: one that no rank
   * loaded is named (the first in the files' order) */
  if (world && rt_comm_all_reduce_max(world, IR_F64, loaded, (size_t)ng + 1, why, sizeof why) != 0) bad = 1;
  int first = -1;
  for (int i = 0; !bad && i < x.n; i++)
    if (!loaded[group[i]] && x.a[x.ord[i]].kind != IR_STATE_CACHE && x.a[x.ord[i]].kind != IR_STATE_COPY &&
        x.a[x.ord[i]].kind != IR_STATE_SCALER &&   /* an fp16 run's loss scaler: a bf16 / f32 plan has none */
        (first < 0 || x.ord[i] < first))
      first = x.ord[i];
  if (first >= 0) {
    StrBuf t = {0};
    const CkShard *e = &x.a[first];
    type_text(&t, e->kind, e->dtype, e->global, e->rank);
    bad = ts_errf(why, sizeof why, "the checkpoint does not fit this model: it holds tensor '%s' (%s), which this model "
                  "does not have", e->name, t.p) != 0;
    sb_free(&t);
  }
  if (!bad) bad = rt_program_push_states(p, why, sizeof why) != 0;
  if (rt_any_failed(world, bad, NULL, why, sizeof why)) goto fail;
  if (how && howlen) {
    how[0] = 0;
    if (loaded[ng] > 0)
      snprintf(how, howlen, "resharded from %lld rank%s (dp=%lld pp=%lld cp=%lld ep=%lld tp=%lld)", ranks, ranks > 1 ? "s" : "",
               mesh[0], mesh[1], mesh[2], mesh[3], mesh[4]);
  }
  free(group);
  free(loaded);
  ck_index_free(&x);
  *step = k;
  return 0;
fail:
  free(group);
  free(loaded);
  ck_index_free(&x);
  if (!why[0]) snprintf(why, sizeof why, "another rank could not load its part of the checkpoint");
  return ts_errf(err, errlen, "%s", why);
}
