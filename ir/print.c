/* print.c - the IR text form (docs/ir.md), written so that
 * ir_print_module(ir_parse_module(text)) == text for any printed module:
 * every attr is always printed, in ops.def order, floats in their
 * shortest round-trip form.  A module ends with the line `end` so that
 * several can follow one another (the plan text). */
#include "ir.h"
#include "ir_priv.h"

static void put_double(StrBuf *out, double x) {
  char buf[64];
  ts_fmt_double(buf, sizeof buf, x);
  sb_puts(out, buf);
}

static void put_type(StrBuf *out, const IrType *t) {
  sb_printf(out, "%s[", ir_dtype_name(t->dtype));
  for (int i = 0; i < t->rank && i < IR_MAX_RANK; i++) {
    if (i) sb_puts(out, ", ");
    if (t->dname[i]) sb_printf(out, "%s:", t->dname[i]);
    sb_printf(out, "%lld", (long long)t->dim[i]);
  }
  sb_putc(out, ']');
}

/* Double-quoted, with \" \\ \n \t and \xHH for other control bytes, so a
 * string never breaks the one-item-per-line structure. */
static void put_string(StrBuf *out, const char *s) {
  sb_putc(out, '"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') { sb_putc(out, '\\'); sb_putc(out, (char)c); }
    else if (c == '\n') sb_puts(out, "\\n");
    else if (c == '\t') sb_puts(out, "\\t");
    else if (c < 0x20 || c == 0x7f) sb_printf(out, "\\x%02x", c);
    else sb_putc(out, (char)c);
  }
  sb_putc(out, '"');
}

/* " {1:tp, partial:dp}" after a type; nothing when unsharded. */
static void put_sharding(StrBuf *out, const IrSharding *sh, int rank) {
  char buf[256];
  ir_sharding_str(sh, rank, buf, sizeof buf);
  if (buf[0]) { sb_putc(out, ' '); sb_puts(out, buf); }
}

static void put_state_ref(const IrModule *m, StrBuf *out, int64_t idx) {
  if (idx >= 0 && idx < m->states.n) sb_printf(out, "@%s", m->states.a[idx].name);
  else sb_printf(out, "@<bad state %lld>", (long long)idx);   /* only in broken modules */
}

/* One node, without indentation or newline:
 *   %N = op ["sa"] %a, %b @state... key=value... : type      (values)
 *   op ["sa"] %a @state... key=value...                       (effects) */
void ir_print_node(const IrModule *m, const IrBlock *b, int id, StrBuf *out) {
  const IrNode *n = &b->nodes[id];
  if ((int)n->op < 0 || n->op >= IR_OP_COUNT) { sb_printf(out, "%%%d = <bad op %d>", id, (int)n->op); return; }
  const IrOpInfo *info = &ir_ops[n->op];
  const IrOpAttrs *at = ir_op_attrs(n->op);
  int effect = (info->flags & OPF_EFFECT) != 0;
  if (!effect) sb_printf(out, "%%%d = ", id);
  sb_puts(out, info->name);
  if (n->sa) { sb_putc(out, ' '); put_string(out, n->sa); }
  for (int i = 0; i < n->nin; i++) sb_printf(out, "%s%%%d", i ? ", " : " ", n->in[i]);
  for (int i = 0; i < at->ni; i++)
    if (at->is_state[i]) { sb_putc(out, ' '); put_state_ref(m, out, n->ia[i]); }
  for (int i = 0; i < at->ni; i++) {
    if (at->is_state[i]) continue;
    if (i == at->list) {
      /* one entry per result dim (= operand dims for permute) */
      int len = ir_op_iattr_count(n->op, effect ? 0 : n->type.rank) - at->list;
      sb_printf(out, " %s=[", at->iname[i]);
      for (int k = 0; k < len; k++) sb_printf(out, "%s%lld", k ? ", " : "", (long long)n->ia[i + k]);
      sb_putc(out, ']');
    } else if (at->is_axis[i]) {
      char ax[32];
      sb_printf(out, " %s=%s", at->iname[i], ir_axes_str(n->ia[i], ax, sizeof ax));
    } else {
      sb_printf(out, " %s=%lld", at->iname[i], (long long)n->ia[i]);
    }
  }
  for (int i = 0; i < at->nf; i++) {
    sb_printf(out, " %s=", at->fname[i]);
    put_double(out, n->fa[i]);
  }
  if (!effect) { sb_puts(out, " : "); put_type(out, &n->type); put_sharding(out, &n->sh, n->type.rank); }
  if (n->group > 0) sb_printf(out, " group=%d", n->group);
  if (n->stage > 0) sb_printf(out, " stage=%d", n->stage);
}

