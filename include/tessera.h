/* tessera.h - the C API of the Tessera compiler: MDL source to a plan for
 * mrun, and the compiler's reports, from inside another program (a Python
 * binding, a build system).  This is the only header an embedder includes;
 * it names no internal type.  Link: pkg-config --cflags --libs tessera
 * (docs/embedding.md).
 *
 * A session holds options and the result of its last compilation:
 *
 *   TsSession *s = ts_session_new();
 *   ts_session_set(s, "tp", "2");                 // mcc's --tp 2
 *   ts_session_set(s, "D", "layers=2");           // mcc's -D layers=2
 *   if (ts_session_compile_file(s, "gpt.mdl") != TS_OK)
 *     fputs(ts_session_errors(s), stderr);        // file:line:col, caret
 *   else ts_session_write_plan(s, "gpt.plan");     // atomic replacement
 *   ts_session_free(s);
 *
 * Options: ts_session_set takes mcc's own option names and values, read
 * by the same table mcc's command line goes through (so the two cannot
 * differ): the name with or without its leading dashes ("tp", "--tp",
 * "D", "tensor-model-parallel-size", "dump-ir=all"), the value as mcc's
 * next argument, NULL for a switch ("sp", "no-zero").  Options that only
 * make sense for the command-line program (-o, --emit, --report, --check,
 * --auto-layout, --target, --time, --help, ...) are refused with a
 * message saying which call does their job.  Options accumulate; give a
 * new session for a fresh set.
 *
 * Status: every call returns a TsStatus; on anything but TS_OK the text
 * of ts_session_errors() says why, as mcc would print it (a compile
 * error as file:line:col: error: message, the source line and a caret).
 * Warnings (an option given twice) are in the same text after TS_OK.
 * The library never exits, aborts or writes to stderr or stdout on a
 * user's error; it aborts only on an internal bug (an assertion naming
 * the compiler's file and line) or when memory runs out.
 *
 * Threads: calls into the library take one process-wide lock, so any
 * thread may call it and sessions are independent, but compilations do
 * not run in parallel (use processes for that).  One session must not be
 * used by two threads at once.  Global state, shared by
 * all sessions: the string table the compiler interns names in (grows,
 * never freed), the data root (share/tessera beside the library, found
 * once; $TESSERA_STDLIB overrides the stdlib's place), and the list of
 * files read as inputs (a model, its imports), which no plan may be
 * written over for the life of the process (docs/cli.md, "Output files").
 *
 * Returned strings and bytes belong to the session and stay valid until
 * the next call on that session (ts_session_errors excepted: it returns
 * the text of the call before it). */
#ifndef TESSERA_H
#define TESSERA_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0
/* (major << 16) | (minor << 8) | patch, for #if */
#define TESSERA_VERSION_NUMBER ((TESSERA_VERSION_MAJOR << 16) | (TESSERA_VERSION_MINOR << 8) | TESSERA_VERSION_PATCH)
#define TESSERA_VERSION_STRING "0.1.0"

typedef enum {
  TS_OK = 0,
  TS_ERR_OPTION = 1,   /* an unknown option, a bad value, options that do not go together */
  TS_ERR_COMPILE = 2,  /* the model was refused (syntax, shapes, a layout it cannot take) */
  TS_ERR_IO = 3,       /* a file could not be read or written */
  TS_ERR_STATE = 4,    /* a call out of order: no compiled model yet, a NULL argument */
  TS_ERR_INTERNAL = 5  /* a compiler bug ("internal error: ..."); please report it */
} TsStatus;

typedef struct TsSession TsSession;   /* opaque */

/* The library's version, TESSERA_VERSION_NUMBER of the build that made it
 * (compare with the header's), and its string ("0.1.0"). */
uint32_t ts_version(void);
const char *ts_version_string(void);
/* The plan format the library writes (mrun reads this one). */
int32_t ts_plan_format(void);
/* "ok", "option", "compile", "io", "state", "internal". */
const char *ts_status_name(TsStatus st);

/* A new session with mcc's defaults; NULL only when memory runs out. */
TsSession *ts_session_new(void);
/* Frees the session and everything it returned (NULL: nothing). */
void ts_session_free(TsSession *s);

/* One option, as mcc's command line takes it (see above). */
TsStatus ts_session_set(TsSession *s, const char *name, const char *value);

/* Compiles an MDL file (imports are found beside it and in the stdlib). */
TsStatus ts_session_compile_file(TsSession *s, const char *path);
/* Compiles MDL source text (NUL-terminated); `name` is the file name the
 * diagnostics give (and where a relative import is looked for). */
TsStatus ts_session_compile_string(TsSession *s, const char *name, const char *source);

/* The plan of the last compilation, as mcc -o writes it: *data points at
 * *size bytes the session owns. */
TsStatus ts_session_plan(TsSession *s, const void **data, size_t *size);
/* ... written to `path`, replacing it atomically (a temporary file renamed
 * over it; a failed write leaves the old file). */
TsStatus ts_session_write_plan(TsSession *s, const char *path);
/* A report of the last compilation, as `mcc --report KIND` prints it:
 * "memory", "comm", "sharding", "schedule" (pipelines) or "time" (needs the
 * option "hw").  ("kernels" is mcc's own: it reads the CUDA toolchain.) */
TsStatus ts_session_report(TsSession *s, const char *kind, const char **text);
/* The IR text: `pass` NULL or "final" for the compiled module (what mcc
 * --emit=ir prints), or the pass named by the option "print-ir-after" at
 * the last compilation (one pass per compilation). */
TsStatus ts_session_ir(TsSession *s, const char *pass, const char **text);
/* The diagnostics and warnings of the last call ("" when there were none). */
const char *ts_session_errors(const TsSession *s);

#ifdef __cplusplus
}
#endif
#endif
