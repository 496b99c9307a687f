/* packed.c - packed sequences: the position ids, document ids and loss
 * mask a model may declare, made from each micro batch's tokens with
 * Megatron's end-of-document rules (--reset-position-ids,
 * --reset-attention-mask, --eod-mask-loss; train.h rt_packed_inputs), and
 * the start-up check that every flag given has the input it fills.  The
 * inputs are made from the tokens the trainer is about to feed, whatever
 * the data source (indexed data, the byte corpus, mock ids), on the whole
 * global micro batch, before the rank slices out its cp / sp block, so
 * every layout sees the single-rank values. */
#include "train.h"
#include "rt_priv.h"

void rt_packed_inputs(const RtGptOpts *g, const int32_t *tokens, int64_t rows, int64_t T, int32_t *pos,
                      int32_t *doc, int32_t *mask) {
  int eod_known = g && g->has_eod;
  for (int64_t r = 0; r < rows; r++) {
    const int32_t *x = tokens + r * T;
    int64_t start = 0, d = 0;   /* the current document's first index in the row, its number */
    for (int64_t t = 0; t < T; t++) {
      int is_eod = eod_known && x[t] == g->eod;
      if (pos) pos[r * T + t] = (int32_t)(g && g->reset_position_ids ? t - start : t);
      if (doc) doc[r * T + t] = (int32_t)(g && g->reset_attention_mask ? d : 0);
      if (mask) mask[r * T + t] = g && g->eod_mask_loss && is_eod ? 0 : 1;
      if (is_eod) start = t + 1, d++;   /* the EOD ends its document: the next token starts one */
    }
  }
}

/* Whether some program declares input `name`. */
static int declares(const IrModule *const *progs, int n, const char *name) {
  for (int p = 0; p < n; p++)
    for (int b = 0; progs[p] && b < progs[p]->blocks.n; b++)
      for (int i = 0; i < progs[p]->blocks.a[b].n; i++) {
        const IrNode *x = &progs[p]->blocks.a[b].nodes[i];
        if (x->op == IR_OP_INPUT && x->sa && strcmp(x->sa, name) == 0) return 1;
      }
  return 0;
}

int rt_packed_check(const RtGptOpts *g, const IrModule *const *progs, int n, char *err, size_t errlen) {
  static const struct { const char *flag; IrFeed feed; const char *use; } need[] = {
      {"--reset-position-ids", IR_FEED_POSITION_IDS, "nn.position_embedding(x, positions: position_ids)"},
      {"--reset-attention-mask", IR_FEED_DOCUMENT_IDS, "nn.attention(docs: document_ids)"},
      {"--eod-mask-loss", IR_FEED_LOSS_MASK, "a loss weighted by it, e.g. samples/gpt_packed.mdl"},
  };
  const int on[3] = {g->reset_position_ids, g->reset_attention_mask, g->eod_mask_loss};
  for (int k = 0; k < 3; k++) {
    if (!on[k]) continue;
    if (!g->has_eod)
      return ts_errf(err, errlen, "%s needs the end-of-document token id: give --tokenizer PATH (its EOD token) "  /* internal */
                     "or --eod-id N", need[k].flag);
    if (!declares(progs, n, ir_feed_name(need[k].feed)))
      return ts_errf(err, errlen, "%s needs the model input %s (%s); this model does not declare it",
                     need[k].flag, ir_feed_name(need[k].feed), need[k].use);
  }
  return 0;
}
