package attack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/jackc/pgx/v5"
)

// Services (issue 22): a service on the account atk-svc, min 1 and max 4
// replicas, one in flight per replica its target, rented by a one-GPU
// spec under a cap, through a key whose own 60-minute window fits two
// replicas and not a third. Streamed chat completions through every
// gpuproxy replica's OpenAI endpoint keep more requests in flight than
// four replicas would take, from before the waves until they end, through
// the SIGKILLs and the database restart. The load must scale the service
// to two, every third rent must be refused (service.scale_blocked naming
// the window), and no window may pass its limit, whichever gpuproxy
// process holds the controller's lock at the time
// (servicecheck_test.go).
//
// Each chat request costs proxy.request_cost like every proxied request,
// charged to the account's windows: an account window that fitted two
// replicas would be spent by some forty requests. So the window that fits
// two replicas is the service key's own (issue 22: "a key with its own
// windows admits the service's rents against them"); the requests go
// through another key of the account, and the account's window has room
// for both.

// svcAccount owns the service.
const svcAccount = "atk-svc"

// The service and its settings.
const (
	svcName   = "atk-svc"
	svcModel  = "atk-model"
	svcCap    = 1.0 // USD per hour: the spec's max_price_per_hour
	svcMax    = 4   // replicas.max
	svcTarget = 1   // scale.target_inflight_per_replica
	// svcInterval and svcBlockedRetry are the replicas'
	// services.interval and services.blocked_retry.
	svcInterval     = 200 * time.Millisecond
	svcBlockedRetry = time.Second
	// svcClients is how many streamed chat requests are kept in flight:
	// more than svcMax replicas × svcTarget, so the service always wants
	// more replicas than it may have; not many more, as every request
	// takes CPU from the other loads (some 20 requests a second).
	svcClients = 5
	// svcAccountLimit is the account's 60-minute window (USD): room for
	// the replicas and every chat request of a run (some 20 a second at
	// $0.01: about $2 in a full run), many times over.
	svcAccountLimit = 25.0
	// svcRampWait bounds the wait, before the waves, for the service to
	// reach two replicas and have its third rent refused.
	svcRampWait = 25 * time.Second
	// svcWatchEvery is how often the watcher reads the service's rows and
	// the simulator's instances.
	svcWatchEvery = 250 * time.Millisecond
	// chatFailPause is how long a chat client waits after a failed
	// request, so a replica down is not hammered.
	chatFailPause = 200 * time.Millisecond
)

// svcGPUs are the spec's GPUs: the simulator's verified one-GPU offers of
// these under svcCap (two RTX 4090, an RTX A6000, an RTX 5090: $0.35 to
// $0.62 an hour) are close enough in price that any two of them cost less
// than any three, so one window fits whichever two the service rents and
// refuses any third — the churn and, once the waves start, the other
// loads take offers, and the service rents what is left. (With the
// simulator's seed, the churn takes none of these in the first few
// searches, so the service scales before the waves without waiting for
// the market; A100 PCIE and L40S, in the same band, go at the first.)
var svcGPUs = []string{"RTX 4090", "RTX A6000", "RTX 5090"}

// svcUpDelay is the service's scale.up_delay; its down_delay,
// svcDownDelay, is longer than the run: it never scales down.
const (
	svcUpDelay   = time.Second
	svcDownDelay = 10 * time.Minute
)

// chatContent is the user message of every chat request: the simulated
// model answers with one streamed chunk per word of it (40 words, some
// 230 ms), so a request stays in flight long enough to count.
var chatContent = strings.TrimSpace(strings.Repeat("w ", 40))

// svcEnv is the replicas' environment for the services phase.
func svcEnv() []string {
	return []string{"GPUPROXY_SERVICES_INTERVAL=" + svcInterval.String(),
		"GPUPROXY_SERVICES_BLOCKED_RETRY=" + svcBlockedRetry.String()}
}

// chatReq is one chat request as its client saw it.
type chatReq struct {
	replica    int // the gpuproxy replica it was sent to
	sent, done time.Time
	status     int
	ok         bool   // 200 and the stream ended with [DONE]
	why        string // the outcome's label: "200", "200 truncated", "503 unavailable", "transport"
}

