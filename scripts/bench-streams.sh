#!/usr/bin/env bash
# Streaming benchmark: many long-lived SSE token streams (one per
# connection) from a Go SSE upstream on loopback, reached (a) directly,
# (b) through gpuproxy's proxy path and (c) through nginx proxy_pass
# (proxy_buffering off, HTTP/1.1 keep-alive upstream). Each run opens
# STREAMS streams evenly over RAMP, waits SETTLE, then for HOLD measures,
# with every stream open and EVENT_RATE events per second flowing on each:
#
#   - resident memory per open stream of the proxy: VmRSS (/proc/PID/status,
#     summed over nginx's master and workers) with every stream open, less
#     VmRSS before the first stream, over the streams open;
#   - CPU per event: utime+stime (/proc/PID/stat) over the hold, over the
#     events the load client received in it;
#   - time to first byte p50 (connect included), and what each proxy adds
#     to the direct run's; and the first byte's distribution over the ramp
#     (p50, p90, p99) for each run, and its p50 in each tenth of the ramp
#     (how it grows as open streams pile up);
#   - usage records missing: requests gpuproxy answered (the load client's
#     completed streams and the probe) less the usage records its store
#     holds after a clean shutdown.
#
# Every proxy is started fresh for each run. The targets run ROUNDS
# rounds, in alternating order; each ratio is taken within a round and the
# summary is the median round. The last line is
#
#   streams: rss_per_stream_ratio=X cpu_per_event_ratio=Y ttfb_p50_added_ms gpuproxy=A nginx=B usage_missing=N
#
# (ratios are gpuproxy over nginx).
#
#   scripts/bench-streams.sh                       # 1000 streams, 10 events/s each
#   STREAMS=9900 scripts/bench-streams.sh          # needs ulimit -n >= 2*STREAMS+200
#   PROFILE=/tmp/gp.pprof ROUNDS=1 scripts/bench-streams.sh
#   POST=1 scripts/bench-streams.sh                # streamed chat completions: POST /v1/chat/completions
#                                                  # with a body, as OpenAI clients send them (gpuproxy
#                                                  # then asks for the usage chunk and counts tokens)
#   GPUPROXY_BENCH_BIN=/path/to/old/benchproxy POST=1 scripts/bench-streams.sh   # measure another build
#
# Environment: STREAMS (1000), EVENT_RATE (events/s per stream, 10), RAMP
# (5s), SETTLE (2s), HOLD (10s), ROUNDS (2), LOGS=on|off (request logs in
# both proxies, default on), PROFILE (CPU profile of gpuproxy, the last
# gpuproxy run's), BENCH_DATABASE_URL (usage records on Postgres instead
# of SQLite). Everything listens on 127.0.0.1 only. nginx and curl are
# installed with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

STREAMS=${STREAMS:-1000}
EVENT_RATE=${EVENT_RATE:-10}
RAMP=${RAMP:-5s}
SETTLE=${SETTLE:-2s}
HOLD=${HOLD:-10s}
ROUNDS=${ROUNDS:-2}
LOGS=${LOGS:-on}

# Each proxy holds two descriptors per stream (caller and upstream).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
need=$((2 * STREAMS + 200))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
  echo "ulimit -n is $(ulimit -n) (hard $(ulimit -Hn)); $STREAMS streams need at least $need: raise the hard limit" >&2
  exit 1
fi

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ] || ! command -v curl >/dev/null 2>&1; then
  echo "== installing nginx and curl (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nginx-light curl >/dev/null || apt-get install -y -qq nginx curl >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# tmp, pids (cleaned up on exit), wait_ready, free_port
. scripts/lib/bench.sh

# stop PID: SIGTERM and wait.
stop() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

echo "== building"
go build -o "$tmp/streambench" ./tools/streambench
if [ -n "${GPUPROXY_BENCH_BIN:-}" ]; then
  cp "$GPUPROXY_BENCH_BIN" "$tmp/benchproxy"
else
  go build -o "$tmp/benchproxy" ./tools/benchproxy
fi

"$tmp/streambench" upstream -addr 127.0.0.1:0 >"$tmp/upstream.out" 2>&1 &
pids+=($!)
UP=$(wait_ready "$tmp/upstream.out" | awk '{print $2}')

