# Shared by the benchmark scripts (sourced, not run): a temporary folder
# and the processes started, both cleaned up on exit, and two helpers.

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# wait_ready FILE: waits (at most 30 s) for a "READY ..." line in FILE.
wait_ready() {
  for _ in $(seq 1 300); do
    if grep -q '^READY ' "$1" 2>/dev/null; then grep '^READY ' "$1" | head -1; return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2; cat "$1" >&2; return 1
}

# free_port: a loopback port nothing listens on, below the ephemeral range.
free_port() {
  for _ in $(seq 1 100); do
    p=$((20000 + RANDOM % 12000))
    if ! (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}
