/* driver.c - the frontend's entry points (mdl.h): read the main file,
 * parse it, find and parse its imports (and theirs), check what each kind
 * of file may contain, then hand everything to the elaborator (elab.h).
 *
 * Import resolution for `import NAME` in file F:
 *   1. NAME.mdl in F's directory;
 *   2. NAME.mdl in the standard library: opt->stdlib_dir if set, else
 *      $TESSERA_STDLIB if set and non-empty, else ts_data_root()/stdlib
 *      (an installed tree's share/tessera, else the source tree).
 * A module is parsed once however often it is imported.  Cycles and
 * missing modules are errors at the `import` that causes them.  Imported
 * (library) modules may contain only `fn` items, imports and a `rules`
 * block (default sharding rules, which the model's own rules override);
 * the main file must contain exactly one `model`.
 *
 * Everything parsed lives in one Arena freed before returning; the IrModule
 * returned owns its own memory. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include "frontend/elab.h"

void mdl_options_init(MdlOptions *o) {
  memset(o, 0, sizeof *o);
  o->defines = NULL;
  o->ndefines = 0;
  o->stdlib_dir = NULL;
  o->precision = IR_VOID;
  o->tp = o->pp = o->cp = o->ep = o->sp = o->zero = -1;
  o->diag = NULL;
  o->max_source_bytes = MDL_MAX_SOURCE_BYTES;
}

static size_t source_limit(const MdlOptions *o) {
  return o && o->max_source_bytes ? o->max_source_bytes : MDL_MAX_SOURCE_BYTES;
}

typedef struct {
  Arena arena;
  MdlDiag diag;
  const MdlOptions *opt;
  VEC(MdlModuleRef) mods;              /* loaded library modules */
  VEC(const char *) loading;           /* import chain being resolved, for cycles */
  char *main_real;                     /* realpath of the main file (heap), or NULL */
  const char *main_name;               /* its name without directory and .mdl */
} Driver;

static const char *stdlib_dir(const MdlOptions *opt) {
  if (opt->stdlib_dir) return opt->stdlib_dir;
  const char *env = getenv("TESSERA_STDLIB");
  if (env && *env) return env;
  static char dir[4200];
  if (!dir[0]) snprintf(dir, sizeof dir, "%s/stdlib", ts_data_root());
  return dir;
}

/* Directory part of a path, "" when it has none. */
static const char *dir_of(Arena *a, const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? arena_strndup(a, path, (size_t)(slash - path + 1)) : "";
}

/* Text must not contain NUL bytes (the parser works on C strings): report
 * the first one where it is.  0 if clean. */
static int check_nul(Driver *dr, const char *file, const char *src, size_t len) {
  size_t n = strlen(src);
  if (n == len) return 0;
  MdlLoc at = { file, 1, 1 };
  for (size_t i = 0; i < n; i++) {
    if (src[i] == '\n') { at.line++; at.col = 1; }
    else at.col++;
  }
  mdl_error(&dr->diag, at, "invalid character: NUL byte (is this a text file?)");
  return -1;
}

/* Names defined twice in one file: two fn items (or a fn and the model)
 * of one name, two parameters of one fn or model with one name.  Each is
 * an error at the second, with a note at the first.  0 if none. */
static int check_definitions(Driver *dr, const MdlProgram *p) {
  int bad = 0;
  int n = p->nfuncs + (p->model ? 1 : 0);
  for (int i = 0; i < n; i++) {
    const MdlFunc *f = i < p->nfuncs ? p->funcs[i] : p->model;
    for (int j = 0; j < i; j++) {
      const MdlFunc *g = j < p->nfuncs ? p->funcs[j] : p->model;
      if (strcmp(f->name, g->name) != 0) continue;
      const MdlFunc *first = g->loc.line < f->loc.line || (g->loc.line == f->loc.line && g->loc.col < f->loc.col) ? g : f;
      const MdlFunc *second = first == g ? f : g;
      if (f->is_model || g->is_model)
        mdl_error(&dr->diag, second->loc, "'%s' names both the model and a fn; rename one", f->name);
      else
        mdl_error(&dr->diag, second->loc, "fn '%s' is defined twice; rename one", f->name);
      mdl_note(&dr->diag, first->loc, "the first definition of '%s' is here", f->name);
      bad = 1;
      break;
    }
    for (int a = 0; a < f->ndecls; a++)
      for (int b = 0; b < a; b++)
        if (strcmp(f->decls[a].name, f->decls[b].name) == 0) {
          mdl_error(&dr->diag, f->decls[a].loc, "%s '%s' has two parameters named '%s'", f->is_model ? "model" : "fn",
                    f->name, f->decls[a].name);
          mdl_note(&dr->diag, f->decls[b].loc, "the first '%s' is here", f->decls[a].name);
          bad = 1;
          break;
        }
  }
  return bad ? -1 : 0;
}

