package attack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
)

// api is an HTTP client of the replicas, speaking gpuproxy's REST API.
type api struct {
	hc       *http.Client
	replicas []*replica
}

func newAPI(replicas []*replica, conns int) *api {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
	}
	return &api{hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}, replicas: replicas}
}

// reply is one HTTP exchange's outcome; status 0 is a transport error.
type reply struct {
	status int
	body   []byte
	err    error
	proc   string // the replica process that answered: "replica2#1" (second start)
}

func (r reply) String() string {
	if r.err != nil {
		return "transport error: " + r.err.Error()
	}
	b := string(r.body)
	if len(b) > 300 {
		b = b[:300] + "…"
	}
	return fmt.Sprintf("%d %s", r.status, strings.TrimSpace(b))
}

// errorCode is the error.code of gpuproxy's error shape, if any.
func (r reply) errorCode() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func (a *api) do(ctx context.Context, replica int, method, path, key string, body any, hdr map[string]string) reply {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{err: err}
		}
		rd = bytes.NewReader(b)
	}
	r := a.replicas[replica%len(a.replicas)]
	gen := r.generation()
	req, err := http.NewRequestWithContext(ctx, method, r.base+path, rd)
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("X-API-Key", key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	out := reply{status: resp.StatusCode, body: b, err: err}
	if r.generation() == gen { // else the process changed under the request: unknown
		out.proc = fmt.Sprintf("%s#%d", r.name(), gen)
	}
	return out
}

// retryable: the request may not have been processed (transport error, the
// replica or the database down), so an idempotent request is sent again.
func (r reply) retryable() bool {
	return r.err != nil || r.status == http.StatusServiceUnavailable || r.status == http.StatusInternalServerError ||
		r.status == http.StatusBadGateway || r.status == http.StatusGatewayTimeout
}

// offer is one row of GET /api/v1/gpu/offers.
type offer struct {
	Provider     string  `json:"provider"`
	OfferID      string  `json:"offer_id"`
	GPUName      string  `json:"gpu_name"`
	NumGPUs      int     `json:"num_gpus"`
	PricePerHour float64 `json:"price_per_hour"`
	Billing      string  `json:"billing"`
}

// offers lists both providers' offers at or under maxPrice per hour.
func (a *api) offers(ctx context.Context, key string, maxPrice float64) ([]offer, error) {
	return a.offersAt(ctx, 0, key, maxPrice)
}

