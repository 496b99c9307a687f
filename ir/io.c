/* io.c - the one way the tools read their inputs and write their outputs.
 *
 * Writing must never destroy anything the user did not name as an output,
 * even as root:
 *   - a regular file (or a new path) is replaced atomically: written to
 *     PATH.tmp.HOST.PID in the same directory, fsynced, renamed over PATH
 *     (through a symlink, the file it points to is replaced, the link kept);
 *   - a character device, FIFO or socket is written in place, never renamed
 *     over (`-o /dev/null` stays a device);
 *   - "-" is standard output;
 *   - a directory, or a file this process read as an input (same device and
 *     inode, hard links included), is refused;
 *   - every write, flush and close is checked; a failure names the path.
 * Temporary files left by a writer that died (killed mid-write) are removed
 * by the next write to the same path on the same host. */
#include "util.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

static _Thread_local char io_err[PATH_MAX + 256];

const char *ts_io_error(void) { return io_err; }

static int io_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int io_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(io_err, sizeof io_err, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- inputs ---- */
typedef struct { dev_t dev; ino_t ino; char *path; } IoInput;
static VEC(IoInput) io_inputs;

void ts_note_input(const char *path) {
  struct stat st;
  if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return;  /* devices and pipes are never clobbered */
  for (int i = 0; i < io_inputs.n; i++)
    if (io_inputs.a[i].dev == st.st_dev && io_inputs.a[i].ino == st.st_ino) return;
  IoInput in = {st.st_dev, st.st_ino, ts_xstrdup(path)};
  VEC_PUSH(io_inputs, in);
}

void ts_forget_input(const char *path) {
  struct stat st;
  if (!path || stat(path, &st) != 0) return;
  for (int i = 0; i < io_inputs.n; i++)
    if (io_inputs.a[i].dev == st.st_dev && io_inputs.a[i].ino == st.st_ino) {
      free(io_inputs.a[i].path);
      io_inputs.a[i] = io_inputs.a[--io_inputs.n];
      return;
    }
}

/* The input that is the same file as st, or NULL. */
static const char *io_input_of(const struct stat *st) {
  for (int i = 0; i < io_inputs.n; i++)
    if (io_inputs.a[i].dev == st->st_dev && io_inputs.a[i].ino == st->st_ino) return io_inputs.a[i].path;
  return NULL;
}

char *ts_read_file_max(const char *path, size_t max, size_t *len_out) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { fclose(f); errno = EISDIR; return NULL; }
  StrBuf b = {0};
  char tmp[65536];
  size_t k;
  while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) {
    if (k > max - b.n || b.n > max) { sb_free(&b); fclose(f); errno = EFBIG; return NULL; }   /* /dev/zero stops here */
    sb_write(&b, tmp, k);
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) { sb_free(&b); errno = EIO; return NULL; }
  if (!b.p) { b.p = ts_xmalloc(1); b.p[0] = 0; }
  if (len_out) *len_out = b.n;
  return b.p;
}

char *ts_read_file(const char *path, size_t *len_out) { return ts_read_file_max(path, SIZE_MAX, len_out); }

char *ts_read_input_max(const char *path, size_t max, size_t *len_out) {
  char *p = ts_read_file_max(path, max, len_out);
  if (p) ts_note_input(path);
  return p;
}

char *ts_read_input(const char *path, size_t *len_out) { return ts_read_input_max(path, SIZE_MAX, len_out); }

/* ---- outputs ---- */
static int write_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* Host name as used in temporary names: [A-Za-z0-9_-] only, never empty. */
static void io_host(char *h, size_t n) {
  if (gethostname(h, n) != 0) h[0] = 0;
  h[n - 1] = 0;
  for (char *c = h; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-')) *c = '_';
  if (!h[0]) snprintf(h, n, "host");
}

/* Removes DIR/BASE.tmp.HOST.PID files whose writer (on this host) is gone.
 * Earlier versions wrote BASE.tmp.PID: those are removed the same way. */
static void io_clean_stale(const char *dir, const char *base, const char *host) {
  DIR *d = opendir(dir);
  if (!d) return;
  size_t nb = strlen(base), nh = strlen(host);
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *s = e->d_name;
    if (strncmp(s, base, nb) != 0 || strncmp(s + nb, ".tmp.", 5) != 0) continue;
    s += nb + 5;
    if (strncmp(s, host, nh) == 0 && s[nh] == '.') s += nh + 1;
    else if (strchr(s, '.')) continue;   /* another host's: it may still be writing */
    char *end;
    long pid = strtol(s, &end, 10);
    if (*end || end == s || pid <= 0 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   /* alive (or not ours to ask) */
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p) unlink(p);
  }
  closedir(d);
}

