#!/usr/bin/env bash
# resume.sh - checkpoints (runtime/exec/ckpt.c): a run stopped after step 3
# and resumed from its checkpoint gives, for steps 4-6, the losses and the
# final parameters of the run that never stopped, bit for bit, in every
# layout family; and the refusals of a checkpoint that does not fit.
#
#   resume.sh CASE MCC MRUN SRCDIR TMPDIR PARAMS_DIFF
#   (CASE: layouts, reshard, refusals, kills)
set -u
CASE=$1 MCC=$2 MRUN=$3 SRC=$4 TMP=$5 PARAMS_DIFF=$6
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
fail=0
die() { echo "FAIL: $*" >&2; fail=1; }
printf 'In the beginning God created the heaven and the earth. %.0s' {1..100} > corpus.txt
GPT="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1 -D dropout=0.1"
MOE="-D layers=2 -D d_model=32 -D heads=4 -D kv_heads=2 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2 -D ffn=32 -D experts=4 -D topk=2"

# the loss and grad norm of steps FROM.. in a metrics file, one per line
losses() { sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\), "lr": [^,]*, "grad_norm": \([^,]*\),.*/\1 \2 \3/p' "$1" | awk -v f="$2" '$1 >= f'; }

# TS_CKPT_SUBSET=1 (the sanitizer build, tests/ckpt/CMakeLists.txt) runs
# one cell of each layout family and of each resharding path, not all:
# the others run the same checkpoint code on other layouts
subset_layouts=" f64 tp2_sp dp2_zero pp2_interleaved cp2_dp2_f64 ep2 dp2_zero3 dp2_zero_async "
subset_reshard=" tp2:one cp2_dp2:dp2 dp2_z3:one ep2_dp2:ep2 tp2_dp2_v251:one_v251 pp2:pp4_vpp2 tp2_dp2:pp2_split "
wanted() { [ "${TS_CKPT_SUBSET:-0}" != 1 ] || [[ $1 == *" $2 "* ]]; }

# resume NAME MODEL GPUS MCC-FLAGS...: full run of 6 steps vs 3 + resume to 6
resume() {
  wanted "$subset_layouts" "$1" || return 0
  local name=$1 model=$2 gpus=$3; shift 3
  mkdir -p "$name" && cd "$name" || return
  if ! "$MCC" "$SRC/samples/$model.mdl" "$@" -o p.plan 2> err.txt; then die "$name: mcc: $(cat err.txt)"; cd ..; return; fi
  local run=("$MRUN" p.plan --gpus "$gpus" --data ../corpus.txt --quiet --timeout 60)
  "${run[@]}" --steps 6 --metrics full.jsonl --save-params full.bin > out.txt 2>&1 || die "$name: full run: $(tail -3 out.txt)"
  # SAVE_FLAGS: e.g. --save-interval 1 --async-save (every save written by a thread)
  "${run[@]}" --steps 3 --save ck ${SAVE_FLAGS:-} > out.txt 2>&1 || die "$name: first 3 steps: $(tail -3 out.txt)"
  [ "$(cat ck/latest 2>/dev/null)" = iter_0000003 ] || die "$name: ck/latest is '$(cat ck/latest 2>/dev/null)', not iter_0000003"
  [ -f ck/iter_0000003/metadata.json ] || die "$name: no ck/iter_0000003/metadata.json"
  "${run[@]}" --steps 6 --load ck --metrics res.jsonl --save-params res.bin > out.txt 2>&1 ||
    die "$name: resumed run: $(tail -3 out.txt)"
  cmp -s full.bin res.bin || die "$name: the parameters after step 6 differ between the full and the resumed run"
  local a b
  a=$(losses full.jsonl 4) b=$(losses res.jsonl 1)
  [ -n "$a" ] && [ "$a" = "$b" ] || die "$name: steps 4-6 differ: full '$a', resumed '$b'"
  echo "$name: steps 4-6 and the parameters after step 6 equal the uninterrupted run's ($(echo "$a" | tr '\n' ' '))"
  cd ..
}

