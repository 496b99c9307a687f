/* dl.h - shared libraries loaded at run time (dlopen), never linked: the
 * CUDA driver, cuBLASLt, NVRTC, the CUDA runtime and NCCL.  The binaries
 * start on machines without them, and every layer that needs one
 * (codegen/nvrtc.c, runtime/device, runtime/comm) loads it with this one
 * table-driven loader: a library is a list of files to try and a table of
 * symbols, each written at an offset into the caller's struct of function
 * pointers.  Messages stay the caller's (it knows what the library is for
 * and what the user can do about it); the loader says what failed. */
#ifndef TS_DL_H
#define TS_DL_H
#include "util.h"
#include <pthread.h>

typedef struct { size_t off; const char *sym; } TsDlSym;   /* symbol `sym` -> field at `off` */
#define TS_DL_SYM(type, field, sym) {offsetof(type, field), sym}

typedef enum { TS_DL_OK, TS_DL_NOT_FOUND, TS_DL_NO_SYMBOL } TsDlStatus;

/* Tries files[] in order (NULL-terminated; names the dynamic loader
 * searches, or paths) and resolves syms[0..nsyms) into table.  A name
 * without '/' is also looked for in the folders of TS_CUDA_LIB_PATH (a
 * ':'-separated list, tried before the dynamic loader) and, when neither
 * finds it, in $CUDA_HOME, $CUDA_PATH and /usr/local/cuda (lib64,
 * targets/x86_64-linux/lib), the driver's /usr/local/nvidia/lib64, and the
 * nvidia/<package>/lib folders of python3's site-packages (the CUDA wheels),
 * so the libraries are found where a stock CUDA machine has them.  On success
 * returns the handle, kept open (the table's functions are used until
 * exit), with *file (if not NULL) the file loaded.  On failure NULL, with
 * *status NOT_FOUND and dlerror()'s text for the last file tried in
 * detail, or NO_SYMBOL and the missing symbol's name (the library is
 * closed again). */
void *ts_dl_load(const char *const *files, const TsDlSym *syms, int nsyms, void *table, const char **file,
                 TsDlStatus *status, char *detail, size_t n);

/* A library loaded once per process for each key (the file it comes
 * from): the outcome, success or the reason of the failure, is kept, so a
 * second device or group neither loads it again nor words the failure
 * differently.  load(key, table, why, n) loads one (0, or -1 with why);
 * the table lives as long as the process.  Thread-safe.  Returns the
 * table, or NULL with the reason in why. */
enum { TS_DL_CACHE_KEYS = 4 };
typedef struct {
  pthread_mutex_t lock;
  int n;
  struct { char key[512]; void *table; int ok; char why[384]; } e[TS_DL_CACHE_KEYS];
} TsDlCache;
#define TS_DL_CACHE_INIT {.lock = PTHREAD_MUTEX_INITIALIZER}
/* "looked in LD_LIBRARY_PATH, ..." : where ts_dl_load looks, for messages */
const char *ts_dl_where(void);

const void *ts_dl_cached(TsDlCache *c, const char *key, size_t table_size,
                         int (*load)(const char *key, void *table, char *why, size_t n), char *why, size_t n);

#endif
