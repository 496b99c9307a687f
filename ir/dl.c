/* dl.c - the run-time library loader (dl.h). */
#include "dl.h"
#include <dlfcn.h>

void *ts_dl_load(const char *const *files, const TsDlSym *syms, int nsyms, void *table, const char **file,
                 TsDlStatus *status, char *detail, size_t n) {
  void *h = NULL;
  int i = 0;
  if (n) detail[0] = 0;
  for (; files[i] && !h; i++) {
    if ((h = dlopen(files[i], RTLD_NOW | RTLD_LOCAL))) break;
    const char *e = dlerror();
    if (n) snprintf(detail, n, "%s", e ? e : "not found");
  }
  if (!h) {
    *status = TS_DL_NOT_FOUND;
    return NULL;
  }
  for (int s = 0; s < nsyms; s++) {
    void *f = dlsym(h, syms[s].sym);
    if (!f) {
      if (n) snprintf(detail, n, "%s", syms[s].sym);
      dlclose(h);
      *status = TS_DL_NO_SYMBOL;
      return NULL;
    }
    memcpy((char *)table + syms[s].off, &f, sizeof f);
  }
  if (file) *file = files[i];
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