static MdlProgram *parse_text(Driver *dr, const char *src, size_t len, const char *file) {
  file = ts_intern(file);
  char *copy = arena_strndup(&dr->arena, src, len);   /* kept for the diag's source lines */
  mdl_diag_add_source(&dr->diag, file, copy);
  if (check_nul(dr, file, src, len)) return NULL;
  MdlProgram *p = mdl_parse(copy, file, &dr->arena, &dr->diag);
  return p && check_definitions(dr, p) == 0 ? p : NULL;
}

static int load_imports(Driver *dr, const MdlProgram *p);

/* A library module: only fn items, imports and rules (defaults for every
 * model importing it; config, train and parallel belong to one model). */
static int check_library(Driver *dr, const MdlProgram *p, const char *name) {
  int bad = 0;
  const char *what = NULL;
  MdlLoc at = { p->file, 1, 1 };
  if (p->model) { what = "a 'model'"; at = p->model_loc; }
  else if (p->nconfig) { what = "a 'config' block"; at = p->config[0].loc; }
  else if (p->ntrain) { what = "a 'train' block"; at = p->train[0].loc; }
  else if (p->nparallel) { what = "a 'parallel' block"; at = p->parallel[0].loc; }
  if (what) {
    mdl_error(&dr->diag, at,
              "module '%s' is imported, so it is a library and may contain only 'fn' items, "
              "imports and 'rules', not %s", name, what);
    bad = 1;
  }
  return bad ? -1 : 0;
}

/* Reports "import cycle: a -> b -> a": the chain from loading[from] (or
 * from the main file, from = -1) to `name`.  Returns -1. */
static int import_cycle(Driver *dr, int from, const char *name, MdlLoc at) {
  StrBuf chain = {0};
  if (from < 0) { sb_printf(&chain, "%s -> ", dr->main_name); from = 0; }
  for (int j = from; j < dr->loading.n; j++) sb_printf(&chain, "%s -> ", dr->loading.a[j]);
  sb_puts(&chain, name);
  mdl_error(&dr->diag, at, "import cycle: %s", chain.p);
  sb_free(&chain);
  return -1;
}

/* Finds, parses and checks module `name` imported at `at` from file
 * `from`, then its own imports.  0 on success. */
static int load_module(Driver *dr, const char *name, MdlLoc at, const char *from) {
  for (int i = 0; i < dr->mods.n; i++)
    if (dr->mods.a[i].name == name) return 0;           /* already loaded */
  for (int i = 0; i < dr->loading.n; i++)
    if (dr->loading.a[i] == name) return import_cycle(dr, i, name, at);

  const char *local = arena_printf(&dr->arena, "%s%s.mdl", dir_of(&dr->arena, from), name);
  const char *lib = arena_printf(&dr->arena, "%s/%s.mdl", stdlib_dir(dr->opt), name);
  const char *path = NULL;
  size_t len = 0;
  char *src = NULL;
  int err = 0;
  const char *tries[2] = { from[0] == '<' ? NULL : local, lib };   /* "<string>": no directory */
  for (int i = 0; i < 2 && !src; i++) {
    if (!tries[i]) continue;
    errno = 0;
    src = ts_read_input_max(tries[i], source_limit(dr->opt), &len);
    if (src) path = tries[i];
    else if (errno != ENOENT && !err) { err = errno; path = tries[i]; }
  }
  if (!src) {
    if (err == EFBIG)
      mdl_error(&dr->diag, at, "module '%s' at '%s' is larger than %zu bytes, the limit on an MDL source "
                "(mcc --max-source-bytes N raises it)", name, path, source_limit(dr->opt));
    else if (err)
      mdl_error(&dr->diag, at, "cannot read module '%s' at '%s': %s", name, path, strerror(err));
    else if (tries[0])
      mdl_error(&dr->diag, at, "cannot find module '%s' (looked for '%s' and '%s')", name, tries[0], lib);
    else
      mdl_error(&dr->diag, at, "cannot find module '%s' (looked for '%s')", name, lib);
    return -1;
  }
  if (dr->main_real) {
    char *real = realpath(path, NULL);
    int self = real && !strcmp(real, dr->main_real);
    free(real);
    if (self) { free(src); return import_cycle(dr, -1, name, at); }
  }
  MdlProgram *p = parse_text(dr, src, len, path);
  free(src);
  if (!p) return -1;
  if (check_library(dr, p, name)) return -1;

  VEC_PUSH(dr->loading, name);
  int rc = load_imports(dr, p);
  dr->loading.n--;
  if (rc) return -1;
  MdlModuleRef ref = { name, p };
  VEC_PUSH(dr->mods, ref);      /* after its imports: dependencies come first */
  return 0;
}