case $CASE in
layouts)
  resume f64 gpt 1 $GPT --precision f64
  resume f32 gpt 1 $GPT
  resume tp2_sp gpt 2 $GPT --tp 2 --sp
  resume dp2_zero gpt 2 $GPT --dp 2
  resume dp2_nozero gpt 2 $GPT --dp 2 --no-zero
  resume pp2_1f1b gpt 2 $GPT --pp 2
  resume pp2_interleaved gpt 2 ${GPT/layers=2/layers=4} --pp 2 --vpp 2
  resume cp2 gpt 2 ${GPT/dropout=0.1/dropout=0} --cp 2
  resume ep2 moe 2 $MOE --ep 2
  resume tp2_f64 gpt 2 $GPT --tp 2 --precision f64
  resume tp2_sp_f64 gpt 2 $GPT --tp 2 --sp --precision f64
  resume dp2_zero_f64 gpt 2 $GPT --dp 2 --precision f64
  resume pp2_interleaved_f64 gpt 2 ${GPT/layers=2/layers=4} --pp 2 --vpp 2 --precision f64
  resume cp2_f64 gpt 2 ${GPT/dropout=0.1/dropout=0} --cp 2 --precision f64
  resume cp2_dp2_f64 gpt 4 ${GPT/dropout=0.1/dropout=0} --cp 2 --dp 2 --precision f64   # ZeRO-1 chunks flat over dp+cp
  resume ep2_f64 moe 2 $MOE --ep 2 --precision f64
  SAVE_FLAGS="--save-interval 1 --async-save" resume dp2_zero_async gpt 2 $GPT --dp 2
  resume dp2_zero3 gpt 2 $GPT --dp 2 --zero 3    # ZeRO-3: the shards saved under their parameters' names
  SAVE_FLAGS="--save-interval 1 --async-save" resume tp2_dp2_zero3_async gpt 4 $GPT --tp 2 --dp 2 --sp --zero 3
  SAVE_FLAGS="--save-interval 2 --async-save" resume tp2_async_f64 gpt 2 $GPT --tp 2 --precision f64
  ;;
