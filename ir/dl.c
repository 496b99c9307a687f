/* dl.c - the run-time library loader (dl.h). */
#include "dl.h"
#include <dlfcn.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- where a library the dynamic loader does not find by name is looked
 * for (dl.h, ts_dl_load) ---- */

typedef struct {
  char **dir;
  int n, cap;
} DirList;

static void dirs_add(DirList *l, const char *d) {
  struct stat st;
  if (!d || !*d || stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) return;
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->dir[i], d)) return;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->dir = ts_xrealloc(l->dir, (size_t)l->cap * sizeof *l->dir);
  }
  l->dir[l->n++] = ts_xstrdup(d);
}

/* each folder of a ':'-separated list */
static void dirs_add_list(DirList *l, const char *list) {
  if (!list) return;
  char *copy = ts_xstrdup(list), *save = NULL;
  for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) dirs_add(l, d);
  free(copy);
}

/* the nvidia/<package>/lib folders of python3's site-packages (the CUDA
 * wheels: nvidia-cuda-nvrtc, nvidia-cublas, nvidia-nccl, ...) */
static void dirs_add_python(DirList *l, int *found) {
  *found = 0;
  FILE *f = popen("python3 -c 'import sys; print(\"\\n\".join(p for p in sys.path if p))' 2>/dev/null", "r");
  if (!f) return;
  char line[4096];
  int lines = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    line[strcspn(line, "\n")] = 0;
    for (int k = 0; k < 2; k++) {
      char pat[4200];
      snprintf(pat, sizeof pat, "%s/nvidia/*/%s", line, k ? "lib64" : "lib");
      glob_t g;
      if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
          int before = l->n;
          dirs_add(l, g.gl_pathv[i]);
          *found += l->n > before;
        }
        globfree(&g);
      }
    }
  }
  if (pclose(f) != 0 && lines == 0) *found = -1;   /* no python3 to ask */
}

static struct {
  pthread_once_t once, py_once;
  DirList over, fixed, python;   /* TS_CUDA_LIB_PATH's; the toolkit's and the driver's; python3's */
  int npython, py_asked;
  char where[768];
} search = {.once = PTHREAD_ONCE_INIT, .py_once = PTHREAD_ONCE_INIT};

static void search_init(void) {
  dirs_add_list(&search.over, getenv("TS_CUDA_LIB_PATH"));
  const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
  for (int i = 0; i < 3; i++) {
    if (!homes[i] || !*homes[i]) continue;
    char d[1024];
    snprintf(d, sizeof d, "%s/lib64", homes[i]);
    dirs_add(&search.fixed, d);
    snprintf(d, sizeof d, "%s/targets/x86_64-linux/lib", homes[i]);
    dirs_add(&search.fixed, d);
  }
  dirs_add(&search.fixed, "/usr/local/nvidia/lib64");   /* the driver, as container runtimes mount it */
  dirs_add(&search.fixed, "/usr/local/nvidia/lib");
  dirs_add(&search.fixed, "/usr/lib/wsl/lib");
}

/* python3 is asked only for a library the other places lack, and never
 * for the driver (no wheel has it): mrun starts on a machine without a
 * GPU without running python3 */
static void python_init(void) {
  dirs_add_python(&search.python, &search.npython);
  search.py_asked = 1;
}

static void where_init(void) {
  size_t w = 0, cap = sizeof search.where;
  char *s = search.where;
#define W(...) do { if (w < cap) w += (size_t)snprintf(s + w, cap - w, __VA_ARGS__); } while (0)
  W("looked in %sLD_LIBRARY_PATH, the ld.so cache", search.over.n ? "TS_CUDA_LIB_PATH, " : "");
  for (int i = 0; i < search.fixed.n; i++) W(", %s", search.fixed.dir[i]);
  if (search.py_asked && search.npython < 0) W(", python3's site-packages (no python3 to ask)");
  else if (search.py_asked)
    W(", %d nvidia/*/lib folder%s of python3's site-packages", search.npython, search.npython == 1 ? "" : "s");
  W("; TS_CUDA_LIB_PATH=DIR[:DIR...] adds folders");
#undef W
}

