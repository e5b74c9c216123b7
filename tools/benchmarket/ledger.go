package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Breakdown is where a placement's replica money went, from the
// service's replicas sampled every sampleEvery while the benchmark runs
// (warm-up and load): each replica's time by market and by what it was
// doing, and what it cost at its price as the ledger charges it: from
// when it runs until destroyed, nothing while loading (vast.ai bills only
// its disk then) or paused. Teardown (the service
// deleted, its replicas drained) is not sampled. Seconds are wall
// seconds, each a simulated minute; money is integer micro-dollars.
type Breakdown struct {
	// Running replica-seconds and their cost, per market.
	SpotSeconds  float64 `json:"spot_seconds"`
	SpotMicros   int64   `json:"spot_micros"`
	OnDemSeconds float64 `json:"on_demand_seconds"`
	OnDemMicros  int64   `json:"on_demand_micros"`
	// Billed, not serving: running but not probed ready yet (start-up
	// past "running"), and draining.
	StartupSeconds float64 `json:"startup_billed_seconds"`
	StartupMicros  int64   `json:"startup_billed_micros"`
	DrainSeconds   float64 `json:"draining_seconds"`
	DrainMicros    int64   `json:"draining_micros"`
	// Loading (rented, not running yet) and paused by a preemption: not
	// charged (the provider bills only the disk then).
	LoadingSeconds float64 `json:"loading_seconds"`
	PausedSeconds  float64 `json:"paused_seconds"`
	// Surplus: billed replicas past the load's size. Over is
	// interruptible ones past it (the overprovision); Overlap on-demand
	// ones billed while ready interruptible ones alone cover the load (a
	// fallback and its replacement both running).
	OverSeconds    float64 `json:"spot_over_seconds"`
	OverMicros     int64   `json:"spot_over_micros"`
	OverlapSeconds float64 `json:"overlap_seconds"`
	OverlapMicros  int64   `json:"overlap_micros"`
	Samples        int     `json:"samples"`
}

// sampleEvery is how often the replicas are sampled.
const sampleEvery = 250 * time.Millisecond

// replicaSample is one replica as GET /api/v1/services/NAME shows it.
type replicaSample struct {
	State    string      `json:"state"`
	Instance string      `json:"instance_status"`
	Market   string      `json:"market"`
	Price    json.Number `json:"price_per_hour"` // USD, a decimal (gpuproxy.Micros)
}

// micros reads a non-negative decimal number of dollars as exact
// micro-dollars.
func micros(n json.Number) (int64, error) {
	whole, frac, _ := strings.Cut(string(n), ".")
	if len(frac) > 6 {
		return 0, fmt.Errorf("price %q: more than 6 decimals", n)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("price %q: %w", n, err)
	}
	var f int64
	if frac != "" {
		if f, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil {
			return 0, fmt.Errorf("price %q: %w", n, err)
		}
	}
	return w*1_000_000 + f, nil
}

// sampleReplicas reads the service every sampleEvery until ctx ends and
// adds each interval to b (under mu); load is the load's replica count.
func sampleReplicas(ctx context.Context, sv *service, load int, mu *sync.Mutex, b *Breakdown) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var v struct {
			Instances []replicaSample `json:"instances"`
		}
		if _, err := sv.a.do(ctx, http.MethodGet, "/api/v1/services/"+serviceName, nil, &v); err != nil {
			continue
		}
		now := time.Now()
		dt := now.Sub(last)
		last = now
		mu.Lock()
		b.add(v.Instances, load, dt)
		mu.Unlock()
	}
}

// add accounts one interval dt in which the replicas were reps.
func (b *Breakdown) add(reps []replicaSample, load int, dt time.Duration) {
	sec := dt.Seconds()
	cost := func(price int64) int64 { return price * dt.Milliseconds() / 3_600_000 }
	spotReady := 0
	var spotBilled, odBilled []int64
	for _, r := range reps {
		price, err := micros(r.Price)
		if err != nil {
			continue
		}
		switch r.Instance {
		case "pending", "starting":
			b.LoadingSeconds += sec
			continue
		case "preempted":
			b.PausedSeconds += sec
			continue
		case "running":
		default:
			continue
		}
		switch r.State {
		case "starting", "unready":
			b.StartupSeconds += sec
			b.StartupMicros += cost(price)
		case "draining":
			b.DrainSeconds += sec
			b.DrainMicros += cost(price)
		}
		if r.Market == "interruptible" {
			b.SpotSeconds += sec
			b.SpotMicros += cost(price)
			spotBilled = append(spotBilled, price)
			if r.State == "ready" {
				spotReady++
			}
		} else {
			b.OnDemSeconds += sec
			b.OnDemMicros += cost(price)
			odBilled = append(odBilled, price)
		}
	}
	if n := len(spotBilled) - load; n > 0 {
		b.OverSeconds += float64(n) * sec
		for _, p := range spotBilled[:n] {
			b.OverMicros += cost(p)
		}
	}
	if spotReady >= load {
		for _, p := range odBilled {
			b.OverlapSeconds += sec
			b.OverlapMicros += cost(p)
		}
	}
	b.Samples++
}

// SpotPrice and OnDemPrice are the mean price per billed hour of each
// market's replicas, micro-dollars (0: none billed).
func (b Breakdown) SpotPrice() float64  { return perHour(b.SpotMicros, b.SpotSeconds) }
func (b Breakdown) OnDemPrice() float64 { return perHour(b.OnDemMicros, b.OnDemSeconds) }

func perHour(micros int64, sec float64) float64 {
	if sec == 0 {
		return 0
	}
	return float64(micros) / sec * 3600
}
