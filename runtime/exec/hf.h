/* hf.h - Hugging Face weights in and out (mrun --init-from, --export DIR
 * --format hf).  What a Hugging Face tensor is in Tessera's parameters is
 * data, not code: a map file per Hugging Face architecture
 * (stdlib/hf/<model_type>.map; the language is in docs/checkpoints.md,
 * "Hugging Face weights") names each Hugging Face tensor as an expression
 * over the model's parameters (a transpose, a concatenation of q, k and v,
 * a matrix view, padded rows) and each config.json key as a value computed
 * from the model (a dim of a parameter, the number of layers, an op's
 * attribute).  Both directions read the same lines. */
#ifndef TS_HF_H
#define TS_HF_H
#include "rt.h"
#include "runtime/comm/comm.h"

typedef struct {
  const char *map;                  /* --hf-map NAME (stdlib/hf/NAME.map) or a path; NULL: from
                                       config.json's model_type (import), the map that fits (export) */
  const IrModule *const *programs;  /* the plan's programs: every parameter's name and global shape,
                                       and the ops whose attributes config.json states */
  int nprograms;
} RtHfOpts;

/* Collective: this rank's parameters from the Hugging Face weights at path
 * (a .safetensors file, or a directory with config.json and
 * model.safetensors or model.safetensors.index.json and its shards).
 * Everything is checked before anything is used: config.json against the
 * model, every parameter given exactly once, every tensor of the files
 * used (or named ignorable by the map), shapes and dtypes.  *how gets
 * "gpt2 (stdlib/hf/gpt2.map), 28 tensors".  0, or -1 with a message on
 * every rank. */
int rt_hf_init_from(RtProgram *p, RtComm *world, const RtHfOpts *o, const char *path, char *how, size_t howlen,
                    char *err, size_t errlen);

/* Collective: every parameter gathered to world rank 0, which writes
 * dir/model.safetensors and dir/config.json (transformers'
 * from_pretrained loads them).  0, or -1 with a message on every rank. */
int rt_hf_export(RtProgram *p, RtComm *world, const RtHfOpts *o, const char *dir, char *how, size_t howlen, char *err,
                 size_t errlen);

/* The directory of the map files: $TESSERA_STDLIB/hf if set and
 * non-empty, else stdlib/hf of ts_data_root() (an installed tree's, or the
 * source tree's). */
const char *rt_hf_map_dir(char *buf, size_t n);

#endif