/* Where PATH's bytes go, after the checks common to both kinds of writes:
 * *inplace = 1 for a device, FIFO or socket; *target = the regular file to
 * replace (PATH itself, or what a symlink points to; heap). */
static int io_target(const char *path, int *inplace, char **target) {
  *inplace = 0;
  *target = NULL;
  if (!path || !*path) return io_fail("an empty output path");
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno != ENOENT) return io_fail("cannot write '%s': %s", path, strerror(errno));
    struct stat lst;
    if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
      return io_fail("cannot write '%s': it is a symbolic link to a file that does not exist", path);
    *target = ts_xstrdup(path);
    return 0;
  }
  if (S_ISDIR(st.st_mode)) return io_fail("cannot write '%s': it is a directory; give a file name", path);
  const char *in = io_input_of(&st);
  if (in) {
    if (strcmp(in, path) == 0)
      return io_fail("cannot write '%s': it is an input of this run, and writing it would destroy it; "
                     "choose another output path", path);
    return io_fail("cannot write '%s': it is the same file as the input '%s', and writing it would destroy it; "
                   "choose another output path", path, in);
  }
  if (!S_ISREG(st.st_mode)) { *inplace = 1; return 0; }
  struct stat lst;
  if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
    char *real = realpath(path, NULL);
    if (!real) return io_fail("cannot write '%s': %s", path, strerror(errno));
    *target = real;
    return 0;
  }
  *target = ts_xstrdup(path);
  return 0;
}

/* ---- the streaming writer: every output goes through it ---- */
/* Bytes gathered before a write(2): large enough that a token stream of
 * 2-byte ids costs few system calls, small enough to keep per output. */
enum { IO_BUF = 1 << 20 };
typedef enum { IO_STDOUT, IO_INPLACE, IO_ATOMIC } IoKind;
struct TsOut {
  IoKind kind;
  int fd;          /* IO_INPLACE / IO_ATOMIC; -1 once closed */
  char *user;      /* the path as given, for messages */
  char *target;    /* IO_ATOMIC: the regular file renamed over */
  char *tmp;       /* IO_ATOMIC: the temporary file written */
  char *buf;
  size_t nbuf;
  int failed;      /* a write failed: the rest are refused, commit fails */
  char why[256];   /* ... and why, repeated by every later call */
};

static int io_stdout_reported;   /* a failure on stdout went back to a caller, who says so */

/* Opens PATH.tmp.HOST.PID beside target (stale ones of dead writers removed). */
static int io_open_tmp(TsOut *o) {
  char host[64];
  io_host(host, sizeof host);
  const char *path = o->target, *slash = strrchr(path, '/');
  char dir[PATH_MAX];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  io_clean_stale(dir, slash ? slash + 1 : path, host);
  size_t n = strlen(path) + strlen(host) + 40;
  o->tmp = ts_xmalloc(n);
  snprintf(o->tmp, n, "%s.tmp.%s.%ld", path, host, (long)getpid());
  o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
  if (o->fd < 0) return io_fail("cannot write '%s': %s", o->user, strerror(errno));
  return 0;
}

static void io_out_free(TsOut *o) {
  free(o->user);
  free(o->target);
  free(o->tmp);
  free(o->buf);
  free(o);
}

TsOut *ts_out_open(const char *path) {
  TsOut *o = ts_xcalloc(1, sizeof *o);
  o->fd = -1;
  o->user = ts_xstrdup(path ? path : "");
  int inplace = 0;
  if (path && strcmp(path, "-") == 0) o->kind = IO_STDOUT;
  else if (io_target(path, &inplace, &o->target) != 0) { io_out_free(o); return NULL; }
  else if (inplace) {
    o->kind = IO_INPLACE;
    o->fd = open(path, O_WRONLY | O_NOCTTY);
    if (o->fd < 0) { io_fail("cannot write '%s': %s", path, strerror(errno)); io_out_free(o); return NULL; }
  } else {
    o->kind = IO_ATOMIC;
    if (io_open_tmp(o) != 0) { io_out_free(o); return NULL; }
  }
  o->buf = ts_xmalloc(IO_BUF);
  return o;
}

/* Records the first failure (errno e) and reports it. */
static int io_out_fail(TsOut *o, int e) {
  if (!o->failed) {
    o->failed = 1;
    if (o->kind == IO_STDOUT) {
      io_stdout_reported = 1;
      snprintf(o->why, sizeof o->why, "cannot write standard output: %s", strerror(e));
    } else snprintf(o->why, sizeof o->why, "cannot write '%s': %s", o->user, strerror(e));
  }
  return io_fail("%s", o->why);
}

