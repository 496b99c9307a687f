/* fuzz_safetensors.c - libFuzzer target for the safetensors reader
 * (runtime/exec/safetensors.c, and under it the JSON reader ir/json.c).
 * The input is a whole file.  Whatever the reader accepts must be
 * readable (every element of every float tensor) and must round-trip:
 * its F32 and F64 tensors written by rt_st_encode and read back give the
 * same names, shapes and values, bit for bit (a NaN may come back as
 * another NaN: values pass through double).  abort() otherwise.  Built with clang's
 * -fsanitize=fuzzer,address,undefined by tests/hf/CMakeLists.txt; a crash,
 * a hang, a leak or a broken round trip fails the run. */
#include "runtime/exec/safetensors.h"
#include <stdlib.h>
#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[1024];
  RtStFile f = {0};
  if (rt_st_parse(&f, data, size, "<fuzz>", err, sizeof err) == 0) {
    RtStOut *out = calloc((size_t)f.n + 1, sizeof *out);
    double **vals = calloc((size_t)f.n + 1, sizeof *vals);
    int n = 0;
    double sink = 0;
    for (int i = 0; i < f.n; i++) {
      const RtStTensor *t = &f.a[i];
      if (!rt_st_dtype_is_float(t->dtype)) continue;
      double *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
      for (int64_t k = 0; k < t->numel; k++) sink += (v[k] = rt_st_get(t, k));
      if (t->dtype == RT_ST_F32 || t->dtype == RT_ST_F64) {
        out[n] = (RtStOut){t->name, t->dtype, t->rank, {0}, v};
        memcpy(out[n].dim, t->dim, sizeof out[n].dim);
        vals[n++] = v;
      } else
        free(v);
    }
    (void)sink;
    StrBuf b = {0};
    rt_st_encode(&b, out, n);
    RtStFile g = {0};
    if (rt_st_parse(&g, b.p, b.n, "<fuzz: written back>", err, sizeof err) != 0) {
      fprintf(stderr, "fuzz_safetensors: the writer's file is refused: %s\n", err);
      abort();
    }
    if (g.n != n) { fprintf(stderr, "fuzz_safetensors: %d tensors written, %d read back\n", n, g.n); abort(); }
    for (int i = 0; i < n; i++) {
      const RtStTensor *t = rt_st_find(&g, out[i].name), *s = rt_st_find(&f, out[i].name);
      int same = t && t->dtype == s->dtype && t->rank == s->rank && !memcmp(t->dim, s->dim, sizeof t->dim) &&
                 t->bytes == s->bytes;
      for (int64_t k = 0; same && k < s->numel; k++) {
        double x = rt_st_get(t, k), y = rt_st_get(s, k);
        same = (isnan(x) && isnan(y)) || !memcmp(&x, &y, sizeof x);
      }
      if (!same) {
        fprintf(stderr, "fuzz_safetensors: tensor '%s' differs after writing and reading back\n", out[i].name);
        abort();
      }
    }
    rt_st_close(&g);
    sb_free(&b);
    for (int i = 0; i < n; i++) free(vals[i]);
    free(vals);
    free(out);
  }
  rt_st_close(&f);
  return 0;
}
