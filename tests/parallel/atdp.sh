#!/usr/bin/env bash
# atdp.sh - a plan run at another dp than it was compiled for (issue 19,
# pipelines at any dp): mrun respecializes every rank's program for the
# run's dp (pass_respecialize_dp: the update block, ZeRO-1's chunks, the
# overlapped buckets that follow from it) and regenerates its pipeline
# schedule for the run's micro batches per dp rank.  Three plans of the
# same model in f64: the single-rank one, the layout compiled at dp FROM,
# the layout compiled directly at dp TO; the first run on 1 rank, the
# other two on GPUS ranks (dp TO).  Passes when the adapted run equals the
# single-rank run (loss of every step and final parameters within TOL,
# relative) and equals the run of the plan compiled at dp TO (within TOL;
# the numbers printed are what it measured).  And the adapted run posts as many dp
# buckets (world rank 0's summary) as the compiled plan's run: the
# overlapped reduction was rebuilt for dp TO too.
#
# TS_ATDP_PRECISION="fp16 --initial-loss-scale 1024" (tests/fp16) runs the
# three in that precision instead; fp16 plans issue no dp buckets (block
# skip writes the gradients too: docs/precision.md), so none is expected.
#
#   atdp.sh MCC MRUN PARAMS_DIFF WORK MDL TOL STEPS GPUS FROM TO [-D ...] -- [layout options]
set -uo pipefail
mcc=$1 mrun=$2 pdiff=$3 work=$4 mdl=$5 tol=$6 steps=$7 gpus=$8 from=$9 to=${10}
shift 10
defs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do defs+=("$1"); shift; done
[ $# -gt 0 ] && shift
layout=("$@")
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
run() { echo "+ $*"; "$@"; }
read -r -a prec <<< "${TS_ATDP_PRECISION:-f64}"
run "$mcc" "$mdl" "${defs[@]}" --precision "${prec[@]}" -o single.plan || fail "mcc (single rank)"
run "$mcc" "$mdl" "${defs[@]}" --precision "${prec[@]}" "${layout[@]}" --dp "$from" -o from.plan || fail "mcc at dp $from"
run "$mcc" "$mdl" "${defs[@]}" --precision "${prec[@]}" "${layout[@]}" --dp "$to" -o to.plan || fail "mcc at dp $to"
train() {   # train PLAN GPUS NAME: stdout (rank 0's summary) in NAME.out
  run timeout -k 5 150 "$mrun" "$1" --gpus "$2" --steps "$steps" --timeout 60 --metrics "$3.jsonl" \
    --save-params "$3.bin" >"$3.out" 2> >(grep -v "no GPU driver found" >&2)
  [ $? = 0 ] || fail "mrun $1 --gpus $2 failed"
}
train single.plan 1 single
train from.plan "$gpus" adapted
train to.plan "$gpus" direct
losses() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
cmp_losses() {   # cmp_losses A B WHAT
  paste <(losses "$1") <(losses "$2") | awk -v what="$3" -v tol="$tol" -v n="$steps" '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r; k++ }
    END { printf "atdp: %s: %d steps, max relative loss difference %.3g\n", what, k, worst;
          exit !(k == n && worst <= tol) }'
}
status=0
# the rebuilt update block's dp reductions ran as buckets during the last
# micro batch's backward (plan/dpreduce.c), as in the plan compiled at dp TO
bk=$(sed -n 's/^mrun: dp reduction: \([0-9]*\) buckets.*/\1/p' adapted.out)
want=$(sed -n 's/^mrun: dp reduction: \([0-9]*\) buckets.*/\1/p' direct.out)
echo "atdp: dp reduction buckets on world rank 0: ${bk:-none} (plan compiled at dp $to: ${want:-none})"
[ "$bk" = "$want" ] || { echo "atdp: the adapted run's dp buckets differ from the compiled plan's"; status=1; }
# TS_ATDP_BUCKETS=0: a layout whose runs post no dp bucket at any dp (cp on
# CPU ranks, as before ZeRO-1 went over dp x cp): the count must still match
if [ "$to" -gt 1 ] && [ -z "$bk" ] && [ "${prec[0]}" != fp16 ] && [ "${TS_ATDP_BUCKETS:-1}" != 0 ]; then
  echo "atdp: no dp bucket at dp $to"; status=1
fi
cmp_losses adapted.jsonl single.jsonl "dp $from -> $to against one rank" || status=1
run "$pdiff" adapted.bin single.bin "$tol" || status=1
cmp_losses adapted.jsonl direct.jsonl "dp $from -> $to against the plan compiled at dp $to" || status=1
run "$pdiff" adapted.bin direct.bin "$tol" || status=1
[ $status = 0 ] || fail "the run at dp $to of the plan compiled at dp $from differs"
echo "ok: dp $from -> $to on $gpus ranks equals one rank and the plan compiled at dp $to (tolerance $tol)"