const char *ts_dl_where(void) {
  pthread_once(&search.once, search_init);
  where_init();
  return search.where;
}

/* Tries name in each folder of l that has it; NULL when none loads. */
static void *try_dirs(const DirList *l, const char *name, char **path, char *detail, size_t n) {
  for (int i = 0; i < l->n; i++) {
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", l->dir[i], name);
    if (access(p, F_OK) != 0) continue;
    void *h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (h) {
      *path = ts_xstrdup(p);
      return h;
    }
    const char *e = dlerror();
    if (n) snprintf(detail, n, "%s", e ? e : "cannot be loaded");
  }
  return NULL;
}

/* the paths of the libraries loaded from a folder searched here: they
 * stay loaded, and *file may point at one, so they live as long as the
 * process (held here, not leaked) */
static struct {
  pthread_mutex_t mu;
  VEC(char *) v;
} kept_paths = {.mu = PTHREAD_MUTEX_INITIALIZER};

void *ts_dl_load(const char *const *files, const TsDlSym *syms, int nsyms, void *table, const char **file,
                 TsDlStatus *status, char *detail, size_t n) {
  void *h = NULL;
  int i = 0;
  char *found = NULL;   /* a path made here (kept: the library stays loaded) */
  if (n) detail[0] = 0;
  pthread_once(&search.once, search_init);
  for (int k = 0; files[k] && !h && search.over.n; k++)   /* the override first */
    if (!strchr(files[k], '/')) h = try_dirs(&search.over, files[k], &found, detail, n);
  for (; !h && files[i]; i++) {
    if ((h = dlopen(files[i], RTLD_NOW | RTLD_LOCAL))) break;
    const char *e = dlerror();
    if (n) snprintf(detail, n, "%s", e ? e : "not found");
  }
  int searched = 0;
  for (int k = 0; files[k] && !h; k++)
    if (!strchr(files[k], '/')) {
      searched = 1;
      h = try_dirs(&search.fixed, files[k], &found, detail, n);
      if (!h && strncmp(files[k], "libcuda.so", 10) != 0) {
        pthread_once(&search.py_once, python_init);
        h = try_dirs(&search.python, files[k], &found, detail, n);
      }
    }
  if (!h) {
    if (searched && n) snprintf(detail, n, "not found (%s)", ts_dl_where());
    *status = TS_DL_NOT_FOUND;
    return NULL;
  }
  for (int s = 0; s < nsyms; s++) {
    void *f = dlsym(h, syms[s].sym);
    if (!f) {
      if (n) snprintf(detail, n, "%s", syms[s].sym);
      dlclose(h);
      free(found);
      *status = TS_DL_NO_SYMBOL;
      return NULL;
    }
    memcpy((char *)table + syms[s].off, &f, sizeof f);
  }
  if (found) {
    pthread_mutex_lock(&kept_paths.mu);
    VEC_PUSH(kept_paths.v, found);
    pthread_mutex_unlock(&kept_paths.mu);
  }
  if (file) *file = found ? found : files[i];
  *status = TS_DL_OK;
  return h;
}

const void *ts_dl_cached(TsDlCache *c, const char *key, size_t table_size,
                         int (*load)(const char *key, void *table, char *why, size_t n), char *why, size_t n) {
  pthread_mutex_lock(&c->lock);
  int i = 0;
  while (i < c->n && strcmp(c->e[i].key, key) != 0) i++;
  if (i == c->n) {
    if (c->n == TS_DL_CACHE_KEYS || strlen(key) >= sizeof c->e[0].key) {
      pthread_mutex_unlock(&c->lock);
      ts_errf(why, n, "cannot load %s: too many library paths in one process", key);
      return NULL;
    }
    snprintf(c->e[i].key, sizeof c->e[i].key, "%s", key);
    c->e[i].table = ts_xcalloc(1, table_size);
    c->e[i].ok = load(key, c->e[i].table, c->e[i].why, sizeof c->e[i].why) == 0;
    c->n++;
  }
  pthread_mutex_unlock(&c->lock);
  if (!c->e[i].ok) {
    ts_errf(why, n, "%s", c->e[i].why);
    return NULL;
  }
  return c->e[i].table;
}