reshard)
  # a checkpoint of step 3 saved in layout A, loaded in layout B and run to
  # step 6, equals A's uninterrupted run within 1e-12 (f64): parameters
  # after step 6 and the losses of steps 4-6
  G8="${GPT/layers=2/layers=8} --precision f64"
  G8=${G8/dropout=0.1/dropout=0}
  M64="$MOE --precision f64"
  # plan NAME MODEL GPUS FLAGS...: compiled once
  declare -A gpus
  plan() {
    local name=$1 model=$2; gpus[$name]=$3; shift 3
    "$MCC" "$SRC/samples/$model.mdl" "$@" -o "$name.plan" 2> err.txt || die "mcc $name: $(cat err.txt)"
  }
  plan one gpt 1 $G8; plan tp2 gpt 2 $G8 --tp 2; plan tp4 gpt 4 $G8 --tp 4 -D vocab=250
  plan one_v250 gpt 1 $G8 -D vocab=250; plan pp2 gpt 2 $G8 --pp 2; plan pp4_vpp2 gpt 4 $G8 --pp 4 --vpp 2
  plan pp2_split gpt 2 $G8 --pp 2 --pp-layers 5,3; plan dp2 gpt 2 $G8 --dp 2; plan dp4 gpt 4 $G8 --dp 4
  plan dp2_nozero gpt 2 $G8 --dp 2 --no-zero; plan cp2 gpt 2 $G8 --cp 2; plan tp2_sp gpt 2 $G8 --tp 2 --sp
  plan tp2_dp2 gpt 4 $G8 --tp 2 --dp 2; plan moe moe 1 $M64; plan ep2 moe 2 $M64 --ep 2
  plan ep2_tp2 moe 4 $M64 --ep 2 --tp 2; plan ep2_dp2 moe 4 $M64 --ep 2 --dp 2
  plan cp2_dp2 gpt 4 $G8 --cp 2 --dp 2   # ZeRO-1 moments flat over dp+cp
  plan one_v251 gpt 1 $G8 -D vocab=251; plan tp2_dp2_v251 gpt 4 $G8 --tp 2 --dp 2 -D vocab=251   # padding in ZeRO chunks
  plan dp2_z3 gpt 2 $G8 --dp 2 --zero 3; plan tp2_dp2_z3 gpt 4 $G8 --tp 2 --dp 2 --zero 3 -D vocab=251   # ZeRO-3 shards
  run() { local name=$1; shift; "$MRUN" "$name.plan" --gpus "${gpus[$name]}" --data corpus.txt --quiet --timeout 60 "$@"; }
  # the losses of steps FROM.. of two metrics files agree within 1e-12 (relative)
  same_losses() {
    paste <(losses "$1" "$2") <(losses "$3" 1) | awk '
      { n++; d = $2 - $5; if (d < 0) d = -d; s = $5 < 0 ? -$5 : $5; if ($1 != $4 || d > 1e-12 * s) bad = 1 }
      END { exit !(n == 3 && !bad) }'
  }
  declare -A saved
  # reshard A B: A's checkpoint of step 3 resumed in B
  reshard() {
    local a=$1 b=$2
    wanted "$subset_reshard" "$a:$b" || return 0
    if [ -z "${saved[$a]:-}" ]; then
      run "$a" --steps 6 --metrics "full_$a.jsonl" --save-params "full_$a.bin" > out.txt 2>&1 || die "$a: full run: $(tail -2 out.txt)"
      run "$a" --steps 3 --save "ck_$a" > out.txt 2>&1 || die "$a: first 3 steps: $(tail -2 out.txt)"
      saved[$a]=1
    fi
    if ! run "$b" --steps 6 --load "ck_$a" --metrics "r_${a}_$b.jsonl" --save-params "r_${a}_$b.bin" > out.txt 2>&1; then
      die "$a -> $b: $(tail -2 out.txt)"; return
    fi
    local d
    d=$("$PARAMS_DIFF" "full_$a.bin" "r_${a}_$b.bin" 1e-12) || { die "$a -> $b: $d"; return; }
    same_losses "full_$a.jsonl" 4 "r_${a}_$b.jsonl" || die "$a -> $b: steps 4-6 differ: '$(losses "full_$a.jsonl" 4 | tr '\n' ' ')' vs '$(losses "r_${a}_$b.jsonl" 1 | tr '\n' ' ')'"
    echo "$a -> $b: ${d#params_diff: }"
  }
  reshard tp2 one; reshard pp2 pp4_vpp2; reshard dp2 dp4; reshard ep2 moe; reshard cp2 tp2
  reshard one tp2_dp2; reshard tp2_dp2 pp2_split; reshard pp4_vpp2 dp2_nozero; reshard dp4 tp2_sp
  reshard dp2_nozero cp2; reshard one_v250 tp4; reshard tp4 one_v250; reshard moe ep2_tp2; reshard ep2_dp2 ep2
  reshard tp2_dp2_v251 one_v251
  reshard cp2_dp2 dp2; reshard dp4 cp2_dp2
  reshard dp2_z3 one; reshard dp4 dp2_z3; reshard tp2_dp2_z3 one_v251; reshard one_v251 tp2_dp2_z3
  # the general path in the saved layout equals reading the files as they are
  TS_CKPT_RESHARD=1 run tp2_dp2 --steps 6 --load ck_tp2_dp2 --save-params forced.bin > out.txt 2>&1 ||
    die "forced reshard: $(tail -2 out.txt)"
  run tp2_dp2 --steps 6 --load ck_tp2_dp2 --save-params same.bin > out.txt 2>&1 || die "same layout: $(tail -2 out.txt)"
  grep -q resharded out.txt && die "the same layout was resharded"
  cmp -s forced.bin same.bin || die "TS_CKPT_RESHARD=1 in the saved layout differs from reading the files as they are"
  # another model is refused, naming the first tensor that differs
  expect() { local what=$1 text=$2; shift 2; if "$@" > out.txt 2>&1; then die "$what: accepted"; elif ! grep -qF -- "$text" out.txt; then die "$what: no '$text' in: $(tail -2 out.txt)"; fi; }
  plan wide gpt 1 ${G8/d_model=32/d_model=64}; plan short gpt 1 ${G8/layers=8/layers=6}; plan f32 gpt 1 ${G8/--precision f64/}
  expect "wider" "tensor 'token_embedding.wte' is param f64[256, 32] in the checkpoint, param f64[256, 64] here" run wide --steps 6 --load ck_tp2
  expect "fewer layers" "it holds tensor 'layers.6.layernorm.g' (param f64[32]), which this model does not have" run short --steps 6 --load ck_tp2
  expect "f32" "is param f64[256, 32] in the checkpoint, param f32[256, 32] here" run f32 --steps 6 --load ck_tp2
  cp -r ck_tp2 miss && rm miss/iter_0000003/rank_00001.bin
  expect "a shard file missing" "rank_00001.bin': No such file" run one --steps 6 --load miss
  ;;