loadargs=(-streams "$STREAMS" -rate "$EVENT_RATE" -ramp "$RAMP" -settle "$SETTLE" -hold "$HOLD")
STREAM_PATH=/v1/stream
if [ -n "${POST:-}" ]; then
  STREAM_PATH=/v1/chat/completions
  loadargs+=(-post)
fi

# probe URL [KEY]: one short stream must answer 200 with an event.
probe() {
  local until=$(($(date +%s%3N) + 300))
  curl -sN -m 10 ${2:+-H "X-API-Key: $2"} ${POST:+-H 'Content-Type: application/json' --data '{"model":"bench","stream":true,"max_tokens":9}'} \
    -o "$tmp/probe" "$1?every=100&until=$until" || true
  if ! grep -q '^data: ' "$tmp/probe"; then echo "probe of $1 failed: $(head -c 300 "$tmp/probe")" >&2; exit 1; fi
}

# result NAME ROUND FIELD: a field of a run's RESULT line.
result() { sed -n 's/.* '"$3"'=\([^ ]*\).*/\1/p' "$tmp/result-$1-$2"; }

USAGE_MISSING=0

run_direct() {
  "$tmp/streambench" load -addr "$UP" -path "$STREAM_PATH" -name direct "${loadargs[@]}" >"$tmp/result-direct-$1"
}

run_gpuproxy() {
  local r=$1 gplog=file
  [ "$LOGS" = off ] && gplog=off
  rm -rf "$tmp/gp"; mkdir -p "$tmp/gp"
  local args=(-upstream "$UP" -dir "$tmp/gp" -log "$gplog")
  [ -n "${BENCH_DATABASE_URL:-}" ] && args+=(-db "$BENCH_DATABASE_URL")
  [ -n "${PROFILE:-}" ] && args+=(-cpuprofile "$PROFILE")
  "$tmp/benchproxy" "${args[@]}" >"$tmp/gp.out" 2>&1 &
  local gppid=$!
  pids+=("$gppid")
  local GP KEY
  read -r _ GP KEY < <(wait_ready "$tmp/gp.out")
  local path=/api/v1/proxy/gpi_bench$STREAM_PATH
  probe "http://$GP$path" "$KEY"
  "$tmp/streambench" load -addr "$GP" -path "$path" -key "$KEY" -pids "$gppid" -name gpuproxy "${loadargs[@]}" \
    >"$tmp/result-gpuproxy-$r"
  stop "$gppid"
  local written completed
  written=$(sed -n 's/^usage records written: \([0-9]*\).*/\1/p' "$tmp/gp.out")
  completed=$(result gpuproxy "$r" completed)
  if [ -z "$written" ]; then
    echo "gpuproxy did not report its usage records:" >&2; cat "$tmp/gp.out" >&2; written=0
  fi
  local missing=$((completed + 1 - written))
  [ "$missing" -lt 0 ] && missing=0
  USAGE_MISSING=$((USAGE_MISSING + missing))
  grep -v '^READY' "$tmp/gp.out" | sed 's/^/   gpuproxy: /' || true
}

run_nginx() {
  local r=$1 port
  port=$(free_port)
  rm -rf "$tmp/nginx"; mkdir -p "$tmp/nginx/logs"
  local accesslog="access_log $tmp/nginx/logs/access.log;"
  [ "$LOGS" = off ] && accesslog="access_log off;"
  cat >"$tmp/nginx/nginx.conf" <<EOF
worker_processes auto;
worker_rlimit_nofile $need;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
events { worker_connections $need; }
http {
    $accesslog
    client_body_temp_path $tmp/nginx/body;
    proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi;
    uwsgi_temp_path $tmp/nginx/uwsgi;
    scgi_temp_path $tmp/nginx/scgi;
    upstream streams { server $UP; keepalive 1024; }
    server {
        listen 127.0.0.1:$port backlog=4096;
        location / {
            proxy_pass http://streams;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 1h;
        }
    }
}
EOF
  "$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -g 'daemon off;' >"$tmp/nginx.out" 2>&1 &
  local master=$!
  pids+=("$master")
  for _ in $(seq 1 100); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  probe "http://127.0.0.1:$port$STREAM_PATH"
  local all
  all=$(echo "$master" $(pgrep -P "$master") | tr ' ' ',')
  "$tmp/streambench" load -addr "127.0.0.1:$port" -path "$STREAM_PATH" -pids "$all" -name nginx "${loadargs[@]}" >"$tmp/result-nginx-$r"
  stop "$master"
}

