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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_MAGIC "TSCKPT01"
#define CK_VERSION 1u

static const char *kind_name(IrStateKind k) {
  static const char *const n[] = {"param", "grad", "adam_m", "adam_v"};
  return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "state";
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

/* All ranks agree: 1 if any rank's `bad` is set. */
static int any_failed(RtComm *w, int bad, char *err, size_t errlen) {
  if (!w) return bad;
  double v = bad;
  char why[512];
  if (rt_comm_all_reduce_max(w, IR_F64, &v, 1, why, sizeof why) != 0) {
    if (!bad) ts_errf(err, errlen, "%s", why);
    return 1;
  }
  return v > 0;
}

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
static void shard_of(const IrModule *m, const RtRank *r, const IrState *s, int64_t *gdim, int64_t *off,
                     int *flat_index, int *flat_count) {
  const IrState *b = s;
  *flat_index = 0;
  *flat_count = 1;
  if (s->sh.flat && s->of >= 0 && s->of < m->states.n) {
    b = &m->states.a[s->of];
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

static void dims_text(StrBuf *b, const int64_t *d, int n) {
  sb_putc(b, '[');
  for (int i = 0; i < n; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)d[i]);
  sb_putc(b, ']');
}

/* This rank's shard file and its text index, into dir. */
static int write_rank(RtProgram *p, const RtRank *r, const char *dir, int wr, int64_t step, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  /* bin: the headers only; the file is written from them and the states'
   * own memory, piece by piece (nothing copied) */
  StrBuf bin = {0}, idx = {0};
  size_t *hdr_end = ts_xmalloc((size_t)(m->states.n + 1) * sizeof *hdr_end), data_total = 0;
  sb_write(&bin, CK_MAGIC, 8);
  put_u32(&bin, CK_VERSION);
  put_u32(&bin, (uint32_t)m->states.n);
  put_u64(&bin, (uint64_t)step);
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    size_t nbytes = (size_t)ir_type_numel(&st->type) * ir_dtype_size(st->type.dtype);
    const void *data = rt_state_data(p, s);
    uint64_t h = ts_hash64(data, nbytes, 0);
    size_t nl = strlen(st->name);
    put_u32(&bin, (uint32_t)nl);
    sb_write(&bin, st->name, nl);
    put_u32(&bin, (uint32_t)st->kind);
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
    const IrState *b = st->sh.flat && st->of >= 0 ? &m->states.a[st->of] : st;
    sb_printf(&idx, "tensor %s kind=%s dtype=%s global=", st->name, kind_name(st->kind), ir_dtype_name(st->type.dtype));
    dims_text(&idx, gdim, b->type.rank);
    sb_puts(&idx, " offsets=");
    dims_text(&idx, off, b->type.rank);
    sb_puts(&idx, " shape=");
    dims_text(&idx, st->type.dim, st->type.rank);
    sb_printf(&idx, " flat=%d/%d partial=", fi, fc);
    int np = 0;
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (st->sh.partial & (1u << a)) sb_printf(&idx, "%s%s", np++ ? "," : "", ir_axis_name((IrAxis)a));
    if (!np) sb_puts(&idx, "-");
    sb_printf(&idx, " at=%zu bytes=%zu hash=%016llx\n", at, nbytes, (unsigned long long)h);
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
    pc[npc++] = (TsPiece){bin.p + from, hdr_end[s] - from};
    pc[npc++] = (TsPiece){rt_state_data(p, s),
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

/* metadata.json from the ranks' .idx files (world rank 0). */
static int write_metadata(const char *dir, const IrModule *m, const RtRank *r, int nranks, int64_t step,
                          char *err, size_t errlen) {
  /* every rank's index lines, in rank order */
  char **lines = NULL;
  int *owner = NULL, nl = 0, cap = 0;
  char path[8192];
  int rc = 0;
  for (int k = 0; k < nranks && rc == 0; k++) {
    snprintf(path, sizeof path, "%s/rank_%05d.idx", dir, k);
    size_t len = 0;
    char *text = ts_read_file(path, &len);
    if (!text) { rc = ts_errf(err, errlen, "checkpoint: cannot read '%s': %s", path, strerror(errno)); break; }
    for (char *s = text, *e; *s; s = e + (*e != 0)) {
      e = s + strcspn(s, "\n");
      if (e == s) continue;
      if (nl == cap) {
        cap = cap ? 2 * cap : 64;
        lines = ts_xrealloc(lines, (size_t)cap * sizeof *lines);
        owner = ts_xrealloc(owner, (size_t)cap * sizeof *owner);
      }
      lines[nl] = ts_xmalloc((size_t)(e - s) + 1);
      memcpy(lines[nl], s, (size_t)(e - s));
      lines[nl][e - s] = 0;
      owner[nl++] = k;
    }
    free(text);
  }
  uint64_t hash = 0x6d6f64656cULL;   /* the model: every tensor's name, kind, dtype, global shape */
  StrBuf j = {0};
  if (rc == 0) {
    sb_printf(&j, "{\n  \"format\": \"tessera-checkpoint\",\n  \"version\": %u,\n  \"step\": %lld,\n", CK_VERSION,
              (long long)step);
    sb_printf(&j, "  \"model\": \"%s\",\n", m->name ? m->name : "");
    sb_printf(&j, "  \"mesh\": {\"dp\": %d, \"pp\": %d, \"cp\": %d, \"ep\": %d, \"tp\": %d},\n", rt_rank_axis_size(r, IR_AXIS_DP),
              rt_rank_axis_size(r, IR_AXIS_PP), rt_rank_axis_size(r, IR_AXIS_CP), rt_rank_axis_size(r, IR_AXIS_EP), rt_rank_axis_size(r, IR_AXIS_TP));
    sb_printf(&j, "  \"layout\": {\"sp\": %d, \"zero\": %d, \"vpp\": %d},\n", m->par.sp, m->par.zero,
              m->par.vpp > 0 ? m->par.vpp : 1);
    sb_printf(&j, "  \"ranks\": %d,\n  \"tensors\": [", nranks);
    unsigned char *done = ts_xcalloc((size_t)(nl ? nl : 1), 1);
    int nt = 0;
    for (int i = 0; i < nl; i++) {
      if (done[i]) continue;
      char name[1024], kind[32], dtype[16], global[512];
      if (sscanf(lines[i], "tensor %1023s kind=%31s dtype=%15s global=%511[^]]", name, kind, dtype, global) != 4) {
        rc = ts_errf(err, errlen, "checkpoint: rank %d's index has a bad line: %.80s", owner[i], lines[i]);
        break;
      }
      strcat(global, "]");
      hash = ts_hash64(lines[i], strcspn(lines[i], "]") + 1, hash);   /* "tensor NAME kind dtype global=[..]" */
      sb_printf(&j, "%s\n    {\"name\": \"%s\", \"kind\": \"%s\", \"dtype\": \"%s\", \"global_shape\": %s, \"shards\": [",
                nt++ ? "," : "", name, kind, dtype, global);
      int ns = 0;
      for (int k = i; k < nl; k++) {
        char n2[1024], off[512], shape[512], partial[64], hash_s[32];
        int fi, fc;
        size_t at, bytes;
        if (sscanf(lines[k], "tensor %1023s", n2) != 1 || strcmp(n2, name)) continue;
        const char *o = strstr(lines[k], " offsets=");
        if (!o || sscanf(o, " offsets=%511[^]]] shape=%511[^]]] flat=%d/%d partial=%63s at=%zu bytes=%zu hash=%31s", off,
                         shape, &fi, &fc, partial, &at, &bytes, hash_s) != 8) {
          rc = ts_errf(err, errlen, "checkpoint: rank %d's index has a bad line: %.80s", owner[k], lines[k]);
          break;
        }
        done[k] = 1;
        sb_printf(&j, "%s\n      {\"rank\": %d, \"file\": \"rank_%05d.bin\", \"at\": %zu, \"bytes\": %zu, \"hash\": \"%s\", "
                  "\"offsets\": %s], \"shape\": %s], \"flat\": [%d, %d], \"partial\": [",
                  ns++ ? "," : "", owner[k], owner[k], at, bytes, hash_s, off, shape, fi, fc);
        if (strcmp(partial, "-")) {
          int first = 1;
          for (char *t = strtok(partial, ","); t; t = strtok(NULL, ",")) sb_printf(&j, "%s\"%s\"", first ? "" : ", ", t), first = 0;
        }
        sb_puts(&j, "]}");
      }
      if (rc) break;
      sb_puts(&j, "\n    ]}");
    }
    free(done);
    sb_printf(&j, "\n  ],\n  \"model_hash\": \"%016llx\"\n}\n", (unsigned long long)hash);
  }
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    if (ts_write_file(path, j.p, j.n) != 0) rc = ts_errf(err, errlen, "%s", ts_io_error());
  }
  sb_free(&j);
  for (int i = 0; i < nl; i++) free(lines[i]);
  free(lines);
  free(owner);
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

int rt_ckpt_save(RtProgram *p, RtComm *world, const RtCkptOpts *o, int64_t step, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  const RtRank *r = rt_program_rank(p);
  int wr = world_rank(world), nranks = world ? rt_comm_size(world) : 1;
  char tmp[4096], fin[4096], why[2048] = "";
  snprintf(tmp, sizeof tmp, "%s/iter_%07lld.tmp", o->save_dir, (long long)step);
  snprintf(fin, sizeof fin, "%s/iter_%07lld", o->save_dir, (long long)step);
  int bad = 0;
  fault_point(wr, "before a save");
  if (wr == 0) {   /* the directories; a .tmp left by a killed save is removed */
    if (mkdir(o->save_dir, 0777) != 0 && errno != EEXIST)
      bad = ts_errf(why, sizeof why, "--save: cannot create '%s': %s", o->save_dir, strerror(errno)) != 0;
    else if (remove_dir(tmp) != 0 || mkdir(tmp, 0777) != 0)
      bad = ts_errf(why, sizeof why, "--save: cannot create '%s': %s", tmp, strerror(errno)) != 0;
  }
  if (any_failed(world, bad, why, sizeof why)) goto fail;
  fault_point(wr, "after making the .tmp directory");
  bad = rt_program_sync_states(p, why, sizeof why) != 0 || write_rank(p, r, tmp, wr, step, why, sizeof why) != 0;
  if (any_failed(world, bad, why, sizeof why)) goto fail;
  if (wr == 0) {
    char latest[4096], text[64];
    snprintf(latest, sizeof latest, "%s/latest", o->save_dir);
    snprintf(text, sizeof text, "iter_%07lld\n", (long long)step);
    if (write_metadata(tmp, m, r, nranks, step, why, sizeof why) != 0) bad = 1;
    else if (fault_point(wr, "after writing metadata.json"), sync_dir(tmp) != 0 || remove_dir(fin) != 0 ||
             rename(tmp, fin) != 0 || sync_dir(o->save_dir) != 0)
      bad = ts_errf(why, sizeof why, "--save: cannot rename '%s' to '%s': %s", tmp, fin, strerror(errno)) != 0;
    else if (fault_point(wr, "between the rename and latest"), ts_write_file(latest, text, strlen(text)) != 0)
      bad = ts_errf(why, sizeof why, "--save: %s", ts_io_error()) != 0;
    if (!bad) fault_point(wr, "after writing latest");
    if (!bad && o->keep > 0) {   /* the newest K; never the one just written */
      int64_t *its;
      int n = list_iters(o->save_dir, &its);
      for (int i = 0; i + o->keep < n; i++) {
        if (its[i] == step) continue;
        char old[4096];
        snprintf(old, sizeof old, "%s/iter_%07lld", o->save_dir, (long long)its[i]);
        remove_dir(old);
      }
      free(its);
      fault_point(wr, "after the --keep cleanup");
    }
  }
  if (!any_failed(world, bad, why, sizeof why)) return 0;
fail:
  if (!why[0]) snprintf(why, sizeof why, "another rank could not write its part of the checkpoint");
  return ts_errf(err, errlen, "checkpoint of step %lld: %s", (long long)step, why);
}

/* ---- loading ---- */

/* The checkpoint directory --load names: DIR itself when it holds a
 * metadata.json, else DIR/<the iter named by DIR/latest>. */
static int resolve_load(const char *dir, char *out, size_t n, char *err, size_t errlen) {
  char path[8192];
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return ts_errf(err, errlen, "--load: '%s' is not a directory", dir);
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

/* Reads this rank's shard file into the program's states. */
static int read_rank(RtProgram *p, const char *path, int64_t step, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  /* mapped, not read: the file is as large as the rank's states */
  int fd = open(path, O_RDONLY);
  struct stat fst;
  if (fd < 0 || fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
    int e = fd < 0 ? errno : EINVAL;
    if (fd >= 0) close(fd);
    return ts_errf(err, errlen, "cannot read '%s': %s", path, strerror(e));
  }
  size_t len = (size_t)fst.st_size;
  char *b = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (len && b == MAP_FAILED) return ts_errf(err, errlen, "cannot map '%s': %s", path, strerror(errno));
  ts_note_input(path);
  int rc = 0;
  size_t pos = 0;
  unsigned char *got = ts_xcalloc((size_t)(m->states.n ? m->states.n : 1), 1);
#define NEED(k) do { if (len - pos < (size_t)(k)) { rc = ts_errf(err, errlen, "'%s' is truncated (at byte %zu of %zu)", path, pos, len); goto out; } } while (0)
  NEED(24);
  if (memcmp(b, CK_MAGIC, 8) != 0) { rc = ts_errf(err, errlen, "'%s' is not a Tessera checkpoint shard", path); goto out; }
  pos = 8;
  uint32_t ver = get_u32(b, &pos), n = get_u32(b, &pos);
  uint64_t fstep = get_u64(b, &pos);
  if (ver != CK_VERSION) { rc = ts_errf(err, errlen, "'%s' has format version %u; this mrun reads %u", path, ver, CK_VERSION); goto out; }
  if ((int64_t)fstep != step) { rc = ts_errf(err, errlen, "'%s' is of step %llu, its metadata says %lld", path, (unsigned long long)fstep, (long long)step); goto out; }
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
    const IrState *st = s >= 0 ? &m->states.a[s] : NULL;
    int same = st && (uint32_t)st->kind == kind && (uint32_t)st->type.dtype == dt && (uint32_t)st->type.rank == rank;
    for (uint32_t d = 0; same && d < rank; d++) same = st->type.dim[d] == dim[d];
    if (!same) {
      char have[128] = "", want[128] = "";
      IrType t = {0};
      t.dtype = (IrDtype)dt;
      t.rank = (int)rank;
      for (uint32_t d = 0; d < rank; d++) t.dim[d] = dim[d];
      ir_type_str(&t, have, sizeof have);
      if (st) ir_type_str(&st->type, want, sizeof want);
      rc = ts_errf(err, errlen, "the checkpoint does not fit this program: tensor '%s' (%s %s in '%s') %s%s%s", name,
                   kind_name((IrStateKind)kind), have, path, st ? "is " : "is not in the program",
                   st ? kind_name(st->kind) : "", st ? " " : "");
      if (st) snprintf(err + strlen(err), errlen - strlen(err), "%s here (a checkpoint loads into the model and "
                       "layout it was saved from)", want);
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
    if (!got[s]) { rc = ts_errf(err, errlen, "the checkpoint does not fit this program: '%s' lacks tensor '%s'", path, m->states.a[s].name); goto out; }
#undef NEED
out:
  free(got);
  if (len) munmap(b, len);
  return rc;
}

int rt_ckpt_load(RtProgram *p, RtComm *world, const char *dir, int64_t *step, char *err, size_t errlen) {
  const RtRank *r = rt_program_rank(p);
  int wr = world_rank(world), nranks = world ? rt_comm_size(world) : 1;
  char ck[4096], path[8192], why[2048] = "";
  int bad = resolve_load(dir, ck, sizeof ck, why, sizeof why) != 0;
  long long k = -1, ranks = -1, mesh[5] = {-1, -1, -1, -1, -1};
  if (!bad) {
    snprintf(path, sizeof path, "%s/metadata.json", ck);
    size_t len = 0;
    char *text = ts_read_input(path, &len);
    static const char *const ax[5] = {"dp", "pp", "cp", "ep", "tp"};
    if (!text) bad = ts_errf(why, sizeof why, "--load: cannot read '%s': %s", path, strerror(errno)) != 0;
    else if (!strstr(text, "\"format\": \"tessera-checkpoint\"") || meta_int(text, "step", &k) || k < 0 ||
             meta_int(text, "ranks", &ranks))
      bad = ts_errf(why, sizeof why, "--load: '%s' is not a Tessera checkpoint's metadata", path) != 0;
    for (int a = 0; !bad && a < 5; a++)
      if (meta_int(text, ax[a], &mesh[a]) != 0)
        bad = ts_errf(why, sizeof why, "--load: '%s' has no mesh", path) != 0;
    free(text);
    const IrAxis axes[5] = {IR_AXIS_DP, IR_AXIS_PP, IR_AXIS_CP, IR_AXIS_EP, IR_AXIS_TP};
    int same = !bad && ranks == nranks;
    for (int a = 0; same && a < 5; a++) same = mesh[a] == rt_rank_axis_size(r, axes[a]);
    if (!bad && !same)
      bad = ts_errf(why, sizeof why, "--load: '%s' was saved by %lld ranks with dp=%lld pp=%lld cp=%lld ep=%lld tp=%lld; this "
                    "run has %d ranks with dp=%d pp=%d cp=%d ep=%d tp=%d, and loading into another layout is not "
                    "implemented yet: resume with the layout it was saved from", ck, ranks, mesh[0], mesh[1], mesh[2],
                    mesh[3], mesh[4], nranks, rt_rank_axis_size(r, IR_AXIS_DP), rt_rank_axis_size(r, IR_AXIS_PP),
                    rt_rank_axis_size(r, IR_AXIS_CP), rt_rank_axis_size(r, IR_AXIS_EP), rt_rank_axis_size(r, IR_AXIS_TP)) != 0;
  }
  if (!bad) {
    snprintf(path, sizeof path, "%s/rank_%05d.bin", ck, wr);
    bad = read_rank(p, path, k, why, sizeof why) != 0 || rt_program_push_states(p, why, sizeof why) != 0;
  }
  if (any_failed(world, bad, why, sizeof why)) {
    if (!why[0]) snprintf(why, sizeof why, "another rank could not load its part of the checkpoint");
    return ts_errf(err, errlen, "%s", why);
  }
  *step = k;
  return 0;
}
