#!/usr/bin/env bash
# scaler.sh - the loss-scale arithmetic of an fp16 run against Megatron's
# rule in Python (scaler_ref.py), over a scripted sequence of overflows:
# infs injected (TS_FAULT_INF_STEPS) so that the scale backs off through
# the hysteresis to the minimum, stays there, grows after `window` good
# steps (hysteresis re-armed), and a good step between two overflows does
# NOT re-arm the hysteresis (Megatron's rule: only growth does).  Then the
# same with a fixed --loss-scale: the scale never moves, steps still skip.
#   scaler.sh MCC MRUN SRCDIR TMPDIR
set -eu
MCC=$1 MRUN=$2 SRC=$3 TMP=$4
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP"
cfg=(-D layers=1 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=2 -D micro_batch=1 --precision fp16)
inj=2,3,4,5,6,7,12,14,18
"$MCC" "$SRC/samples/gpt.mdl" "${cfg[@]}" --initial-loss-scale 1024 --loss-scale-window 3 --hysteresis 2 \
  --min-loss-scale 128 -o d.plan
TS_FAULT_INF_RANK=0 TS_FAULT_INF_STEPS=$inj "$MRUN" d.plan --steps 20 --metrics d.jsonl --quiet 2> d.err ||
  { cat d.err; exit 1; }
python3 "$(dirname "$0")/scaler_ref.py" d.jsonl 1024 3 2 128 0 "$inj"
"$MCC" "$SRC/samples/gpt.mdl" "${cfg[@]}" --loss-scale 4096 -o f.plan
TS_FAULT_INF_RANK=0 TS_FAULT_INF_STEPS=3,4,5 "$MRUN" f.plan --steps 8 --metrics f.jsonl --quiet 2> f.err ||
  { cat f.err; exit 1; }
python3 "$(dirname "$0")/scaler_ref.py" f.jsonl 4096 0 0 0 1 3,4,5
# the check can fail: the rule with another hysteresis disagrees with the run
if python3 "$(dirname "$0")/scaler_ref.py" d.jsonl 1024 3 1 128 0 "$inj" > wrong.txt; then
  echo "FAIL: the reference agreed with a run made under another hysteresis" >&2
  exit 1
fi
echo "PASS (and a reference with hysteresis 1 disagrees: $(tail -1 wrong.txt))"
