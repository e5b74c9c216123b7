#!/usr/bin/env bash
# Proxy benchmark: the same upstream on loopback reached (a) directly,
# (b) through gpuproxy's proxy path and (c) through nginx proxy_pass, with
# small JSON POSTs at 64 connections and at 1 connection. Prints requests
# per second and p50/p99 latency for each, gpuproxy's allocations per
# request, and the ratios the proxy issue
# sets as targets (gpuproxy ≥ 60% of nginx's throughput at 64 connections;
# added p50 over direct ≤ 0.25 ms at 1 connection), and (d) through a
# one-replica service's OpenAI-compatible endpoint (POST
# /v1/chat/completions, the body's model picking the service) against (b):
# routing adds ≤ 0.05 ms p50 at 1 connection and keeps ≥ 0.9 of the
# instance proxy's throughput at 64.
#
#   scripts/bench-proxy.sh                  # 3 rounds of 5 s per measurement
#   DURATION=20s LOGS=off scripts/bench-proxy.sh
#   PROFILE=/tmp/gp.pprof scripts/bench-proxy.sh   # CPU profile of gpuproxy
#   CALLGRIND=1 scripts/bench-proxy.sh      # instructions per request instead
#
# CALLGRIND=1 measures no time and runs neither nginx nor wrk: gpuproxy
# runs under valgrind --tool=callgrind and tools/benchload sends CG_WARMUP
# (200) requests, then CG_ROUNDS (2) times CG_REQUESTS (2000) on CG_CONNS
# (4) kept-alive connections, to the instance proxy and to the service
# endpoint; callgrind's counters are zeroed before and dumped after each
# measured batch (after CG_SETTLE, 3 s, for the usage writer), so startup
# and warm-up cancel and what is printed is instructions (Ir, every thread,
# user space: a syscall counts as one) per request, with the collector off.
# Instruction counts repeat within a few per cent run to run on a loaded
# machine (timers and SQLite's checkpoints run when they run), where
# wall-clock figures do not. Then allocations per request, from the same
# load on a run without valgrind, the collector on.
#
# The upstream is tools/benchupstream (a tiny Go JSON server);
# gpuproxy is tools/benchproxy (the real server with API-key auth,
# rate limit, request logs, metrics, the guard-rail gate over SQLite and
# batched usage records); nginx is Debian's, configured in a temp folder
# with upstream keep-alive. Load comes from wrk. Everything listens on
# 127.0.0.1 only; every run is bounded by DURATION. nginx and wrk are
# installed with apt-get when missing.
#
# Environment: DURATION (default 5s), ROUNDS (3), WARMUP (2s), CONNS (64),
# COST (per-request cost in USD, default 0; non-zero exercises budget leases),
# BENCH_DATABASE_URL (a Postgres URL: store on Postgres instead of SQLite),
# LOGS=on|off (request logs in both proxies; default on: gpuproxy's JSON
# request log and nginx's access log, each to a file), PROFILE (path),
# SERVICE=on|off (measure the service endpoint, default on; off for a
# build from before services), GPUPROXY_BENCH_BIN (a benchproxy binary to
# measure instead of building this tree's, e.g. an older commit's).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2s}
CONNS=${CONNS:-64}
LOGS=${LOGS:-on}
SERVICE=${SERVICE:-on}

# tmp, pids (cleaned up on exit), wait_ready, free_port
. scripts/lib/bench.sh

echo "== building"
go build -o "$tmp/benchupstream" ./tools/benchupstream
if [ -n "${GPUPROXY_BENCH_BIN:-}" ]; then
  cp "$GPUPROXY_BENCH_BIN" "$tmp/benchproxy"
else
  go build -o "$tmp/benchproxy" ./tools/benchproxy
fi

if [ "${CALLGRIND:-0}" = 1 ]; then
  . scripts/lib/callgrind.sh
  exit 0
fi

if ! command -v nginx >/dev/null 2>&1 || ! command -v wrk >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
  echo "== installing nginx, wrk and curl (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nginx-light wrk curl >/dev/null || apt-get install -y -qq nginx wrk curl >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

echo "== starting upstream, gpuproxy and nginx on 127.0.0.1"
"$tmp/benchupstream" -addr 127.0.0.1:0 >"$tmp/upstream.out" 2>&1 &
pids+=($!)
UP=$(wait_ready "$tmp/upstream.out" | awk '{print $2}')

