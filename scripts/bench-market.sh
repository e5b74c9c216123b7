#!/usr/bin/env bash
# Market benchmark: what a million output tokens cost on a service whose
# replicas ride the interruptible market, against on-demand replicas,
# inside a hard spending limit. For each placement (on-demand,
# interruptible, interruptible-with-fallback) it starts a fresh `gpuproxy
# sim --market` (seeded; preemption hazard, price and bid levels, a
# preemption wave, a supply gap and a bid spike over the cap from
# testdata/market/trace.jsonl) and a fresh `gpuproxy serve` on SQLite, both
# on 127.0.0.1, and runs tools/benchmarket: it defines a service with the
# placement (REPLICAS replicas' load; an interruptible placement keeps one
# extra while preemptions are recent) and sends RATE chat completions per second to the service's
# OpenAI endpoint (/v1/chat/completions with its model) for DURATION. The
# services controller rents, spreads, replaces preempted replicas, falls
# back to on-demand and moves back; the router retries a request whose
# replica could not answer. It prints, per placement, $ per 1M output
# tokens (the ledger's charges over the output tokens answered), the share
# answered, p50/p99 latency, preemptions seen, replicas rented (on demand
# among them) and each window's peak spend (spent + held + committed,
# sampled every 250 ms) against its limit; then each placement against
# on-demand, judged against issue 33's target (>= 45% lower $ per 1M
# output tokens, >= 99.5% answered, no limit passed; or >= 85% of the
# available discount captured: 1 - the interruptible price paid per
# running hour over the on-demand placement's, time-weighted), and where
# each placement's money went.
#
# Time is compressed: the market ticks every second and one second stands
# for one simulated minute (hazard and hold are scaled to match, and the
# services controller's timings with them), so DURATION=60s is a simulated
# hour. Billing runs on the wall clock, which cancels out of $ per token.
#
#   scripts/bench-market.sh
#   DURATION=30s RATE=20 scripts/bench-market.sh
#
# Environment: DURATION (60s), RATE (40 requests/s), REPLICAS (4), SEED
# (42), TRACE (testdata/market/trace.jsonl), LIMIT (60-minute window, USD;
# default 3), MAX_PRICE (the spec's max_price_per_hour, 0.6),
# PLACEMENTS ("on-demand interruptible interruptible-with-fallback"),
# OUT (a directory to keep each placement's result JSON in; none kept
# by default).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60s}
RATE=${RATE:-40}
REPLICAS=${REPLICAS:-4}
SEED=${SEED:-42}
TRACE=${TRACE:-testdata/market/trace.jsonl}
LIMIT=${LIMIT:-3}
MAX_PRICE=${MAX_PRICE:-0.6}
PLACEMENTS=${PLACEMENTS:-on-demand interruptible interruptible-with-fallback}
OUT=${OUT:-}

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
  echo "== $placement: sim (seed $SEED, $TRACE), serve, a service of $REPLICAS replicas' load, $RATE req/s for $DURATION"
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
services:
  interval: 250ms
  probe_interval: 1s
  unready_timeout: 5s
  drain_timeout: 5s
  blocked_retry: 2s
  blocked_retry_max: 10s
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
  "$tmp/benchmarket" run -url "http://127.0.0.1:$port" -key "$(cat "$dir/key")" -placement "$placement" \
    -replicas "$REPLICAS" -rate "$RATE" -duration "$DURATION" -max-price "$MAX_PRICE" -out "$dir/result.json"
  results+=("$dir/result.json")
  if [ -n "$OUT" ]; then mkdir -p "$OUT" && cp "$dir/result.json" "$OUT/$placement.json"; fi
  stop "$servepid"
  stop "$simpid"
done

echo "== results (seed $SEED, $REPLICAS replicas, $RATE req/s, $DURATION = a simulated $(( ${DURATION%s} )) minutes)"
"$tmp/benchmarket" compare "${results[@]}"
