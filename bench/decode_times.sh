# Sourced by the device scripts under bench/results: `times FILE` prints
# each nsa-decode-bench timing row of FILE (JSON lines) on one line, as
# "<how> <B> <L> <us> [enqueue_us]" ("call": a call that waits).
times() {
  grep '"impl": "nsa decode' "$1" | grep -o '"impl": "nsa decode[a-z, -]*", "variant": "[a-z0-9]*", "B": [0-9]*, "L": [0-9]*, "us": [0-9.]*\(, "enqueue_us": [0-9.]*\)\?' | sed 's/"variant": "[a-z0-9]*", //; s/"impl": "nsa decode, /"/; s/"impl": "nsa decode"/call/; s/"//g; s/B: //; s/L: //; s/us: //' | tr '\n' ' '
}