echo "== $STREAMS streams, $EVENT_RATE events/s each, opened over $RAMP, measured for $HOLD; $ROUNDS rounds; logs $LOGS; ulimit -n $(ulimit -n)"
rss=() cpu=() addgp=() addng=() fb_direct=() fb_gpuproxy=() fb_nginx=()
for r in $(seq 1 "$ROUNDS"); do
  echo "-- round $r"
  order=(direct gpuproxy nginx)
  [ $((r % 2)) -eq 0 ] && order=(nginx gpuproxy direct)
  for t in "${order[@]}"; do
    "run_$t" "$r"
    sed 's/^RESULT /   /' "$tmp/result-$t-$r"
    sleep 1
  done
  rss+=("$(awk -v g="$(result gpuproxy "$r" rss_per_stream_kb)" -v n="$(result nginx "$r" rss_per_stream_kb)" \
    'BEGIN { printf "%.3f", (n > 0) ? g / n : 0 }')")
  cpu+=("$(awk -v g="$(result gpuproxy "$r" cpu_per_event_us)" -v n="$(result nginx "$r" cpu_per_event_us)" \
    'BEGIN { printf "%.3f", (n > 0) ? g / n : 0 }')")
  d=$(result direct "$r" ttfb_p50_ms)
  addgp+=("$(awk -v x="$(result gpuproxy "$r" ttfb_p50_ms)" -v d="$d" 'BEGIN { printf "%.3f", x - d }')")
  addng+=("$(awk -v x="$(result nginx "$r" ttfb_p50_ms)" -v d="$d" 'BEGIN { printf "%.3f", x - d }')")
  echo "   round $r: rss/stream gpuproxy/nginx ${rss[-1]}, cpu/event gpuproxy/nginx ${cpu[-1]}," \
    "added ttfb p50 gpuproxy ${addgp[-1]} ms, nginx ${addng[-1]} ms"
  # The first-byte distribution over the ramp (every stream's, connect
  # included), for each run of the round.
  for t in direct gpuproxy nginx; do
    fb="$(result "$t" "$r" ttfb_p50_ms) $(result "$t" "$r" ttfb_p90_ms) $(result "$t" "$r" ttfb_p99_ms)"
    eval "fb_${t}+=(\"\$fb\")"
    printf '   round %s: first byte %-8s p50 %8s ms  p90 %8s ms  p99 %8s ms\n' "$r" "$t" $fb
  done
  for t in direct gpuproxy nginx; do
    printf '   round %s: first byte %-8s p50 by tenth of the ramp (ms) %s\n' "$r" "$t" "$(result "$t" "$r" ttfb_ramp_p50_ms)"
  done
done

# median VALUES...: the median of numbers.
median() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# The first byte over the ramp: each percentile's median over the rounds.
for t in direct gpuproxy nginx; do
  eval 'rows=("${fb_'"$t"'[@]}")'
  p50=() p90=() p99=()
  for row in "${rows[@]}"; do read -r a b c <<<"$row"; p50+=("$a"); p90+=("$b"); p99+=("$c"); done
  printf 'first byte over the ramp, %-8s p50 %s ms, p90 %s ms, p99 %s ms (median of %s rounds)\n' "$t" \
    "$(median "${p50[@]}")" "$(median "${p90[@]}")" "$(median "${p99[@]}")" "$ROUNDS"
done

echo "streams: rss_per_stream_ratio=$(median "${rss[@]}") cpu_per_event_ratio=$(median "${cpu[@]}")" \
  "ttfb_p50_added_ms gpuproxy=$(median "${addgp[@]}") nginx=$(median "${addng[@]}") usage_missing=$USAGE_MISSING"
