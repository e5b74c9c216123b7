package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// options are run's flags.
type options struct {
	url, key, placement, out string
	gpu                      string
	maxPrice                 float64
	replicas, overprovision  int
	duration, queue          time.Duration
	rate                     float64
}

// api calls gpuproxy with the API key.
type api struct {
	base, key string
	hc        *http.Client
}

// do sends a JSON request and decodes a JSON answer into out (when not
// nil); a status of 300 or more is an error carrying the body.
func (a *api) do(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-API-Key", a.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decoding: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// service is the benchmark's service: its definition (the placement's),
// the controller's events and the OpenAI endpoint the load goes through.
type service struct {
	a *api
	o options
}

// serviceName and serviceModel name the benchmark's service.
const (
	serviceName  = "bench"
	serviceModel = "bench-model"
)

// create defines the service: o.replicas replicas' load (scaling held
// off), the placement, its overprovision (default the service's), every
// replica a rent by spec of o.gpu at most o.maxPrice an hour. Times are
// the compressed clock's (1 s = 1 simulated minute): a preempted replica
// is kept 10 s (10 simulated minutes) in case it resumes.
func (sv *service) create(ctx context.Context) error {
	over := 0
	if sv.o.placement != "on-demand" {
		over = 1
	}
	if sv.o.overprovision >= 0 {
		over = sv.o.overprovision
	}
	def := map[string]any{"name": serviceName, "model": serviceModel, "image": "sim/llm", "port": 8000,
		"spec": map[string]any{"gpu": []string{sv.o.gpu}, "max_price_per_hour": sv.o.maxPrice, "num_gpus": 1,
			"providers": []string{"vast.ai"}, "billing": "hourly", "max_attempts": 20},
		"replicas":      map[string]any{"min": sv.o.replicas, "max": sv.o.replicas + over},
		"scale":         map[string]any{"up_delay": "24h", "down_delay": "24h"},
		"queue_timeout": sv.o.queue.String(), "placement": sv.o.placement, "preempted_grace": "10s"}
	if sv.o.placement != "on-demand" {
		def["overprovision"] = over
	}
	_, err := sv.a.do(ctx, http.MethodPost, "/api/v1/services", def, nil)
	return err
}

// ready is the service's ready replicas.
func (sv *service) ready(ctx context.Context) int {
	var v struct {
		Ready int `json:"ready_replicas"`
	}
	if _, err := sv.a.do(ctx, http.MethodGet, "/api/v1/services/"+serviceName, nil, &v); err != nil {
		return 0
	}
	return v.Ready
}

// tally counts the service's events of interest: replicas rented (and
// how many on demand), preemptions, fallbacks, refused rents (the first
// few messages).
func (sv *service) tally(ctx context.Context) (rented, onDemand, preempted, fallbacks int, refused []string, err error) {
	var l struct {
		Events []struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		} `json:"events"`
	}
	if _, err = sv.a.do(ctx, http.MethodGet, "/api/v1/services/"+serviceName+"/events?limit=500", nil, &l); err != nil {
		return
	}
	for _, e := range l.Events {
		switch e.Kind {
		case "service.replica_rented":
			rented++
			if strings.Contains(e.Message, ", on-demand, ") {
				onDemand++
			}
		case "service.replica_preempted":
			preempted++
		case "service.fallback_on_demand":
			fallbacks++
		case "service.scale_blocked":
			if len(refused) < 5 {
				refused = append(refused, e.Message)
			}
		}
	}
	return
}