static void print_state(const IrModule *m, const IrState *s, StrBuf *out) {
  sb_printf(out, "state @%s : ", s->name);
  put_type(out, &s->type);
  put_sharding(out, &s->sh, s->type.rank);
  sb_printf(out, " %s", ir_state_kind_name(s->kind));
  if (s->kind == IR_STATE_PARAM) {
    sb_printf(out, " init=%s", ir_init_kind_name(s->init));
    if (s->init == IR_INIT_NORMAL || s->init == IR_INIT_UNIFORM) {
      sb_putc(out, '(');
      put_double(out, s->init_a);
      sb_puts(out, ", ");
      put_double(out, s->init_b);
      sb_putc(out, ')');
    }
  } else if (s->kind == IR_STATE_SCALER || s->kind == IR_STATE_FP8) {
    sb_puts(out, " start=");
    put_double(out, s->init_a);
  } else if (s->kind != IR_STATE_CACHE) {
    sb_puts(out, " of=");
    put_state_ref(m, out, s->of);
  }
  if (s->flags & IR_STATE_NODECAY) sb_puts(out, " nodecay");
  if (s->flags & IR_STATE_SHARDED) sb_puts(out, " sharded");
  int padded = 0;
  for (int d = 0; d < s->type.rank; d++) padded |= s->logical[d] != 0;
  if (padded) {
    sb_puts(out, " logical=[");
    for (int d = 0; d < s->type.rank; d++) sb_printf(out, "%s%lld", d ? ", " : "", (long long)s->logical[d]);
    sb_putc(out, ']');
  }
  sb_putc(out, '\n');
}

void ir_print_module(const IrModule *m, StrBuf *out) {
  sb_printf(out, "module %s\n", m->name ? m->name : "module");
  for (int i = 0; i < m->consts.n; i++) {
    const IrConst *c = &m->consts.a[i];
    sb_printf(out, "const %s = ", c->name);
    if (c->is_float) put_double(out, c->f);
    else sb_printf(out, "%lld", (long long)c->i);
    sb_putc(out, '\n');
  }
  const IrTrain *t = &m->train;
  sb_puts(out, "train lr=");        put_double(out, t->lr);
  sb_puts(out, " beta1=");          put_double(out, t->beta1);
  sb_puts(out, " beta2=");          put_double(out, t->beta2);
  sb_puts(out, " eps=");            put_double(out, t->eps);
  sb_puts(out, " weight_decay=");   put_double(out, t->weight_decay);
  sb_printf(out, " schedule=%s warmup=%lld decay_steps=%lld", ir_schedule_name(t->schedule),
            (long long)t->warmup, (long long)t->decay_steps);
  if (t->schedule == IR_SCHED_WSD)
    sb_printf(out, " wsd_style=%s wsd_decay_steps=%lld", ir_wsd_style_name(t->wsd_style), (long long)t->wsd_decay_steps);
  sb_puts(out, " min_lr=");         put_double(out, t->min_lr);
  sb_puts(out, " clip_grad=");      put_double(out, t->clip_grad);
  if (t->optimizer != IR_OPT_ADAMW) {   /* printed only when not adamw: adamw's lines stay as they were */
    sb_printf(out, " optimizer=%s", ir_optimizer_name(t->optimizer));
    if (t->optimizer == IR_OPT_SGD) { sb_puts(out, " momentum="); put_double(out, t->momentum); }
    if (t->optimizer == IR_OPT_MUON) {
      sb_puts(out, " muon_momentum="); put_double(out, t->muon_momentum);
      sb_printf(out, " muon_ns_steps=%d", t->muon_ns_steps);
      if (t->muon_adamw_lr > 0) { sb_puts(out, " muon_adamw_lr="); put_double(out, t->muon_adamw_lr); }
      if (t->muon_tp != IR_MUON_TP_AUTO) sb_printf(out, " muon_tp=%s", ir_muon_tp_name(t->muon_tp));
    }
    if (t->optimizer == IR_OPT_SGD || t->optimizer == IR_OPT_MUON) sb_printf(out, " nesterov=%d", t->nesterov);
  }
  if (ir_train_rampup(t))   /* printed only when on: other plans' lines stay as they were */
    sb_printf(out, " rampup_start=%lld rampup_incr=%lld rampup_samples=%lld", (long long)t->rampup_start,
              (long long)t->rampup_incr, (long long)t->rampup_samples);
  sb_printf(out, " global_batch=%lld micro_batch=%lld seq_len=%lld steps=%lld seed=%llu precision=%s\n",
            (long long)t->global_batch, (long long)t->micro_batch, (long long)t->seq_len,
            (long long)t->steps, (unsigned long long)t->seed, ir_dtype_name(t->lowp != IR_VOID ? t->lowp : t->precision));
  const IrParallel *p = &m->par;
  sb_printf(out, "parallel tp=%d pp=%d cp=%d ep=%d dp=%d sp=%d zero=%d", p->tp, p->pp, p->cp, p->ep, p->dp,
            p->sp, p->zero);
  if (p->pp > 1)
    sb_printf(out, " vpp=%d schedule=%s stage=%d", p->vpp, ir_pipe_sched_name((IrPipeSched)p->sched), p->stage);
  sb_putc(out, '\n');
  for (int i = 0; i < m->rules.n; i++) {
    sb_printf(out, "rule %s =", m->rules.a[i].dim);
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (m->rules.a[i].axes & (1u << a)) sb_printf(out, " %s", ir_axis_name((IrAxis)a));
    sb_putc(out, '\n');
  }
  for (int i = 0; i < m->states.n; i++) print_state(m, &m->states.a[i], out);
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    sb_printf(out, "block %s {\n", b->name);
    for (int i = 0; i < b->n; i++) {
      sb_puts(out, "  ");
      ir_print_node(m, b, i, out);
      sb_putc(out, '\n');
    }
    sb_puts(out, "}\n");
  }
  sb_puts(out, "end\n");
}