refusals)
  "$MCC" "$SRC/samples/gpt.mdl" $GPT -o p.plan && "$MCC" "$SRC/samples/gpt.mdl" $GPT --tp 2 -o tp.plan &&
    "$MCC" "$SRC/samples/gpt.mdl" ${GPT/d_model=32/d_model=64} -o wide.plan || { echo "FAIL: mcc" >&2; exit 1; }
  run() { "$MRUN" "$@" --data corpus.txt --quiet > out.txt 2>&1; }
  # expect WHAT TEXT CMD...: CMD fails and says TEXT
  expect() { local what=$1 text=$2; shift 2; if run "$@"; then die "$what: accepted"; elif ! grep -qF -- "$text" out.txt; then die "$what: no '$text' in: $(tail -2 out.txt)"; fi; }
  run p.plan --steps 5 --save ck --save-interval 1 --keep 2 || die "save every step: $(tail -2 out.txt)"
  [ "$(ls ck | tr '\n' ' ')" = "iter_0000004 iter_0000005 latest " ] || die "--keep 2 left: $(ls ck | tr '\n' ' ')"
  expect "nothing left" "is of step 5, and training ends at step 5" p.plan --steps 5 --load ck
  expect "no checkpoint" "has no checkpoint" p.plan --steps 6 --load .
  expect "not a directory" "is not a directory" p.plan --steps 6 --load corpus.txt
  run tp.plan --gpus 2 --steps 6 --load ck || die "another layout: $(tail -2 out.txt)"
  expect "other model" "tensor 'token_embedding.wte' is param f32[256, 32] in the checkpoint, param f32[256, 64] here" wide.plan --steps 6 --load ck
  expect "save onto a file" "exists and is not a directory" p.plan --steps 1 --save corpus.txt
  expect "interval without save" "go with --save DIR" p.plan --steps 1 --save-interval 2
  # a save killed before its rename leaves iter_N.tmp: never chosen
  mkdir ck/iter_0000009.tmp && : > ck/iter_0000009.tmp/rank_00000.bin
  run p.plan --steps 6 --load ck || die "a leftover .tmp: $(tail -2 out.txt)"
  grep -q "resumed" out.txt && die "--quiet printed the resume line"
  cp -r ck bad
  printf 'X' | dd of=bad/iter_0000005/rank_00000.bin bs=1 seek=200 conv=notrunc 2>/dev/null
  expect "a flipped byte" "is corrupted: tensor" p.plan --steps 6 --load bad
  head -c 300 ck/iter_0000005/rank_00000.bin > bad/iter_0000005/rank_00000.bin
  expect "a truncated shard" "is truncated" p.plan --steps 6 --load bad
  echo iter_0000007 > bad/latest
  expect "latest names a missing checkpoint" "which is missing" p.plan --steps 6 --load bad
  echo garbage > bad/latest
  expect "latest damaged" "does not name a checkpoint" p.plan --steps 6 --load bad
  run p.plan --steps 6 --load ck/iter_0000004 || die "--load of an iter directory: $(tail -2 out.txt)"
  # SIGTERM: the run stops after a step, saves it, and resumes from there
  # (signalled once its first step is done: --metrics has a line; a fixed
  # wait could signal it before its handler is in place on a loaded machine)
  rm -f sig.jsonl
  "$MRUN" p.plan --steps 1000000 --save sig --data corpus.txt --quiet --metrics sig.jsonl > sig.txt 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ -s sig.jsonl ] && break; sleep 0.1; done
  kill -TERM $pid
  wait $pid
  rc=$?
  k=$(sed -n 's/^iter_0*\([0-9][0-9]*\)$/\1/p' sig/latest 2>/dev/null)
  if [ "$rc" != 143 ] || [ -z "$k" ]; then die "SIGTERM with --save: exit $rc, latest '$(cat sig/latest 2>/dev/null)': $(tail -2 sig.txt)"
  else
    grep -q "stopped by SIGTERM after step $k " sig.txt || die "SIGTERM: the checkpoint is not of the step reached: $(tail -2 sig.txt)"
    run p.plan --steps $((k + 2)) --load sig || die "resume after SIGTERM: $(tail -2 out.txt)"
  fi
  # an asynchronous save is completed at the first step boundary after its
  # files are written, not at the next save: a run saving every 30 steps and
  # killed in step 59 has the checkpoint of step 30 (its thread had 28 steps
  # to write a few hundred KB: 50 ms each, TS_FAULT_STEP_DELAY_MS, so that a
  # machine loaded by other builds still gives it 1.4 s)
  rm -rf ak
  TS_FAULT_STEP_DELAY_MS=50 TS_FAULT_KILL_RANK=0 TS_FAULT_KILL_STEP=59 run p.plan --steps 60 --save ak --save-interval 30 --async-save
  [ "$(cat ak/latest 2>/dev/null)" = iter_0000030 ] ||
    die "--async-save: killed in step 59, latest is '$(cat ak/latest 2>/dev/null)' ($(ls ak 2>/dev/null | tr '\n' ' '))"
  run p.plan --steps 31 --load ak || die "--async-save: the checkpoint of step 30 does not resume: $(tail -2 out.txt)"
  echo '{}' > bad/iter_0000004/metadata.json
  expect "damaged metadata" "not a Tessera checkpoint's metadata" p.plan --steps 6 --load bad/iter_0000004
  ;;