gplog=file
[ "$LOGS" = off ] && gplog=off
mkdir -p "$tmp/gp"
gpargs=(-upstream "$UP" -dir "$tmp/gp" -log "$gplog")
# BENCH_DATABASE_URL=postgres://…: usage records and the gate on Postgres
# (a temporary schema) instead of the embedded SQLite default.
[ -n "${BENCH_DATABASE_URL:-}" ] && gpargs+=(-db "$BENCH_DATABASE_URL")
[ -n "${PROFILE:-}" ] && gpargs+=(-cpuprofile "$PROFILE")
# COST=0.0001: a per-request cost, admitted against budget leases.
[ -n "${COST:-}" ] && gpargs+=(-cost "$COST")
"$tmp/benchproxy" "${gpargs[@]}" >"$tmp/gp.out" 2>&1 &
gppid=$!
pids+=($gppid)
read -r _ GP KEY < <(wait_ready "$tmp/gp.out")

NGPORT=$(free_port)
mkdir -p "$tmp/nginx/logs"
if [ "$LOGS" = off ]; then accesslog="access_log off;"; else accesslog="access_log $tmp/nginx/logs/access.log;"; fi
cat >"$tmp/nginx/nginx.conf" <<EOF
worker_processes auto;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
events { worker_connections 1024; }
http {
    $accesslog
    client_body_temp_path $tmp/nginx/body;
    proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi;
    uwsgi_temp_path $tmp/nginx/uwsgi;
    scgi_temp_path $tmp/nginx/scgi;
    upstream bench { server $UP; keepalive 128; }
    server {
        listen 127.0.0.1:$NGPORT;
        location / {
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
"$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -g 'daemon off;' >"$tmp/nginx.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do (echo >"/dev/tcp/127.0.0.1/$NGPORT") 2>/dev/null && break; sleep 0.1; done

cat >"$tmp/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("BENCH_KEY")
if key and key ~= "" then wrk.headers["X-API-Key"] = key end
EOF

DIRECT_URL="http://$UP/v1/chat/completions"
GP_URL="http://$GP/api/v1/proxy/gpi_bench/v1/chat/completions"
SVC_URL="http://$GP/v1/chat/completions"
NG_URL="http://127.0.0.1:$NGPORT/v1/chat/completions"

# Sanity: each path answers 200 with the upstream's body.
urls=("$DIRECT_URL" "$GP_URL" "$NG_URL")
if [ "$SERVICE" = on ]; then urls+=("$SVC_URL"); fi
for u in "${urls[@]}"; do
  code=$(curl -s -o "$tmp/probe" -w '%{http_code}' -X POST -H "X-API-Key: $KEY" -H 'Content-Type: application/json' \
    --data '{"model":"bench","messages":[]}' "$u")
  if [ "$code" != 200 ] || ! grep -q chatcmpl-bench "$tmp/probe"; then
    echo "probe of $u failed: $code $(cat "$tmp/probe")" >&2; exit 1
  fi
done

# to_ms VALUE: wrk's "1.23ms" / "850.00us" / "1.02s" in milliseconds.
to_ms() {
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
    else printf "%s", v }'
}

# measure NAME URL CONNS: one warm-up, one measured run; sets RPS/P50/P99.
measure() {
  local name=$1 url=$2 c=$3 t=1
  [ "$c" -ge 2 ] && t=2
  BENCH_KEY=$KEY wrk -t"$t" -c"$c" -d"$WARMUP" -s "$tmp/post.lua" "$url" >/dev/null
  BENCH_KEY=$KEY wrk -t"$t" -c"$c" -d"$DURATION" --latency -s "$tmp/post.lua" "$url" >"$tmp/wrk-$name-$c.txt"
  local out="$tmp/wrk-$name-$c.txt"
  if grep -q 'Non-2xx' "$out"; then echo "$name: non-2xx answers:" >&2; cat "$out" >&2; exit 1; fi
  RPS=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$out")
  P50=$(to_ms "$(awk '$1 == "50%" {print $2}' "$out")")
  P99=$(to_ms "$(awk '$1 == "99%" {print $2}' "$out")")
  printf '%-10s %5s conns  %9s req/s   p50 %8s ms   p99 %8s ms\n' "$name" "$c" "$RPS" "$P50" "$P99"
  eval "RPS_${name}_$c=$RPS P50_${name}_$c=$P50 P99_${name}_$c=$P99"
}

# The machine is shared (load generator, upstream and proxy on 2 cores)
# and its speed drifts, so the three targets are measured in ROUNDS
# alternating rounds and each ratio is taken within a round; the summary
# is the median round.
echo "== wrk: POST of a small JSON body, ${DURATION} per run after ${WARMUP} warm-up, $ROUNDS rounds; logs $LOGS"
ratios=()
added=()
svcratios=()
svcadded=()
for r in $(seq 1 "$ROUNDS"); do
  echo "-- round $r"
  for c in "$CONNS" 1; do
    measure direct "$DIRECT_URL" "$c"
    measure gpuproxy "$GP_URL" "$c"
    measure nginx "$NG_URL" "$c"
    if [ "$SERVICE" = on ]; then measure service "$SVC_URL" "$c"; fi
  done
  if [ "$SERVICE" = on ]; then
    svcratios+=("$(awk -v s="$(eval echo \$RPS_service_$CONNS)" -v gp="$(eval echo \$RPS_gpuproxy_$CONNS)" 'BEGIN { printf "%.3f", s/gp }')")
    svcadded+=("$(awk -v s="$P50_service_1" -v gp="$P50_gpuproxy_1" 'BEGIN { printf "%.3f", s-gp }')")
    echo "   service endpoint: ${svcratios[-1]} of the instance proxy's throughput at $CONNS conns; p50 +${svcadded[-1]} ms at 1 conn"
  fi
  ratios+=("$(awk -v gp="$(eval echo \$RPS_gpuproxy_$CONNS)" -v ng="$(eval echo \$RPS_nginx_$CONNS)" 'BEGIN { printf "%.3f", gp/ng }')")
  added+=("$(awk -v gp="$P50_gpuproxy_1" -v ng="$P50_nginx_1" -v d="$P50_direct_1" 'BEGIN { printf "%.3f %.3f", gp-d, ng-d }')")
  awk -v gp="$(eval echo \$RPS_gpuproxy_$CONNS)" -v ng="$(eval echo \$RPS_nginx_$CONNS)" -v d="$(eval echo \$RPS_direct_$CONNS)" -v c="$CONNS" \
    'BEGIN { printf "   %s conns: gpuproxy/nginx = %.2f; gpuproxy/direct = %.2f; nginx/direct = %.2f\n", c, gp/ng, gp/d, ng/d }'
  awk -v a="${added[-1]}" 'BEGIN { split(a, x, " "); printf "   1 conn: added p50 over direct: gpuproxy %.3f ms, nginx %.3f ms\n", x[1], x[2] }'
done

echo "== ratios (median of $ROUNDS rounds)"
printf '%s\n' "${ratios[@]}" | sort -n | awk -v c="$CONNS" '{ v[NR] = $1 } END {
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "%s conns: gpuproxy/nginx throughput = %.2f (target >= 0.60); rounds:", c, m
  for (i = 1; i <= NR; i++) printf " %.2f", v[i]; printf "\n" }'
printf '%s\n' "${added[@]}" | sort -n | awk '{ g[NR] = $1; n[NR] = $2 } END {
  m = (NR % 2) ? g[(NR + 1) / 2] : (g[NR / 2] + g[NR / 2 + 1]) / 2
  printf "1 conn: added p50 over direct: gpuproxy %.3f ms (target <= 0.25); rounds:", m
  for (i = 1; i <= NR; i++) printf " %.3f", g[i]; printf "\n" }'

