#!/bin/bash
# outputs_test.sh - what mcc and mrun write, and where they refuse to
# (ir/io.c): a device stays a device, an input is never overwritten, a
# directory is refused, a symlink keeps pointing where it did, a full device
# or a full stdout is an error for every output form, and temporary files
# left by a dead writer are cleaned on the next write.
#
# usage: outputs_test.sh MCC MRUN SRCDIR TMPDIR
set -u
MCC=$1 MRUN=$2 SRC=$3 TMP=$4
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
cd "$TMP" || exit 1
fail=0 ncheck=0
die() { echo "FAIL: $*" >&2; fail=1; }
ok() { ncheck=$((ncheck + 1)); }

cp "$SRC/samples/gpt.mdl" m.mdl
D=(-D layers=1 -D d_model=32 -D heads=2 -D seq_len=16 -D batch=4 -D micro_batch=2 -D vocab=256)
printf 'the quick brown fox jumps over the lazy dog. %.0s' {1..40} > corpus.txt

# Device nodes of our own (root can make them; otherwise the system's, which
# the rules keep intact just the same).
if mknod null c 1 3 2>/dev/null && mknod full c 1 7 2>/dev/null; then NUL=$TMP/null FULL=$TMP/full
else NUL=/dev/null FULL=/dev/full; echo "note: mknod refused; writing to /dev/null and /dev/full"; fi

# expect_fail WHAT PATTERN CMD...: CMD exits non-zero and says PATTERN on stderr
expect_fail() {
  local what=$1 pat=$2; shift 2
  "$@" > out.txt 2> err.txt
  local rc=$?
  if [ $rc = 0 ]; then die "$what: exit 0, expected an error"
  elif ! grep -q -- "$pat" err.txt; then die "$what: exit $rc without '$pat': $(head -3 err.txt)"
  else ok; fi
}
still_device() { [ -c "$1" ] && ok || die "$2: $1 is no longer a character device ($(ls -l "$1"))"; }

# --- mcc onto devices: written in place, never renamed over
"$MCC" m.mdl "${D[@]}" -o "$NUL" 2> err.txt || die "mcc -o device: $(cat err.txt)"
still_device "$NUL" "mcc -o"
for e in ir plan-text dot; do
  "$MCC" m.mdl "${D[@]}" --emit=$e -o "$NUL" 2> err.txt || die "--emit=$e -o device: $(cat err.txt)"
  still_device "$NUL" "--emit=$e -o"
done
"$MCC" m.mdl "${D[@]}" --report memory -o "$NUL" 2> err.txt || die "--report memory -o device: $(cat err.txt)"
still_device "$NUL" "--report memory -o"
[ -e m.plan ] && die "mcc wrote m.plan next to the model although -o was given"

# --- every output form onto a full device, by -o and by stdout
for e in ir plan-text dot plan; do
  expect_fail "--emit=$e -o full" "cannot write '$FULL': No space left on device" "$MCC" m.mdl "${D[@]}" --emit=$e -o "$FULL"
  still_device "$FULL" "--emit=$e -o full"
  expect_fail "--emit=$e -o - > /dev/full" "cannot write standard output: No space left" \
    sh -c '"$@" -o - > /dev/full' sh "$MCC" m.mdl "${D[@]}" --emit=$e
done
for e in ir plan-text dot; do
  expect_fail "--emit=$e > /dev/full" "cannot write standard output" sh -c '"$@" > /dev/full' sh "$MCC" m.mdl "${D[@]}" --emit=$e
done
for r in memory comm; do
  expect_fail "--report $r > /dev/full" "cannot write standard output" sh -c '"$@" > /dev/full' sh "$MCC" m.mdl "${D[@]}" --report $r
done
expect_fail "--stats --emit=ir > /dev/full (the stdout check at exit)" "cannot write standard output" \
  sh -c '"$@" > /dev/full' sh "$MCC" m.mdl "${D[@]}" --emit=ir --stats
[ "$(grep -c 'cannot write standard output' err.txt)" = 1 ] && ok || die "the stdout error is reported $(grep -c 'cannot write standard output' err.txt) times"