kills)
  # SIGKILL at every point of the saves of steps 1-4 (every step saved,
  # --keep 2): the last complete checkpoint loads, and the run resumed from
  # it ends with the parameters of the run that never stopped
  "$MCC" "$SRC/samples/gpt.mdl" $GPT -o p.plan || { echo "FAIL: mcc" >&2; exit 1; }
  run() { "$MRUN" p.plan --data corpus.txt --quiet "$@"; }
  run --steps 6 --save-params full.bin > /dev/null 2>&1 || { echo "FAIL: full run" >&2; exit 1; }
  for async in "" --async-save; do   # the second time, the shard files are written by a thread
  n=0 seen=""
  for k in $(seq 1 36); do
    rm -rf ck res.bin
    TS_FAULT_CKPT_KILL=$k run --steps 6 --save ck --save-interval 1 --keep 2 $async > kill.txt 2>&1
    rc=$?
    where=$(sed -n 's/.*TS_FAULT_CKPT_KILL: killing myself //p' kill.txt)
    if [ $rc = 0 ]; then break; fi   # past the last point
    [ $rc = 137 ] || { die "kill point $k: exit $rc: $(tail -2 kill.txt)"; continue; }
    n=$((n + 1))
    case " $seen " in *" $where "*) ;; *) seen="$seen|$where" ;; esac
    if [ ! -f ck/latest ]; then
      run --steps 6 --save-params res.bin > res.txt 2>&1 || die "kill point $k ($where): a fresh run failed"
    else
      run --steps 6 --load ck --save-params res.bin > res.txt 2>&1 ||
        { die "kill point $k ($where): the last checkpoint ($(cat ck/latest)) does not load: $(tail -2 res.txt)"; continue; }
    fi
    cmp -s full.bin res.bin || die "kill point $k ($where): the resumed run's parameters differ"
  done
  [ $n -ge 20 ] || die "${async:-sync}: only $n kill points were reached (expected at least 20)"
  echo "kills${async:+ ($async)}: $n kill points, each resumed bit-identically; points:$(echo "$seen" | tr '|' '\n' | sed '/^$/d' | sort -u | sed 's/^/ [/; s/$/]/' | tr -d '\n')"
  done
  ;;
*) echo "resume.sh: unknown case $CASE" >&2; exit 2 ;;
esac
exit $fail