static int io_out_flush(TsOut *o, const void *p, size_t n) {
  if (o->kind == IO_STDOUT) {
    if (n && fwrite(p, 1, n, stdout) != n) return io_out_fail(o, errno ? errno : EIO);
    return 0;
  }
  return write_all(o->fd, p, n) != 0 ? io_out_fail(o, errno) : 0;
}

int ts_out_write(TsOut *o, const void *p, size_t n) {
  if (o->failed) return io_fail("%s", o->why);
  if (n <= IO_BUF - o->nbuf) {
    memcpy(o->buf + o->nbuf, p, n);
    o->nbuf += n;
    return 0;
  }
  if (io_out_flush(o, o->buf, o->nbuf) != 0) return -1;
  o->nbuf = 0;
  if (n >= IO_BUF) return io_out_flush(o, p, n);   /* a big piece goes straight through */
  memcpy(o->buf, p, n);
  o->nbuf = n;
  return 0;
}

int ts_out_close(TsOut *o) {
  if (o->failed) return io_fail("%s", o->why);
  if (io_out_flush(o, o->buf, o->nbuf) != 0) return -1;
  o->nbuf = 0;
  if (o->kind == IO_STDOUT) {
    if (fflush(stdout) != 0 || ferror(stdout)) return io_out_fail(o, errno ? errno : EIO);
    return 0;
  }
  if (o->fd < 0) return 0;
  if (o->kind == IO_ATOMIC && fsync(o->fd) != 0) return io_out_fail(o, errno);
  int rc = close(o->fd);
  o->fd = -1;
  return rc != 0 ? io_out_fail(o, errno) : 0;
}

int ts_out_commit(TsOut *o) {
  int rc = ts_out_close(o);
  if (rc == 0 && o->kind == IO_ATOMIC && rename(o->tmp, o->target) != 0) rc = io_out_fail(o, errno);
  if (rc != 0) { ts_out_abort(o); return -1; }
  io_out_free(o);
  return 0;
}

void ts_out_abort(TsOut *o) {
  if (!o) return;
  if (o->fd >= 0) close(o->fd);
  if (o->kind == IO_ATOMIC && o->tmp) unlink(o->tmp);
  io_out_free(o);
}

int ts_check_output(const char *path) {
  if (path && strcmp(path, "-") == 0) return 0;
  int inplace;
  char *target;
  int rc = io_target(path, &inplace, &target);
  free(target);
  return rc;
}

int ts_write_pieces(const char *path, const TsPiece *pieces, int n) {
  TsOut *o = ts_out_open(path);
  if (!o) return -1;
  for (int i = 0; i < n; i++)
    if (ts_out_write(o, pieces[i].p, pieces[i].n) != 0) { ts_out_abort(o); return -1; }
  return ts_out_commit(o);
}

int ts_write_file(const char *path, const void *data, size_t len) {
  TsPiece one = {data, len};
  return ts_write_pieces(path, &one, 1);
}

FILE *ts_open_log(const char *path) {
  if (path && strcmp(path, "-") == 0) return stdout;
  int inplace;
  char *target;
  if (io_target(path, &inplace, &target) != 0) return NULL;
  free(target);
  FILE *f = fopen(path, "w");
  if (!f) io_fail("cannot write '%s': %s", path, strerror(errno));
  return f;
}

int ts_log_flush(FILE *f, const char *path) {
  if (fflush(f) != 0 || ferror(f)) {
    if (f == stdout) io_stdout_reported = 1;
    if (f == stdout) return io_fail("cannot write standard output: %s", strerror(errno));
    return io_fail("cannot write '%s': %s", path, strerror(errno));
  }
  return 0;
}

int ts_close_log(FILE *f, const char *path) {
  if (!f) return 0;
  int rc = ts_log_flush(f, path);
  if (f == stdout) return rc;
  int e = errno;
  if (fclose(f) != 0 && rc == 0) return io_fail("cannot write '%s': %s", path, strerror(errno));
  errno = e;
  return rc;
}

/* ---- standard output at exit ---- */
static const char *io_prog = "tessera";

static void io_stdout_at_exit(void) {
  /* A write that failed earlier left the error flag; a buffered one fails
   * here.  Either way the run did not deliver what it was asked for. */
  errno = 0;
  int bad = fflush(stdout) != 0 || ferror(stdout);
  int e = errno;
  if (fclose(stdout) != 0 && !bad && errno != EBADF) bad = 1, e = errno;   /* EBADF: closed by the caller, nothing written */
  if (bad && io_stdout_reported) _exit(1);
  if (bad) {
    fprintf(stderr, "%s: error: cannot write standard output: %s\n", io_prog, e ? strerror(e) : "a write failed");
    _exit(1);
  }
}

void ts_check_stdout_at_exit(const char *prog) {
  static int registered;
  io_prog = prog;
  if (!registered) atexit(io_stdout_at_exit);
  registered = 1;
}
