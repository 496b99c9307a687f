/* dot.c - Graphviz view of a module (`dot -Tsvg`): one cluster per block,
 * a node per IR node labeled "%N op\ntype", edges from operand to user,
 * and each persistent state a box outside the clusters with an edge into
 * the nodes that read it (state) and from the nodes that write it (accum,
 * zero, adamw).  For looking at graphs; nothing parses it back. */
#include "ir.h"
#include "ir_priv.h"

/* Graphviz label text: escape what a double-quoted string cannot hold. */
static void put_label(StrBuf *out, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') sb_putc(out, '\\');
    if (*s == '\n') { sb_puts(out, "\\n"); continue; }
    sb_putc(out, *s);
  }
}

void ir_print_dot(const IrModule *m, StrBuf *out) {
  char tb[256];
  sb_puts(out, "digraph \"");
  put_label(out, m->name ? m->name : "module");
  sb_puts(out, "\" {\n  rankdir=TB;\n  node [shape=ellipse, fontname=\"monospace\", fontsize=10];\n");
  for (int i = 0; i < m->states.n; i++) {
    const IrState *s = &m->states.a[i];
    sb_printf(out, "  s%d [shape=box, style=filled, fillcolor=\"#eeeeee\", label=\"@", i);
    put_label(out, s->name);
    sb_printf(out, "\\n%s %s\"];\n", ir_state_kind_name(s->kind), ir_type_str(&s->type, tb, sizeof tb));
  }
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    sb_printf(out, "  subgraph cluster_%d {\n    label=\"block ", bi);
    put_label(out, b->name);
    sb_puts(out, "\";\n");
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      const char *opn = (int)n->op >= 0 && n->op < IR_OP_COUNT ? ir_ops[n->op].name : "?";
      int effect = (int)n->op >= 0 && n->op < IR_OP_COUNT && (ir_ops[n->op].flags & OPF_EFFECT);
      sb_printf(out, "    b%d_%d [label=\"%%%d %s", bi, i, i, opn);
      if (n->sa) { sb_puts(out, " \\\""); put_label(out, n->sa); sb_puts(out, "\\\""); }
      if (!effect) sb_printf(out, "\\n%s", ir_type_str(&n->type, tb, sizeof tb));
      sb_printf(out, "\"%s];\n", effect ? ", shape=hexagon" : "");
    }
    sb_puts(out, "  }\n");
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      for (int k = 0; k < n->nin; k++)
        if (n->in[k] >= 0 && n->in[k] < b->n) sb_printf(out, "  b%d_%d -> b%d_%d;\n", bi, n->in[k], bi, i);
      if ((int)n->op < 0 || n->op >= IR_OP_COUNT) continue;
      const IrOpAttrs *at = ir_op_attrs(n->op);
      int writes = (ir_ops[n->op].flags & OPF_EFFECT) != 0;
      for (int k = 0; k < at->ni; k++) {
        int64_t s = n->ia[k];
        if (!at->is_state[k] || s < 0 || s >= m->states.n) continue;
        /* adamw reads grad/m/v and writes param/m/v; shown as writes to all */
        if (writes) sb_printf(out, "  b%d_%d -> s%lld [style=dashed];\n", bi, i, (long long)s);
        else sb_printf(out, "  s%lld -> b%d_%d [style=dashed];\n", (long long)s, bi, i);
      }
    }
  }
  sb_puts(out, "}\n");
}
