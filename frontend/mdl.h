/* mdl.h - the MDL frontend: source text -> IrModule with one block,
 * "forward", whose last node is `output "loss"` (the model's return value).
 * Parameters become IrStates (kind param) with their initializers; the
 * config, train and parallel blocks fill m->consts, m->train and m->par.
 * Functions are inlined, `repeat` is unrolled, config arithmetic is done
 * here: the IR has no control flow and no symbolic sizes.
 *
 * Diagnostics go to opt->diag (stderr when NULL) as
 *   file:line:col: error: message
 *       <the source line>
 *       <caret under the column>
 * and compilation stops at the end of the stage that found them. */
#ifndef TS_MDL_H
#define TS_MDL_H
#include "ir/ir.h"

typedef struct { const char *name, *value; } MdlDefine;   /* -D name=value */
/* A value set by a named command-line flag (mcc's Megatron flags, e.g.
 * "--num-layers" sets config key "layers"): the flag is for the messages. */
typedef struct { const char *name, *value, *flag; } MdlSetting;

typedef struct {
  const MdlDefine *defines; int ndefines;  /* config overrides */
  const MdlSetting *config_sets; int nconfig_sets;  /* config overrides by flags (none also in defines) */
  /* train-block overrides, applied after the block: name is a train field
   * (lr, min_lr, warmup, decay_steps, schedule, clip_grad, weight_decay,
   * beta1, beta2, eps, steps, seed, global_batch) */
  const MdlSetting *train_sets; int ntrain_sets;
  const char *stdlib_dir;                  /* where `import nn` looks; NULL: TS_SOURCE_DIR/stdlib */
  IrDtype precision;                       /* IR_VOID: the train block's (default f32) */
  int tp, pp, cp, ep, sp;                  /* -1: the parallel block's (default 1, sp 0) */
  int zero;                                /* -1: the parallel block's (default 1) */
  FILE *diag;                              /* NULL: stderr */
  const char *prog;                        /* a message without a file: "prog: error: ..." (NULL: "mcc") */
  size_t max_source_bytes;                 /* per source file (model and imports); 0: MDL_MAX_SOURCE_BYTES */
  /* the repeat whose iterations are named repeat_path.<i> (a layer stack,
   * "layers") runs repeat_count times instead of its count: mcc
   * --auto-layout costs a model from copies with 1 and 2 layers.  NULL: off */
  const char *repeat_path; int repeat_count;
} MdlOptions;

#define MDL_MAX_SOURCE_BYTES ((size_t)16 << 20)   /* mcc --max-source-bytes N overrides */

void mdl_options_init(MdlOptions *o);
/* NULL after printing diagnostics.  The caller owns the module. */
IrModule *mdl_compile_file(const char *path, const MdlOptions *opt);
IrModule *mdl_compile_string(const char *src, const char *fname, const MdlOptions *opt);

#endif