// offersAt is offers, asked of the given replica.
func (a *api) offersAt(ctx context.Context, replica int, key string, maxPrice float64) ([]offer, error) {
	r := a.do(ctx, replica, http.MethodGet, "/api/v1/gpu/offers?limit=500&max_price="+strconv.FormatFloat(maxPrice, 'f', -1, 64), key, nil, nil)
	if r.err != nil || r.status != http.StatusOK {
		return nil, fmt.Errorf("listing offers: %s", r)
	}
	var out struct {
		Offers []offer `json:"offers"`
		Errors []struct {
			Provider, Message string
		} `json:"errors"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		return nil, err
	}
	if len(out.Errors) > 0 {
		return nil, fmt.Errorf("offer search reported provider errors: %+v", out.Errors)
	}
	return out.Offers, nil
}

// instance is the part of an instance reply the harness reads.
type instance struct {
	ID       string `json:"id"`
	Provider string `json:"provider"`
	Status   string `json:"status"`
	Endpoint string `json:"endpoint"`
}

// createResult records one create as the client saw it.
type createResult struct {
	key      string
	provider string
	offer    string
	hours    int
	cost     float64 // what admission is asked for: price × 1 h, or the prepaid total
	final    reply
	attempts int
	inst     instance
}

// create sends one create with an Idempotency-Key, retrying on another
// replica while the outcome is unknown, as a careful client would.
func (a *api) create(ctx context.Context, replica int, key string, o offer, hours int, idem string) createResult {
	return a.createWith(ctx, replica, key, o, hours, idem, nil)
}

// createWith is create with extra fields in the body (lifetime rules).
func (a *api) createWith(ctx context.Context, replica int, key string, o offer, hours int, idem string,
	extra map[string]any) createResult {
	body := map[string]any{"provider": o.Provider, "offer_id": o.OfferID, "image": "vllm/vllm-openai:latest",
		"env": map[string]string{"MODEL": "attack"}, "ports": []int{8000}}
	maps.Copy(body, extra)
	cost := o.PricePerHour
	if o.Billing == "prepaid" {
		body["hours"] = hours
		cost = o.PricePerHour * float64(hours)
	}
	res := createResult{key: idem, provider: o.Provider, offer: o.OfferID, hours: hours, cost: cost}
	for attempt := 0; attempt < 6; attempt++ {
		res.attempts++
		res.final = a.do(ctx, replica+attempt, http.MethodPost, "/api/v1/gpu/instances", key, body,
			map[string]string{"Idempotency-Key": idem})
		if !res.final.retryable() || ctx.Err() != nil {
			break
		}
		// pace: a client's retry backoff.
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
	}
	if res.final.status == http.StatusCreated || res.final.status == http.StatusAccepted {
		_ = json.Unmarshal(res.final.body, &res.inst)
	}
	return res
}

// destroy deletes an instance, retrying while the outcome is unknown.
func (a *api) destroy(ctx context.Context, replica int, key, id string) reply {
	var r reply
	for attempt := 0; attempt < 6; attempt++ {
		r = a.do(ctx, replica+attempt, http.MethodDelete, "/api/v1/gpu/instances/"+id, key, nil, nil)
		if !r.retryable() || ctx.Err() != nil {
			return r
		}
		// pace: a client's retry backoff.
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
	}
	return r
}

// get reads one instance.
func (a *api) get(ctx context.Context, replica int, key, id string) (instance, reply) {
	r := a.do(ctx, replica, http.MethodGet, "/api/v1/gpu/instances/"+id, key, nil, nil)
	var inst instance
	if r.err == nil && r.status == http.StatusOK {
		_ = json.Unmarshal(r.body, &inst)
	}
	return inst, r
}

// proxyCall sends one inference request through the proxy: alternately a
// model list and a short chat completion.
func (a *api) proxyCall(ctx context.Context, replica int, key, id string, n int) reply {
	if n%2 == 0 {
		return a.do(ctx, replica, http.MethodGet, "/api/v1/proxy/"+id+"/v1/models", key, nil, nil)
	}
	body := map[string]any{"model": "attack", "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": "hello " + strconv.Itoa(n)}}}
	return a.do(ctx, replica, http.MethodPost, "/api/v1/proxy/"+id+"/v1/chat/completions", key, body, nil)
}

// tally counts outcomes by label, safely across goroutines.
type tally struct {
	mu sync.Mutex
	m  map[string]int
}

func (t *tally) add(label string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]int{}
	}
	t.m[label]++
}

func (t *tally) get(label string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[label]
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.m))
	for k := range t.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, t.m[k])
	}
	return strings.Join(parts, " ")
}

// outcome labels a reply: "201", "402 spending_limit_exceeded", "transport".
func outcome(r reply) string {
	if r.err != nil {
		return "transport"
	}
	if c := r.errorCode(); c != "" {
		return strconv.Itoa(r.status) + " " + c
	}
	return strconv.Itoa(r.status)
}

// progress counts finished requests of the current wave, so chaos can
// strike mid-burst.
type progress struct {
	done atomic.Int64
}

// waitFor waits until n requests have finished, or ctx ends.
func (p *progress) waitFor(ctx context.Context, n int64) {
	// ctx bounds the wait; the timeout is only a backstop.
	testpoll.Wait(time.Hour, func() bool { return p.done.Load() >= n || ctx.Err() != nil })
}

// limitScope is the scope ("key" or "account"), the key_id and the window
// that a spending refusal's details name.
func (r reply) limitScope() (scope, keyID string, minutes int) {
	var e struct {
		Error struct {
			Details struct {
				Scope   string `json:"scope"`
				KeyID   string `json:"key_id"`
				Minutes int    `json:"window_minutes"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Details.Scope, e.Error.Details.KeyID, e.Error.Details.Minutes
}