static int load_imports(Driver *dr, const MdlProgram *p) {
  int rc = 0;
  for (int i = 0; i < p->nimports; i++)
    if (load_module(dr, p->imports[i], p->import_locs[i], p->file)) rc = -1;
  return rc;
}

static IrModule *compile(const char *src, size_t len, const char *fname, const MdlOptions *opt_in) {
  MdlOptions defaults;
  if (!opt_in) { mdl_options_init(&defaults); opt_in = &defaults; }
  Driver dr;
  memset(&dr, 0, sizeof dr);
  dr.opt = opt_in;
  arena_init(&dr.arena);
  mdl_diag_init(&dr.diag, opt_in->diag ? opt_in->diag : stderr);
  dr.diag.prog = opt_in->prog;

  IrModule *m = NULL;
  MdlProgram *main = parse_text(&dr, src, len, fname);
  if (main) {
    /* The main file is the first link of any import chain: an import
     * that resolves to it (same file on disk) is a cycle. */
    dr.main_real = main->file[0] != '<' ? realpath(main->file, NULL) : NULL;
    const char *base = strrchr(main->file, '/');
    base = base ? base + 1 : main->file;
    size_t blen = strlen(base);
    dr.main_name = blen > 4 && !strcmp(base + blen - 4, ".mdl") ? ts_intern_n(base, blen - 4)
                                                                  : ts_intern(base);
    int rc = load_imports(&dr, main);
    if (!main->model) {
      MdlLoc at = { main->file, 1, 1 };
      mdl_error(&dr.diag, at, "no model: the main file must declare exactly one 'model'");
      rc = -1;
    }
    if (rc == 0 && dr.diag.nerrors == 0)
      m = mdl_elaborate(main, dr.mods.a, dr.mods.n, opt_in, &dr.diag);
  }
  if (m && dr.diag.nerrors) {     /* an elaborator that reported yet returned a module */
    ir_module_free(m);
    m = NULL;
  }
  free(dr.mods.a);
  free(dr.loading.a);
  free(dr.main_real);
  mdl_diag_free(&dr.diag);
  arena_free(&dr.arena);
  return m;
}

IrModule *mdl_compile_file(const char *path, const MdlOptions *opt) {
  size_t len = 0;
  char *src = ts_read_input_max(path, source_limit(opt), &len);
  if (!src) {
    int e = errno;
    FILE *out = opt && opt->diag ? opt->diag : stderr;
    if (e == EFBIG)
      fprintf(out, "%s: error: '%s' is larger than %zu bytes, the limit on an MDL source (--max-source-bytes N "
              "raises it)\n", opt && opt->prog ? opt->prog : "mcc", path, source_limit(opt));
    else
      fprintf(out, "%s: error: cannot read '%s': %s\n", opt && opt->prog ? opt->prog : "mcc", path, strerror(e));
    return NULL;
  }
  IrModule *m = compile(src, len, path, opt);
  free(src);
  return m;
}

IrModule *mdl_compile_string(const char *src, const char *fname, const MdlOptions *opt) {
  return compile(src, strlen(src), fname ? fname : "<string>", opt);
}