// serviceLoad is the services phase of the run.
type serviceLoad struct {
	id               string
	svcKey, chatKey  string // the service's key (its own window) and the requests' key
	svcKeyID         string
	limit            int64   // the service key's 60-minute window
	prices           []int64 // the spec's offers' prices, cheapest first
	pairMax, tripMin int64   // the dearest two of them, the cheapest three
	created          time.Time
	ramp             time.Duration // from creation to two replicas and a refusal by the window
	rampDone         bool
	watch            *svcWatch

	mu   sync.Mutex
	reqs []chatReq
	stop chan struct{}
	wg   sync.WaitGroup
}

// probeServices asks GET /api/v1/services: a build with services answers
// 200; one without, 404 (the phase is left out).
func probeServices(ctx context.Context, a *api, key string) (bool, reply, error) {
	r := a.do(ctx, 0, http.MethodGet, "/api/v1/services", key, nil, nil)
	switch {
	case r.err == nil && r.status == http.StatusOK:
		return true, r, nil
	case r.err == nil && r.status == http.StatusNotFound:
		return false, r, nil
	}
	return false, r, fmt.Errorf("probing services: want 200 (or 404 from a build without them), got %s", r)
}

// svcPrices are the prices (micro-dollars per hour) of the spec's one-GPU
// vast.ai offers, cheapest first, from the offers listed or, while fewer
// than three of them are (the churn took some for a while), from a fresh
// search. Every search lets the churn take more, so there are few.
func svcPrices(ctx context.Context, a *api, key string, listed []offer) []int64 {
	var out []int64
	for try := 0; ; try++ {
		out = out[:0]
		for _, o := range listed {
			if o.Provider == "vast.ai" && o.NumGPUs == 1 && o.PricePerHour <= svcCap &&
				slices.ContainsFunc(svcGPUs, func(g string) bool { return strings.Contains(o.GPUName, g) }) {
				out = append(out, micros(o.PricePerHour))
			}
		}
		if len(out) >= 3 || try == 2 || ctx.Err() != nil {
			break
		}
		// pace: search again once the offer cache (1 s) has turned over;
		// each search lets the churn take offers, so there are two at most.
		time.Sleep(1100 * time.Millisecond)
		if fresh, err := a.offersAt(ctx, try+1, key, svcCap); err == nil {
			listed = fresh
		}
	}
	slices.Sort(out)
	return out
}

// svcWindow is the key's 60-minute window for those prices: halfway
// between the dearest two (which it must fit) and the cheapest three
// (which it must not), so that it fits any two the service rents, with
// room for their metered spend, and refuses any third. It fails when no
// such window exists.
func svcWindow(prices []int64) (limit, pairMax, tripMin int64, err error) {
	if len(prices) < 3 {
		return 0, 0, 0, fmt.Errorf("the spec (1x %v under $%g/h on vast.ai) matches %d offers, want at least 3", svcGPUs, svcCap, len(prices))
	}
	n := len(prices)
	pairMax, tripMin = prices[n-1]+prices[n-2], prices[0]+prices[1]+prices[2]
	if pairMax >= tripMin {
		return 0, 0, 0, fmt.Errorf("the spec's offers %v: the dearest two (%s) cost no less than the cheapest three (%s): no window fits two and refuses three",
			prices, usd(pairMax), usd(tripMin))
	}
	return (pairMax + tripMin) / 2, pairMax, tripMin, nil
}

// setUpServiceAccount creates the account, its window and credit, the
// service's key (engineer, with its own 60-minute window of limit) and
// the requests' key (assistant, no windows) through the CLI, and reads
// the service key's id back.
func setUpServiceAccount(ctx context.Context, run func(args ...string) string, dbURL string, limit int64) (svcKey, svcKeyID, chatKey string, err error) {
	run("accounts", "create", svcAccount)
	run("limits", "set", "--account", svcAccount, "--window", keyWindow{60, svcAccountLimit}.String())
	run("credits", "add", "--account", svcAccount, "--amount", "1000")
	w := keyWindow{60, float64(limit) / 1e6}
	svcKey = lastLine(run("keys", "create", "--account", svcAccount, "--preset", "engineer", "--name", "attack service",
		"--window", w.String()))
	chatKey = lastLine(run("keys", "create", "--account", svcAccount, "--preset", "assistant", "--name", "attack chat"))
	st, err := readState(ctx, dbURL)
	if err != nil {
		return "", "", "", err
	}
	k := st.keyNamed(svcAccount, "attack service")
	switch {
	case k == nil:
		return "", "", "", fmt.Errorf("key %q of %s not in api_keys after keys create", "attack service", svcAccount)
	case len(k.limits) != 1 || k.limits[0].limit != limit:
		return "", "", "", fmt.Errorf("key %s has windows %v, created with 60m=%s", k.id, k.limits, usd(limit))
	}
	return svcKey, k.id, chatKey, nil
}

