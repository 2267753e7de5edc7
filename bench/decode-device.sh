# The steps of a decoding device call (issue 12), sourced by the scripts
# under bench/results: each runs nsa-decode-bench ($N, carried in
# artifacts/) or a reference, writes under $R and prints one line.
N=${N:-artifacts/nsa-decode-bench}
R=${R:-/tmp/r}

# `times FILE`: each nsa-decode-bench timing row of FILE (JSON lines) on
# one line, as "<how> <B> <L> <us> [enqueue_us]" ("call": one that waits).
times() {
  grep '"impl": "nsa decode' "$1" | grep -o '"impl": "nsa decode[a-z, -]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*\(, "enqueue_us": [0-9.]*\)\?' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, /"/; s/"impl": "nsa decode"/call/; s/"//g; s/B: //; s/L: //; s/us: //' | tr '\n' ' '
}

# `gpu`: the card, its clock and driver (gpu.txt).
gpu() {
  nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $R/gpu.txt
}

# `check NAME [VAR=VALUE...] [-- FLAGS...]`: 20 steps' rows against the
# compiled forward's (B = 1, 2, 64; L = 4097, 65536).
check() {
  local name=$1 env=() ; shift
  while (($#)) && [[ $1 != -- ]]; do env+=("$1"); shift; done
  (($#)) && shift
  timeout 150 env "${env[@]}" $N --reps=20 --batches=1,2,64 "$@" 4097 65536 \
    > $R/check-$name.jsonl 2>> $R/errors.log
  echo "check $name rc=$? pass=$(grep -c '"pass": true' $R/check-$name.jsonl) fail=$(grep -c '"pass": false' $R/check-$name.jsonl)"
}

# `memcheck NAME [VAR=VALUE...]`: compute-sanitizer over 20 steps.
memcheck() {
  local name=$1; shift
  timeout 150 env "$@" compute-sanitizer --tool memcheck --error-exitcode 3 \
    $N --steps=20 --reps=1 --batches=1,2 4096 > $R/memcheck-$name.log 2>&1
  echo "memcheck $name rc=$? $(tail -1 $R/memcheck-$name.log)"
}

# `steps NAME BATCH LAYERS REPS L...`: the time a step (LAYERS 0: eight
# layers' caches at B = 1, one otherwise).
steps() {
  local name=$1 batch=$2 layers=$3 reps=$4; shift 4
  timeout 150 $N --steps=1 --reps=$reps --batches=$batch --layers=$layers "$@" \
    > $R/$name.jsonl 2>> $R/errors.log
  echo "$name rc=$? $(times $R/$name.jsonl) $(grep -o '"hbm_fraction": [0-9.]*' $R/$name.jsonl | tr '\n' ' ')"
}

# `sdpa L...`: torch SDPA dense decode, the same shapes.
sdpa() {
  timeout 80 python3 bench/sdpa.py --decode "$@" > $R/sdpa.jsonl 2>> $R/errors.log
  echo "sdpa rc=$? $(grep -o '"B": [0-9]*, "L": [0-9]*, "us": [0-9.]*' $R/sdpa.jsonl | tr '\n' ' ')"
}

# `kernel_time L`: ncu's time of five `_cluster` launches at B = 1.
kernel_time() {
  timeout 60 ncu --clock-control none --cache-control none \
    --kernel-name regex:_cluster --launch-skip 20 --launch-count 5 \
    --metrics gpu__time_duration.sum $N --steps=1 --reps=20 \
    --batches=1 "$1" > $R/ncu.log 2>&1
  echo "ncu rc=$? $(grep gpu__time_duration $R/ncu.log | awk '{print $NF}' | tr '\n' ' ')"
}