// remove deletes the service and waits, up to a minute, until its
// replicas are drained and destroyed; then any instance of the account
// still not destroyed is.
func (sv *service) remove(ctx context.Context) {
	_, _ = sv.a.do(ctx, http.MethodDelete, "/api/v1/services/"+serviceName, nil, nil)
	until := time.Now().Add(time.Minute)
	for time.Now().Before(until) {
		if code, _ := sv.a.do(ctx, http.MethodGet, "/api/v1/services/"+serviceName, nil, nil); code == http.StatusNotFound {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	var l struct {
		Instances []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"instances"`
	}
	if _, err := sv.a.do(ctx, http.MethodGet, "/api/v1/gpu/instances", nil, &l); err == nil {
		for _, in := range l.Instances {
			if in.Status != "terminated" && in.Status != "failed" {
				_, _ = sv.a.do(ctx, http.MethodDelete, "/api/v1/gpu/instances/"+in.ID, nil, nil)
			}
		}
	}
}

// outcome is one request's result.
type outcome struct {
	ok      bool
	latency time.Duration
	tokens  int
}

// request sends one chat completion to the service's OpenAI endpoint:
// gpuproxy routes it to a ready replica (waiting up to the service's
// queue timeout for one) and retries it once on another replica when
// the first could not answer.
func (sv *service) request(ctx context.Context) outcome {
	start := time.Now()
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	body := map[string]any{"model": serviceModel, "max_tokens": 64, "messages": []map[string]string{{"role": "user",
		"content": "summarize the state of the interruptible GPU market in one short sentence please"}}}
	rctx, cancel := context.WithTimeout(ctx, sv.o.queue+10*time.Second)
	defer cancel()
	if _, err := sv.a.do(rctx, http.MethodPost, "/v1/chat/completions", body, &out); err != nil {
		return outcome{latency: time.Since(start)}
	}
	return outcome{ok: true, latency: time.Since(start), tokens: out.Usage.CompletionTokens}
}

// window is one spend window's peak.
type window struct {
	Minutes   int     `json:"window_minutes"`
	Limit     float64 `json:"limit"`
	PeakSpent float64 `json:"peak_spent"`
	PeakTotal float64 `json:"peak_spent_held_committed"`
}

// sampleSpending reads GET /api/v1/spending every 250 ms until ctx ends,
// keeping each window's peak.
func sampleSpending(ctx context.Context, a *api, mu *sync.Mutex, peaks map[int]*window) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		var sp struct {
			Windows []struct {
				Minutes   int     `json:"window_minutes"`
				Limit     float64 `json:"limit"`
				Spent     float64 `json:"spent"`
				Held      float64 `json:"held"`
				Committed float64 `json:"committed"`
			} `json:"windows"`
		}
		if _, err := a.do(context.WithoutCancel(ctx), http.MethodGet, "/api/v1/spending", nil, &sp); err == nil {
			mu.Lock()
			for _, w := range sp.Windows {
				p := peaks[w.Minutes]
				if p == nil {
					p = &window{Minutes: w.Minutes}
					peaks[w.Minutes] = p
				}
				p.Limit = w.Limit
				p.PeakSpent = max(p.PeakSpent, w.Spent)
				p.PeakTotal = max(p.PeakTotal, w.Spent+w.Held+w.Committed)
			}
			mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// runBench is `benchmarket run`.
func runBench(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.url, "url", "", "gpuproxy's base URL (loopback)")
	fs.StringVar(&o.key, "key", "", "API key of the benchmark's account")
	fs.StringVar(&o.placement, "placement", "on-demand", "the service's placement: on-demand, interruptible or "+
		"interruptible-with-fallback")
	fs.StringVar(&o.out, "out", "", "write the result as JSON to this file")
	fs.StringVar(&o.gpu, "gpu", "RTX 4090", "the replicas' GPU")
	fs.Float64Var(&o.maxPrice, "max-price", 0.6, "the replicas' max_price_per_hour, USD")
	fs.IntVar(&o.replicas, "replicas", 4, "replicas the load needs (the service's replicas.min)")
	fs.IntVar(&o.overprovision, "overprovision", -1, "extra interruptible replicas (default: the service's, 1)")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long the load runs")
	fs.Float64Var(&o.rate, "rate", 40, "requests per second")
	fs.DurationVar(&o.queue, "queue-timeout", 10*time.Second, "the service's queue_timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.url == "" || o.key == "" || o.out == "" || o.rate <= 0 || o.replicas < 1 {
		return errUsage
	}
	a := &api{base: o.url, key: o.key, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	sv := &service{a: a, o: o}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	var pmu sync.Mutex
	peaks := map[int]*window{}
	sctx, sstop := context.WithCancel(ctx)
	defer sstop()
	sdone := make(chan struct{})
	go func() { sampleSpending(sctx, a, &pmu, peaks); close(sdone) }()
	if err := sv.create(ctx); err != nil {
		return err
	}
	var bmu sync.Mutex
	var brk Breakdown
	bctx, bstop := context.WithCancel(ctx)
	defer bstop()
	bdone := make(chan struct{})
	go func() { sampleReplicas(bctx, sv, o.replicas, &bmu, &brk); close(bdone) }()

	// Warm up: the load starts when the load's replicas are ready (or
	// after a minute), so each placement is measured over the same span.
	warm := time.Now().Add(time.Minute)
	for time.Now().Before(warm) && sv.ready(ctx) < o.replicas {
		time.Sleep(100 * time.Millisecond)
	}

	var lmu sync.Mutex
	var outs []outcome
	var wg sync.WaitGroup
	start := time.Now()
	gap := time.Duration(float64(time.Second) / o.rate)
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * gap)
		if at.Sub(start) >= o.duration {
			break
		}
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := sv.request(ctx)
			lmu.Lock()
			outs = append(outs, out)
			lmu.Unlock()
		}()
	}
	wg.Wait()
	loadEnd := time.Now()
	bstop()
	<-bdone
	rented, onDemand, preempted, fallbacks, refused, err := sv.tally(ctx)
	if err != nil {
		return err
	}

	// Tear down: delete the service (its replicas drain and are
	// destroyed), then let the meters settle before reading the ledger.
	sv.remove(context.Background())
	time.Sleep(3 * time.Second)
	sstop()
	<-sdone
	var tx struct {
		Totals struct {
			Charges     float64 `json:"charges"`
			Refunds     float64 `json:"refunds"`
			Adjustments float64 `json:"adjustments"`
		} `json:"totals"`
	}
	if _, err := a.do(context.Background(), http.MethodGet, "/api/v1/billing/transactions?limit=1", nil, &tx); err != nil {
		return err
	}

	res := Result{Market: o.placement, Replicas: o.replicas, Rate: o.rate, Seconds: loadEnd.Sub(start).Seconds(),
		Cost: tx.Totals.Charges + tx.Totals.Refunds + tx.Totals.Adjustments, ReplicasUsed: rented,
		OnDemandUsed: onDemand, Fallbacks: fallbacks, Preemptions: preempted, RentErrors: refused, Breakdown: brk}
	var lat []time.Duration
	for _, out := range outs {
		res.Requests++
		if out.ok {
			res.Answered++
			res.OutputTokens += out.tokens
			lat = append(lat, out.latency)
		}
	}
	res.P50ms, res.P99ms = ms(percentile(lat, 0.50)), ms(percentile(lat, 0.99))
	for _, w := range peaks {
		res.Windows = append(res.Windows, *w)
	}
	sort.Slice(res.Windows, func(i, j int) bool { return res.Windows[i].Minutes < res.Windows[j].Minutes })
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.out, b, 0o644); err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, res.line())
	return err
}

// ms is d in milliseconds, to two decimals.
func ms(d time.Duration) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64), 64)
	return v
}
