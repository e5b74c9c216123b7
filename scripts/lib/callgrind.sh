# CALLGRIND=1 of scripts/bench-proxy.sh (sourced after scripts/lib/bench.sh,
# with $tmp/benchupstream and $tmp/benchproxy built): instructions per
# request under valgrind --tool=callgrind, then allocations per request
# without it. No clock is read into a figure.
CG_WARMUP=${CG_WARMUP:-200}
CG_REQUESTS=${CG_REQUESTS:-2000}
CG_CONNS=${CG_CONNS:-4}
CG_ROUNDS=${CG_ROUNDS:-2}
# CG_SETTLE: the wait after a batch of requests for the usage writer to
# write their records (it writes every 500 ms, slower under valgrind), so
# that a round counts its own records and not the batch before's.
CG_SETTLE=${CG_SETTLE:-3}
if ! command -v valgrind >/dev/null 2>&1 || ! command -v callgrind_control >/dev/null 2>&1; then
  echo "CALLGRIND=1 needs valgrind (apt-get install valgrind)" >&2; exit 1
fi
go build -o "$tmp/benchload" ./tools/benchload

"$tmp/benchupstream" -addr 127.0.0.1:0 >"$tmp/upstream.out" 2>&1 &
pids+=($!)
UP=$(wait_ready "$tmp/upstream.out" | awk '{print $2}')

# start_proxy DIR GOGC [WRAPPER...]: starts benchproxy (logs on, as
# measured) and sets GP, KEY and PROXYPID.
start_proxy() {
  local dir=$1 gogc=$2; shift 2
  mkdir -p "$dir"
  # Go's asynchronous preemption signals trip callgrind's signal
  # bookkeeping (an assertion in threads.c); goroutines still yield at
  # function calls.
  GOGC=$gogc GODEBUG=asyncpreemptoff=1 GOMAXPROCS=2 "$@" "$tmp/benchproxy" -upstream "$UP" -dir "$dir" -log file \
    >"$dir/out" 2>"$dir/err" &
  PROXYPID=$!
  pids+=($PROXYPID)
  for _ in $(seq 1 1200); do
    grep -q '^READY ' "$dir/out" 2>/dev/null && break
    kill -0 "$PROXYPID" 2>/dev/null || { echo "benchproxy exited:" >&2; tail -20 "$dir/err" >&2; exit 1; }
    sleep 0.1
  done
  read -r _ GP KEY < <(grep '^READY ' "$dir/out")
}

instance_url() { echo "http://$GP/api/v1/proxy/gpi_bench/v1/chat/completions"; }
service_url() { echo "http://$GP/v1/chat/completions"; }

load() { "$tmp/benchload" -url "$1" -key "$KEY" -n "$2" -conns "$CG_CONNS" >/dev/null; }

echo "== callgrind: $CG_WARMUP warm-up requests, then $CG_ROUNDS x $CG_REQUESTS on $CG_CONNS connections per path"
# Without a collection (GOGC=off): one lands in a round of 2,000 requests
# or not, which moved the count by 5-10 %; what a request costs the
# collector is in its allocations, printed below.
start_proxy "$tmp/cg" off valgrind --tool=callgrind --callgrind-out-file="$tmp/cg/callgrind.out"
dumps=0
paths=(instance)
if [ "${SERVICE:-on}" = on ]; then paths+=(service); fi
for p in "${paths[@]}"; do
  url=$("${p}_url")
  load "$url" "$CG_WARMUP"
  sleep "$CG_SETTLE"
  for r in $(seq 1 "$CG_ROUNDS"); do
    callgrind_control -z "$PROXYPID" >/dev/null 2>&1
    load "$url" "$CG_REQUESTS"
    sleep "$CG_SETTLE"
    callgrind_control -d "$PROXYPID" >/dev/null 2>&1
    dumps=$((dumps + 1))
    ir=$(awk '/^totals:/ {print $2}' "$tmp/cg/callgrind.out.$dumps")
    awk -v p="$p" -v r="$r" -v ir="$ir" -v n="$CG_REQUESTS" \
      'BEGIN { printf "%-9s round %d: %.0f instructions per request\n", p, r, ir / n }'
  done
done
# callgrind does not survive a signal the Go runtime handles (SIGINT):
# its counts are dumped, so it is killed.
kill -9 "$PROXYPID" 2>/dev/null || true
wait "$PROXYPID" 2>/dev/null || true
if [ -n "${CG_KEEP:-}" ]; then cp "$tmp"/cg/callgrind.out.* "$CG_KEEP"/ && echo "callgrind dumps copied to $CG_KEEP"; fi

# Allocations per request: the same load on the instance proxy without
# valgrind; benchproxy prints them when it stops.
start_proxy "$tmp/allocs" ""
load "$(instance_url)" "$CG_WARMUP"
load "$(instance_url)" "$CG_REQUESTS"
kill -INT "$PROXYPID"
wait "$PROXYPID" 2>/dev/null || true
apr=$(sed -n 's/^allocations per request: \([0-9.]*\).*/\1/p' "$tmp/allocs/out")
echo "allocations per request (gpuproxy, instance proxy): ${apr:-n/a (this build does not report them)}"
