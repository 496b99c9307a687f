/* gptdata_tool.c - the tests' window into runtime/data/gptdata.h: opens a
 * (blended) GPT dataset as mrun does and prints what the Python twin
 * checks.
 *
 *   gptdata_tool SPLIT PART T N SEED CACHEDIR K [W1] P1 [W2] P2 ...
 *
 * PART: train, valid or test; N: samples asked for; CACHEDIR "-": the
 * default folder; K: how many samples to print.  Prints
 *   "size S loaded L built B"
 * then samples 0 .. K-1, one line of T + 1 ids each; exit 1 with the
 * message on stderr when the data is refused. */
#include "runtime/data/gptdata.h"
#include "ir/util.h"
#include <errno.h>

static int num(const char *s, double *v) {
  char *e;
  errno = 0;
  *v = strtod(s, &e);
  return *s && !*e && !errno;
}

int main(int argc, char **argv) {
  if (argc < 9) {
    fprintf(stderr, "usage: gptdata_tool SPLIT PART T N SEED CACHEDIR K [W1] P1 [W2] P2 ...\n");
    return 2;
  }
  RtGptDataOpts o = {.split = argv[1], .seq_len = atoll(argv[3]), .num_samples = atoll(argv[4]),
                     .seed = strtoull(argv[5], NULL, 10), .cache_flag = "--data-cache-path", .flag = "--data-path"};
  for (int p = 0; p < RT_SPLIT_COUNT; p++)
    if (strcmp(argv[2], rt_split_name[p]) == 0) o.part = p;
  if (strcmp(argv[6], "-") != 0) o.cache_dir = argv[6];
  int64_t K = atoll(argv[7]);
  int nw = argc - 8;
  double v;
  int weighted = num(argv[8], &v);
  const char **pre = ts_xcalloc((size_t)nw, sizeof *pre);
  double *w = ts_xcalloc((size_t)nw, sizeof *w);
  for (int i = 0; i < (weighted ? nw / 2 : nw); i++) {
    if (weighted) num(argv[8 + 2 * i], &w[i]);
    pre[i] = argv[8 + (weighted ? 2 * i + 1 : i)];
    o.n++;
  }
  o.prefix = pre;
  o.weight = weighted ? w : NULL;
  char err[2048];
  RtGptData *d = rt_gpt_data_open(&o, stderr, err, sizeof err);
  if (!d) {
    fprintf(stderr, "gptdata_tool: %s\n", err);
    free(pre);
    free(w);
    return 1;
  }
  int loaded, built;
  rt_gpt_data_stats(d, &loaded, &built, NULL);
  printf("size %lld loaded %d built %d\n", (long long)rt_gpt_data_size(d), loaded, built);
  int32_t *buf = ts_xcalloc((size_t)o.seq_len + 1, sizeof *buf);
  int rc = 0;
  for (int64_t i = 0; i < K && rc == 0; i++) {
    if (rt_gpt_data_sample(d, i, 0, buf, err, sizeof err) != 0) {
      fprintf(stderr, "gptdata_tool: %s\n", err);
      rc = 1;
      break;
    }
    for (int64_t t = 0; t <= o.seq_len; t++) printf("%d%c", buf[t], t == o.seq_len ? '\n' : ' ');
  }
  free(buf);
  rt_gpt_data_free(d);
  free(pre);
  free(w);
  return rc;
}