// svcBody is the service's definition.
func svcBody() map[string]any {
	return map[string]any{
		"name": svcName, "model": svcModel, "image": "vllm/vllm-openai:latest", "port": 8000,
		"spec": map[string]any{"gpu": svcGPUs, "num_gpus": 1, "max_price_per_hour": svcCap, "providers": "vast.ai",
			"max_attempts": 8},
		"replicas": map[string]any{"min": 1, "max": svcMax},
		"scale": map[string]any{"target_inflight_per_replica": svcTarget, "up_delay": svcUpDelay.String(),
			"down_delay": svcDownDelay.String()},
	}
}

// startService sets up the account and keys (the key's window from the
// spec's offers), creates the service, and starts its watcher (until
// wctx ends, in wg) and its chat load over every replica.
func startService(ctx, wctx context.Context, a *api, run func(args ...string) string, dbURL string, senv simEnv,
	listed []offer, probeKey string, wg *sync.WaitGroup) (*serviceLoad, error) {
	sl := &serviceLoad{stop: make(chan struct{}), watch: &svcWatch{}}
	sl.prices = svcPrices(ctx, a, probeKey, listed)
	var err error
	if sl.limit, sl.pairMax, sl.tripMin, err = svcWindow(sl.prices); err != nil {
		return nil, err
	}
	if sl.svcKey, sl.svcKeyID, sl.chatKey, err = setUpServiceAccount(ctx, run, dbURL, sl.limit); err != nil {
		return nil, err
	}
	var r reply
	for try := range 6 {
		r = a.do(ctx, try, http.MethodPost, "/api/v1/services", sl.svcKey, svcBody(), nil)
		if !r.retryable() {
			break
		}
		// pace: a client's retry backoff.
		time.Sleep(300 * time.Millisecond)
	}
	var v struct {
		ID string `json:"id"`
	}
	if r.err != nil || r.status != http.StatusCreated || json.Unmarshal(r.body, &v) != nil || v.ID == "" {
		return nil, fmt.Errorf("creating the service: want 201 with its id, got %s", r)
	}
	sl.id, sl.created = v.ID, time.Now()
	wg.Go(func() { sl.watch.run(wctx, dbURL, senv, sl.id, svcWatchEvery) })
	for c := range svcClients {
		sl.wg.Go(func() { sl.client(ctx, a, c) })
	}
	return sl, nil
}

// client sends streamed chat requests, one at a time, spread over the
// replicas, until the load stops.
func (sl *serviceLoad) client(ctx context.Context, a *api, c int) {
	for i := 0; ctx.Err() == nil; i++ {
		select {
		case <-sl.stop:
			return
		default:
		}
		r := a.chat(ctx, c+i, sl.chatKey)
		sl.mu.Lock()
		sl.reqs = append(sl.reqs, r)
		sl.mu.Unlock()
		if !r.ok {
			// pace: a client backs off after a failed chat.
			time.Sleep(chatFailPause)
		}
	}
}

// waitRamp waits until the service has had two live replicas and its
// third rent was refused by the window, or svcRampWait passes.
func (sl *serviceLoad) waitRamp(ctx context.Context) {
	sl.rampDone = testpoll.Wait(time.Until(sl.created.Add(svcRampWait)), func() bool {
		s, ok := sl.watch.last()
		return ok && s.maxLive >= 2 && s.windowBlocked > 0 || ctx.Err() != nil
	}) && ctx.Err() == nil
	sl.ramp = time.Since(sl.created)
}

// stopLoad ends the chat load and waits for the requests in flight.
func (sl *serviceLoad) stopLoad() {
	close(sl.stop)
	sl.wg.Wait()
}

// requests returns a copy of the chat requests made.
func (sl *serviceLoad) requests() []chatReq {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return append([]chatReq(nil), sl.reqs...)
}