if [ "$SERVICE" = on ]; then
  printf '%s\n' "${svcratios[@]}" | sort -n | awk -v c="$CONNS" '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%s conns: service endpoint/instance proxy throughput = %.2f (target >= 0.90); rounds:", c, m
    for (i = 1; i <= NR; i++) printf " %.2f", v[i]; printf "\n" }'
  printf '%s\n' "${svcadded[@]}" | sort -n | awk '{ g[NR] = $1 } END {
    m = (NR % 2) ? g[(NR + 1) / 2] : (g[NR / 2] + g[NR / 2 + 1]) / 2
    printf "1 conn: service endpoint p50 over the instance proxy: %.3f ms (target <= 0.05); rounds:", m
    for (i = 1; i <= NR; i++) printf " %.3f", g[i]; printf "\n" }'
fi

kill "$gppid" 2>/dev/null || true
wait "$gppid" 2>/dev/null || true
grep -v '^READY' "$tmp/gp.out" || true
# Allocations per request (the whole benchproxy process over every request
# of every run, counted by the Go runtime: they do not drift with the
# machine's load as the ratios above do). proxy/allocs_test.go holds the
# proxy's hot path to its budget.
apr=$(sed -n 's/^allocations per request: \([0-9.]*\).*/\1/p' "$tmp/gp.out")
echo "allocations per request (gpuproxy): ${apr:-n/a (this build does not report them)}"
