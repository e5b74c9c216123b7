#!/usr/bin/env bash
# Market benchmark: what a million output tokens cost on interruptible
# GPUs against on-demand ones, inside a hard spending limit. For each
# placement the product can express today (a rent by spec's market:
# on-demand, interruptible, any) it starts a fresh `gpuproxy sim --market`
# (seeded; preemption hazard, price and bid levels, a preemption wave and
# a supply gap from testdata/market/trace.jsonl) and a fresh
# `gpuproxy serve` on SQLite, both on 127.0.0.1, and runs
# tools/benchmarket: REPLICAS replicas rented by spec through the guard
# rails, RATE chat completions per second through the instance proxy for
# DURATION. It prints, per placement, $ per 1M output tokens (the ledger's
# charges over the output tokens answered), the share answered, p50/p99
# latency, preemptions seen, replicas used and each window's peak spend
# (spent + held + committed, sampled every 250 ms) against its limit; then
# interruptible and any against on-demand, judged against issue 33's
# target (>= 45% lower $ per 1M output tokens, >= 99.5% answered, no
# limit passed).
#
# Time is compressed: the market ticks every second and one second stands
# for one simulated minute (hazard and hold are scaled to match), so
# DURATION=60s is a simulated hour. Billing runs on the wall clock, which
# cancels out of $ per token.
#
# Services have no placement yet: benchmarket stands in for the services
# controller (it rents a replacement by spec when a replica is preempted
# and destroys the preempted one) and router (a failed request is retried
# once on another replica).
#
#   scripts/bench-market.sh
#   DURATION=30s RATE=20 scripts/bench-market.sh
#
# Environment: DURATION (60s), RATE (40 requests/s), REPLICAS (4), SEED
# (42), TRACE (testdata/market/trace.jsonl), LIMIT (60-minute window, USD;
# default 3), MAX_PRICE (the spec's max_price_per_hour, 0.6),
# PLACEMENTS ("on-demand interruptible any").
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60s}
RATE=${RATE:-40}
REPLICAS=${REPLICAS:-4}
SEED=${SEED:-42}
TRACE=${TRACE:-testdata/market/trace.jsonl}
LIMIT=${LIMIT:-3}
MAX_PRICE=${MAX_PRICE:-0.6}
PLACEMENTS=${PLACEMENTS:-on-demand interruptible any}

# tmp, pids (cleaned up on exit), wait_ready, free_port
. scripts/lib/bench.sh

echo "== building"
go build -o "$tmp/gpuproxy" ./cmd/gpuproxy
go build -o "$tmp/benchmarket" ./tools/benchmarket
gp=$tmp/gpuproxy

# stop PID: ends a process this script started and waits for it.
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

results=()
for placement in $PLACEMENTS; do
  dir=$tmp/$placement
  mkdir -p "$dir"
  echo "== $placement: sim (seed $SEED, $TRACE), serve, $REPLICAS replicas, $RATE req/s for $DURATION"
  # 1 s = 1 simulated minute: hazard 0.5/h → 30/h, hold 10 min → 10 s,
  # 6 hosts/h → 360/h; a replica takes 3 s (3 simulated minutes) to start.
  "$gp" sim --seed "$SEED" --market-tick 1s --preempt-hazard 30 --preempt-hold 10s --host-rate 360 \
    --start-delay 3s --market-trace "$TRACE" --env-file "$dir/sim.env" 2>"$dir/sim.log" >/dev/null &
  simpid=$!
  pids+=("$simpid")
  for _ in $(seq 1 100); do [ -s "$dir/sim.env" ] && break; sleep 0.1; done
  [ -s "$dir/sim.env" ] || { cat "$dir/sim.log"; exit 1; }
  port=$(free_port)
  cat >"$dir/config.yaml" <<YAML
listen: 127.0.0.1:$port
database_url: sqlite:$dir/gpuproxy.db
metering_interval: 1s
rate_limit_per_minute: 0
log_level: warn
fleet:
  poll_interval: 500ms
  offer_cache_ttl: 1s
proxy:
  allow_networks: [127.0.0.0/8]
YAML
  (
    set -a; . "$dir/sim.env"; set +a
    "$gp" migrate -c "$dir/config.yaml" >/dev/null 2>&1
    "$gp" accounts create bench -c "$dir/config.yaml" >/dev/null 2>&1
    "$gp" limits set --account bench --window "60m=$LIMIT" --window 24h=50 -c "$dir/config.yaml" >/dev/null 2>&1
    "$gp" credits add --account bench --amount 100 -c "$dir/config.yaml" >/dev/null 2>&1
    "$gp" keys create --account bench --preset engineer --name bench -c "$dir/config.yaml" 2>/dev/null | tail -1 >"$dir/key"
  )
  (set -a; . "$dir/sim.env"; set +a; exec "$gp" serve -c "$dir/config.yaml") >"$dir/serve.log" 2>&1 &
  servepid=$!
  pids+=("$servepid")
  for _ in $(seq 1 300); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1
  done
  "$tmp/benchmarket" run -url "http://127.0.0.1:$port" -key "$(cat "$dir/key")" -market "$placement" \
    -replicas "$REPLICAS" -rate "$RATE" -duration "$DURATION" -max-price "$MAX_PRICE" -out "$dir/result.json"
  results+=("$dir/result.json")
  stop "$servepid"
  stop "$simpid"
done

echo "== results (seed $SEED, $REPLICAS replicas, $RATE req/s, $DURATION = a simulated $(( ${DURATION%s} )) minutes)"
"$tmp/benchmarket" compare "${results[@]}"