// chat sends one streamed chat completion to the service's model through
// a replica's OpenAI endpoint, with the key as a Bearer token as the
// OpenAI SDKs send it, and reads the stream to its end.
func (a *api) chat(ctx context.Context, replica int, key string) chatReq {
	r := a.replicas[replica%len(a.replicas)]
	c := chatReq{replica: r.idx, sent: time.Now()}
	body, _ := json.Marshal(map[string]any{"model": svcModel, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": chatContent}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		c.done, c.why = time.Now(), "transport"
		return c
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		c.done, c.why = time.Now(), "transport"
		return c
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	c.done, c.status = time.Now(), resp.StatusCode
	c.ok = err == nil && resp.StatusCode == http.StatusOK && bytes.Contains(b, []byte("data: [DONE]"))
	switch {
	case c.ok:
		c.why = "200"
	case resp.StatusCode == http.StatusOK:
		c.why = "200 truncated"
	default:
		c.why = outcome(reply{status: resp.StatusCode, body: b})
	}
	return c
}

// svcSample is one read of the service: its rows and, just before them,
// the simulator's live instances of the service.
type svcSample struct {
	at             time.Time
	live, ready    int // replica rows not gone; ready
	desired        int
	windowBlocked  int // service.scale_blocked events naming spending_limit_exceeded
	simLive        int // the service's instances live at vast.ai
	simIDs, rowIDs []string
	maxLive        int // the most live replicas seen up to this sample
}

// svcWatch reads, every interval while the attack runs, the simulator's
// live vast.ai instances and then (so that every instance listed has its
// row, written before the provider call) the service's replicas, desired
// size, refusals by the window and instances, and keeps every sample: a
// final read cannot show a third replica that came and went.
type svcWatch struct {
	mu      sync.Mutex
	samples []svcSample
	errors  int
}

const svcWatchSQL = `SELECT
  (SELECT count(*) FROM service_replicas WHERE service_id = $1 AND state <> 'gone'),
  (SELECT count(*) FROM service_replicas WHERE service_id = $1 AND state = 'ready'),
  (SELECT desired FROM services WHERE id = $1),
  (SELECT count(*) FROM service_events WHERE service_id = $1 AND kind = 'service.scale_blocked'
      AND strpos(message, 'spending_limit_exceeded') > 0),
  COALESCE((SELECT array_agg(id) FROM instances WHERE left(idempotency_key, length($2)) = $2), '{}')`

// run polls until ctx ends, reconnecting after errors (the database
// restarts mid-attack).
func (w *svcWatch) run(ctx context.Context, url string, senv simEnv, id string, every time.Duration) {
	watchDB(ctx, url, every, w.failed, func(ctx context.Context, c *pgx.Conn) error { return w.poll(ctx, c, senv, id) })
}

func (w *svcWatch) poll(ctx context.Context, conn *pgx.Conn, senv simEnv, id string) error {
	pis, err := listVastAI(ctx, senv)
	if err != nil {
		return err
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s := svcSample{at: time.Now()}
	var live, ready, blocked int64
	var desired *int32
	if err := conn.QueryRow(qctx, svcWatchSQL, id, svcKeyPrefix(id)).Scan(&live, &ready, &desired, &blocked, &s.rowIDs); err != nil {
		return err
	}
	s.live, s.ready, s.windowBlocked = int(live), int(ready), int(blocked)
	if desired != nil {
		s.desired = int(*desired)
	}
	mine := map[string]bool{}
	for _, in := range s.rowIDs {
		mine[in] = true
	}
	for _, pi := range pis {
		if mine[pi.tag] && pi.live() {
			s.simLive++
			s.simIDs = append(s.simIDs, pi.tag)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s.maxLive = s.live
	if n := len(w.samples); n > 0 {
		s.maxLive = max(s.maxLive, w.samples[n-1].maxLive)
	}
	w.samples = append(w.samples, s)
	return nil
}

func (w *svcWatch) failed() {
	w.mu.Lock()
	w.errors++
	w.mu.Unlock()
}

// last is the latest sample.
func (w *svcWatch) last() (svcSample, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.samples) == 0 {
		return svcSample{}, false
	}
	return w.samples[len(w.samples)-1], true
}

// all returns every sample and the failed reads.
func (w *svcWatch) all() ([]svcSample, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]svcSample(nil), w.samples...), w.errors
}

// svcKeyPrefix is the start of the idempotency key of every rent of the
// service: "service:<id>:<n>:<k>", its attempts' rows "…#<run>.<attempt>".
func svcKeyPrefix(id string) string { return "service:" + id + ":" }

// maxLive is the most live replicas seen so far.
func (w *svcWatch) maxLive() int {
	s, _ := w.last()
	return s.maxLive
}

// windowBlocked is how many refusals by the window the last sample saw.
func (w *svcWatch) windowBlocked() int {
	s, _ := w.last()
	return s.windowBlocked
}
