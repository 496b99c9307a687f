/* util.h - small shared helpers for every stage: arenas, growable arrays,
 * string interning, internal-bug asserts.  No dependencies beyond libc.
 *
 * Ownership rule (CONVENTIONS §5): compiler data lives in an Arena that is
 * freed as a whole; nothing allocated from an arena is freed one by one. */
#ifndef TS_UTIL_H
#define TS_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Internal compiler/runtime bug: names our own file and line, then aborts. */
#define TS_ASSERT(c) \
  do { if (!(c)) ts_die_at(__FILE__, __LINE__, "internal error: assertion '%s' failed", #c); } while (0)
#define TS_DIE(...) ts_die_at(__FILE__, __LINE__, __VA_ARGS__)
void ts_die_at(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

/* Writes a message into err (if err && errlen) and returns -1: the one way
 * every stage reports a recoverable error to its caller. */
int ts_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* malloc/calloc/realloc that die (with a message) on out-of-memory. */
void *ts_xmalloc(size_t n);
void *ts_xcalloc(size_t n, size_t sz);
void *ts_xrealloc(void *p, size_t n);
char *ts_xstrdup(const char *s);

/* ---- Arena: bump allocator in chained blocks; zeroed memory. ---- */
typedef struct ArenaBlock ArenaBlock;
typedef struct Arena { ArenaBlock *head; size_t used_total; } Arena;
void  arena_init(Arena *a);
void  arena_free(Arena *a);                 /* releases every block */
void *arena_alloc(Arena *a, size_t n);      /* 16-byte aligned, zeroed */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- Growable array on the heap: VEC(T) v = {0}; VEC_PUSH(v, x); free(v.a) ---- */
#define VEC(T) struct { T *a; int n, cap; }
#define VEC_PUSH(v, x) do { \
    if ((v).n == (v).cap) { (v).cap = (v).cap ? 2 * (v).cap : 8; \
      (v).a = ts_xrealloc((v).a, (size_t)(v).cap * sizeof *(v).a); } \
    (v).a[(v).n++] = (x); } while (0)

/* ---- Interned strings: equal strings get the same pointer (process-wide,
 * never freed), so names can be compared with ==. NULL maps to NULL. ---- */
const char *ts_intern(const char *s);
const char *ts_intern_n(const char *s, size_t n);

/* ---- Byte buffer for building text or binary blobs ---- */
typedef struct { char *p; size_t n, cap; } StrBuf;
void sb_putc(StrBuf *b, char c);
void sb_puts(StrBuf *b, const char *s);
void sb_write(StrBuf *b, const void *p, size_t n);
void sb_printf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(StrBuf *b);

/* ---- Files (io.c): the one way the tools read inputs and write outputs ---- */
/* Reads a whole file into a NUL-terminated heap buffer; NULL + errno on failure.
 * _max: at most max bytes; a longer file (or an endless device) stops the
 * read there with errno EFBIG. */
char *ts_read_file(const char *path, size_t *len_out);
char *ts_read_file_max(const char *path, size_t max, size_t *len_out);
/* ts_read_file of a file this run consumes (model, plan, data, weights):
 * it is remembered, and no output of this process may overwrite it. */
char *ts_read_input(const char *path, size_t *len_out);
char *ts_read_input_max(const char *path, size_t max, size_t *len_out);
void ts_note_input(const char *path);
/* path is no longer an input: for a tool whose job is to rewrite the file
 * it read (the golden tests' --update), never for an output option. */
void ts_forget_input(const char *path);
/* Writes an output file: "-" is stdout; a regular or new file is replaced
 * atomically (temp file, fsync, rename; stale temp files of dead writers
 * cleaned); a device, FIFO or socket is written in place; a directory or an
 * input of this run is refused.  0, or -1 with ts_io_error() naming the path
 * (no partial file left). */
int ts_write_file(const char *path, const void *data, size_t len);
/* The same for a file written from n pieces in order (a checkpoint shard:
 * tensor headers between the tensors' own memory), never copied into one. */
typedef struct { const void *p; size_t n; } TsPiece;
int ts_write_pieces(const char *path, const TsPiece *pieces, int n);
/* The same output streamed: open, write pieces as they come, commit.
 * Writes are buffered; the first failure is kept and every later call
 * (commit included) returns -1 with it in ts_io_error().  close flushes
 * and fsyncs without making the file visible (so that the last of
 * several files can be finished before any is renamed); commit closes if
 * needed, renames over PATH and frees; abort removes the temporary file
 * and frees (a device or stdout keeps what was written).  ts_write_file
 * and ts_write_pieces are this. */
typedef struct TsOut TsOut;
TsOut *ts_out_open(const char *path);
int ts_out_write(TsOut *o, const void *p, size_t n);
int ts_out_close(TsOut *o);
int ts_out_commit(TsOut *o);
void ts_out_abort(TsOut *o);
/* The checks of ts_write_file without writing, for an output written late
 * (after a training run): 0, or -1 with ts_io_error(). */
int ts_check_output(const char *path);
/* A log written as it goes (metrics): the same checks, then opened in place
 * and truncated ("-" is stdout).  NULL with ts_io_error() on refusal. Each
 * ts_log_flush / ts_close_log checks the writes: -1 with ts_io_error(). */
FILE *ts_open_log(const char *path);
int ts_log_flush(FILE *f, const char *path);
int ts_close_log(FILE *f, const char *path);
/* The last failure of the calls above, as "cannot write 'PATH': why". */
const char *ts_io_error(void);
/* At exit: flush and close stdout; if any write to it failed, print
 * "PROG: error: cannot write standard output: why" and exit 1. */
void ts_check_stdout_at_exit(const char *prog);

/* Formats a double so that strtod() gives back the same bits ("%.17g",
 * shortest form that round-trips, "inf"/"-inf"/"nan" spelled out). */
void ts_fmt_double(char *buf, size_t n, double x);

/* 64-bit FNV-1a, for checksums and content hashes. */
uint64_t ts_hash64(const void *p, size_t n, uint64_t seed);
/* Seconds on the monotonic clock (for durations). */
double ts_now_s(void);
/* Where Tessera's data lives (stdlib/, samples/): an installed tree
 * (cmake --install) puts it in PREFIX/share/tessera next to PREFIX/bin, and
 * a program found there uses it; a build in the source tree uses the
 * source tree (TS_SOURCE_DIR).  Decided once (thread-safe) from
 * /proc/self/exe, else from where the library holding this code is
 * (libtessera.so in PREFIX/lib or PREFIX/lib/<multiarch>: the C API). */
const char *ts_data_root(void);

#endif
