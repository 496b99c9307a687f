/* feeds.c - the list of model inputs a data pipeline feeds (ir.h "the
 * model inputs a data pipeline feeds"): the one place both mcc's check of
 * a model's signature and mrun's feeding read, so they cannot disagree. */
#include "ir.h"

static const char *const feed_names[IR_FEED_COUNT] = {
    [IR_FEED_TOKENS] = "tokens",
    [IR_FEED_TARGETS] = "targets",
    [IR_FEED_LOSS_MASK] = "loss_mask",
    [IR_FEED_POSITION_IDS] = "position_ids",
    [IR_FEED_DOCUMENT_IDS] = "document_ids",
};

int ir_feed_find(const char *name) {
  for (int f = 0; name && f < IR_FEED_COUNT; f++)
    if (strcmp(name, feed_names[f]) == 0) return f;
  return -1;
}

const char *ir_feed_name(IrFeed f) { return f >= 0 && f < IR_FEED_COUNT ? feed_names[f] : "?"; }

/* A literal, not built at run time: callers may be on several threads.
 * The assert makes a new feed update it. */
_Static_assert(IR_FEED_COUNT == 5, "ir_feed_list names every feed");
const char *ir_feed_list(void) { return "tokens, targets, loss_mask, position_ids, document_ids"; }

int ir_feed_dtype_ok(IrFeed f, IrDtype d) {
  if (f == IR_FEED_LOSS_MASK) return d == IR_F32 || d == IR_F64 || d == IR_I32;
  return d == IR_I32;
}
