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
	"sync"
	"sync/atomic"
	"time"
)

// options are run's flags.
type options struct {
	url, key, market, out string
	gpu                   string
	maxPrice              float64
	replicas              int
	duration, queue       time.Duration
	rate                  float64
	poll                  time.Duration
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

// replica is one rented instance.
type replica struct {
	id       string
	ready    bool
	inflight atomic.Int64
}

// fleet keeps the replicas: the stand-in for the services controller.
type fleet struct {
	a    *api
	o    options
	mu   sync.Mutex
	live map[string]*replica // rented and not given up
	used int                 // instances rented
	pre  int                 // preemptions seen
	errs []string            // rents refused, in order (first few)
	all  []string            // every instance id rented
	rr   int
}

// rent rents one replica by spec with the placement's market.
func (f *fleet) rent(ctx context.Context) {
	spec := map[string]any{"gpu": []string{f.o.gpu}, "max_price_per_hour": f.o.maxPrice, "num_gpus": 1,
		"providers": []string{"vast.ai"}, "billing": "hourly", "market": f.o.market, "max_attempts": 20}
	var in struct {
		ID string `json:"id"`
	}
	_, err := f.a.do(ctx, http.MethodPost, "/api/v1/gpu/instances", map[string]any{"spec": spec,
		"image": "sim/llm", "ports": []int{8000}, "label": "benchmarket"}, &in)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if len(f.errs) < 5 {
			f.errs = append(f.errs, err.Error())
		}
		return
	}
	f.used++
	f.all = append(f.all, in.ID)
	f.live[in.ID] = &replica{id: in.ID}
}

// watch polls every live replica's status until ctx ends: running is
// ready; preempted, failed or gone is destroyed and replaced.
func (f *fleet) watch(ctx context.Context) {
	t := time.NewTicker(f.o.poll)
	defer t.Stop()
	for {
		f.mu.Lock()
		ids := make([]string, 0, len(f.live))
		for id := range f.live {
			ids = append(ids, id)
		}
		missing := f.o.replicas - len(f.live)
		f.mu.Unlock()
		for range max(missing, 0) {
			f.rent(ctx)
		}
		for _, id := range ids {
			var in struct {
				Status string `json:"status"`
			}
			if _, err := f.a.do(ctx, http.MethodGet, "/api/v1/gpu/instances/"+id, nil, &in); err != nil {
				continue
			}
			f.mu.Lock()
			r := f.live[id]
			switch in.Status {
			case "running":
				r.ready = true
			case "preempted", "failed", "terminated", "terminating", "stopped":
				if in.Status == "preempted" {
					f.pre++
				}
				delete(f.live, id)
				f.mu.Unlock()
				// The stated rule: a preempted replica is destroyed at
				// once (its disk would bill while paused) and replaced.
				_, _ = f.a.do(context.WithoutCancel(ctx), http.MethodDelete, "/api/v1/gpu/instances/"+id, nil, nil)
				continue
			default:
				r.ready = false
			}
			f.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pick returns the ready replica with the fewest requests in flight,
// other than skip, or nil.
func (f *fleet) pick(skip string) *replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	var best *replica
	ids := make([]string, 0, len(f.live))
	for id := range f.live {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	f.rr++
	for i := range ids {
		r := f.live[ids[(i+f.rr)%len(ids)]]
		if !r.ready || r.id == skip {
			continue
		}
		if best == nil || r.inflight.Load() < best.inflight.Load() {
			best = r
		}
	}
	return best
}

// outcome is one request's result.
type outcome struct {
	ok      bool
	latency time.Duration
	tokens  int
}

// request sends one chat completion: it waits up to the queue timeout for
// a ready replica and retries once on another replica after a failure.
func (f *fleet) request(ctx context.Context) outcome {
	start := time.Now()
	deadline := start.Add(f.o.queue)
	skip := ""
	for try := 0; try < 2; {
		r := f.pick(skip)
		if r == nil {
			if time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		try++
		r.inflight.Add(1)
		tokens, err := f.chat(ctx, r.id)
		r.inflight.Add(-1)
		if err == nil {
			return outcome{ok: true, latency: time.Since(start), tokens: tokens}
		}
		skip = r.id
	}
	return outcome{latency: time.Since(start)}
}

// chat is one POST /v1/chat/completions through the instance proxy.
func (f *fleet) chat(ctx context.Context, id string) (int, error) {
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	body := map[string]any{"model": "m", "max_tokens": 64, "messages": []map[string]string{{"role": "user",
		"content": "summarize the state of the interruptible GPU market in one short sentence please"}}}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := f.a.do(rctx, http.MethodPost, "/api/v1/proxy/"+id+"/v1/chat/completions", body, &out); err != nil {
		return 0, err
	}
	return out.Usage.CompletionTokens, nil
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
	fs.StringVar(&o.market, "market", "on-demand", "the replicas' spec market: on-demand, interruptible or any")
	fs.StringVar(&o.out, "out", "", "write the result as JSON to this file")
	fs.StringVar(&o.gpu, "gpu", "RTX 4090", "the replicas' GPU")
	fs.Float64Var(&o.maxPrice, "max-price", 0.6, "the replicas' max_price_per_hour, USD")
	fs.IntVar(&o.replicas, "replicas", 4, "replicas kept")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long the load runs")
	fs.Float64Var(&o.rate, "rate", 40, "requests per second")
	fs.DurationVar(&o.queue, "queue-timeout", 10*time.Second, "how long a request waits for a ready replica")
	fs.DurationVar(&o.poll, "poll", 250*time.Millisecond, "how often replicas' status is read")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.url == "" || o.key == "" || o.out == "" || o.rate <= 0 || o.replicas < 1 {
		return errUsage
	}
	a := &api{base: o.url, key: o.key, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	f := &fleet{a: a, o: o, live: map[string]*replica{}}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	var pmu sync.Mutex
	peaks := map[int]*window{}
	sctx, sstop := context.WithCancel(ctx)
	sdone := make(chan struct{})
	go func() { sampleSpending(sctx, a, &pmu, peaks); close(sdone) }()
	wctx, wstop := context.WithCancel(ctx)
	wdone := make(chan struct{})
	go func() { f.watch(wctx); close(wdone) }()

	// Warm up: the load starts when every replica is ready (or after a
	// minute), so each placement is measured over the same steady span.
	warm := time.Now().Add(time.Minute)
	for time.Now().Before(warm) {
		n := 0
		f.mu.Lock()
		for _, r := range f.live {
			if r.ready {
				n++
			}
		}
		f.mu.Unlock()
		if n >= o.replicas {
			break
		}
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
			out := f.request(ctx)
			lmu.Lock()
			outs = append(outs, out)
			lmu.Unlock()
		}()
	}
	wg.Wait()
	loadEnd := time.Now()
	wstop()
	<-wdone

	// Tear down: destroy every replica, then let the meters settle before
	// reading the ledger.
	for _, id := range f.all {
		_, _ = a.do(context.Background(), http.MethodDelete, "/api/v1/gpu/instances/"+id, nil, nil)
	}
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

	res := Result{Market: o.market, Replicas: o.replicas, Rate: o.rate, Seconds: loadEnd.Sub(start).Seconds(),
		Cost: tx.Totals.Charges + tx.Totals.Refunds + tx.Totals.Adjustments, ReplicasUsed: f.used,
		Preemptions: f.pre, RentErrors: f.errs}
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