# --- inputs are never outputs
cp m.mdl m.orig
expect_fail "mcc -o the model" "'m.mdl': it is an input of this run" "$MCC" m.mdl "${D[@]}" -o m.mdl
ln m.mdl hard.mdl
expect_fail "mcc -o a hard link of the model" "'hard.mdl': it is the same file as the input 'm.mdl'" "$MCC" m.mdl "${D[@]}" -o hard.mdl
expect_fail "mcc --emit=ir -o the model" "it is an input of this run" "$MCC" m.mdl "${D[@]}" --emit=ir -o m.mdl
cmp -s m.mdl m.orig && ok || die "the model source changed"
mkdir adir
expect_fail "mcc -o a directory" "cannot write 'adir': it is a directory" "$MCC" m.mdl "${D[@]}" -o adir
expect_fail "mcc -o in a missing directory" "cannot write 'nodir/x.plan': No such file or directory" "$MCC" m.mdl "${D[@]}" -o nodir/x.plan

# --- a symlink keeps pointing at its file, which is replaced
"$MCC" m.mdl "${D[@]}" -o p.plan 2> err.txt || die "mcc -o p.plan: $(cat err.txt)"
echo old > target.plan
ln -s target.plan link.plan
"$MCC" m.mdl "${D[@]}" -o link.plan 2> err.txt || die "mcc -o a symlink: $(cat err.txt)"
[ -L link.plan ] && cmp -s target.plan p.plan && ok || die "-o a symlink: the link was replaced or its file not written"

# --- temporary files of a dead writer are removed, others kept
host=$(hostname | tr -c 'A-Za-z0-9\n-' '_')
sh -c 'exit 0' & dead=$!
wait $dead
touch "p.plan.tmp.$host.$dead" "p.plan.tmp.$dead" "p.plan.tmp.$host.$$" "p.plan.tmp.otherhost.$dead" "p.plan.tmp.notes"
"$MCC" m.mdl "${D[@]}" -o p.plan 2> err.txt || die "mcc -o p.plan: $(cat err.txt)"
[ ! -e "p.plan.tmp.$host.$dead" ] && [ ! -e "p.plan.tmp.$dead" ] && ok || die "a dead writer's temporary file is left: $(ls p.plan.tmp.*)"
[ -e "p.plan.tmp.$host.$$" ] && [ -e "p.plan.tmp.otherhost.$dead" ] && [ -e p.plan.tmp.notes ] && ok ||
  die "a live writer's, another host's or an unrelated file was removed: $(ls p.plan.tmp.* 2>&1)"

# --- mrun: inputs refused before training, devices written in place, full devices are errors
R=("$MRUN" p.plan --steps 2 --data corpus.txt --quiet)
cp p.plan p.orig
expect_fail "mrun --metrics the plan" "--metrics: cannot write 'p.plan': it is an input of this run" "${R[@]}" --metrics p.plan
expect_fail "mrun --save-params the plan" "--save-params: cannot write 'p.plan': it is an input" "${R[@]}" --save-params p.plan
expect_fail "mrun --save-params the corpus" "--save-params: cannot write 'corpus.txt': it is an input" "${R[@]}" --save-params corpus.txt
grep -q "^step" out.txt && die "mrun trained before refusing its output"
cmp -s p.plan p.orig && ok || die "the plan changed"
expect_fail "mrun --metrics full" "--metrics: cannot write '$FULL': No space left on device" "${R[@]}" --metrics "$FULL"
expect_fail "mrun --save-params full" "--save-params: cannot write '$FULL': No space left on device" "${R[@]}" --save-params "$FULL"
expect_fail "mrun --metrics - > /dev/full" "cannot write standard output" sh -c '"$@" --metrics - > /dev/full' sh "${R[@]}"
expect_fail "mrun > /dev/full" "cannot write standard output" sh -c '"$@" > /dev/full' sh "$MRUN" p.plan --steps 2 --data corpus.txt
"${R[@]}" --save-params "$NUL" --metrics "$NUL" 2> err.txt || die "mrun onto a device: $(cat err.txt)"
still_device "$NUL" "mrun --save-params"
"${R[@]}" --save-params w.bin --metrics w.jsonl 2> err.txt || die "mrun --save-params: $(cat err.txt)"
[ -s w.bin ] && [ "$(wc -l < w.jsonl)" = 2 ] && ok || die "mrun wrote no parameters or not 2 metrics lines"
expect_fail "mrun --gpus 2 --metrics the plan" "cannot write 'p.plan': it is an input" "${R[@]}" --gpus 2 --metrics p.plan

ls | grep -q '\.tmp\.' && [ "$(ls | grep -c '\.tmp\.')" != 3 ] && die "temporary files left: $(ls | grep '\.tmp\.')"
[ $fail = 0 ] && echo "outputs: $ncheck checks passed"
exit $fail
