/* ir_priv.h - helpers shared by the files of ir/ only (not a public API).
 *
 * ops.def names each op's attributes as space-separated strings; this
 * header exposes them pre-split so the shape rules, printer and parser
 * agree on slots:  ia[0 .. ni-1] and fa[0 .. nf-1].  An int attr "@x" is a
 * state index; an int attr "x*" is a list that starts at slot `list` and
 * holds one entry per result dim (it is always the last int attr). */
#ifndef TS_IR_PRIV_H
#define TS_IR_PRIV_H
#include "ir.h"

typedef struct {
  int ni, nf;                          /* named int / float attrs */
  char iname[IR_MAX_IATTR][24];        /* without '@' and '*' */
  char fname[IR_MAX_FATTR][24];
  unsigned char is_state[IR_MAX_IATTR];/* "@name" */
  unsigned char is_axis[IR_MAX_IATTR]; /* "~name": a mesh axis, printed by name */
  int list;                            /* slot of the "name*" list attr, or -1 */
} IrOpAttrs;

const IrOpAttrs *ir_op_attrs(IrOp op);

/* Number of ia[] slots a node of `op` uses when its operand 0 has rank
 * `rank0` (only list attrs depend on it). */
int ir_op_iattr_count(IrOp op, int rank0);

#endif
