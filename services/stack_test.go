package services_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/app/apptest"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/proxy"
	"github.com/aiserve/gpuproxy/services"
)

var quiet = slog.New(slog.NewJSONHandler(io.Discard, nil))

// stack is gpuproxy on n replicas (apps serving HTTP, each running its
// background work) over one database and the vast.ai simulator, whose
// running instances serve the tiny OpenAI-compatible server.
type stack struct {
	t     *testing.T
	sim   *vastaisim.Server
	apps  []*app.App
	bases []string
	key   string // an engineer key of account acme
	acct  gpuproxy.Account
}

type stackOpts struct {
	replicas int
	limits   []guardrails.Window
	svc      services.Options
	start    time.Duration // the simulator's start delay (default 100 ms)
	chunk    time.Duration // the inference servers' pause between streamed chunks
	cost     gpuproxy.Micros
	price    gpuproxy.TokenPrice // proxy-wide per-token price
	// alertsLoopback lets alert webhooks reach loopback (a test's hook).
	alertsLoopback bool
	// market and catalog are the simulator's (placement_test.go).
	market  *vastaisim.Market
	catalog []vastaisim.Offer
}

func newStack(t *testing.T, k dbtest.Kind, o stackOpts) *stack {
	t.Helper()
	if o.replicas == 0 {
		o.replicas = 1
	}
	if o.start == 0 {
		o.start = 100 * time.Millisecond
	}
	so := o.svc
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&so.Interval, 50*time.Millisecond)
	def(&so.ProbeInterval, 200*time.Millisecond)
	def(&so.LoadReport, 100*time.Millisecond)
	def(&so.RouteTTL, 100*time.Millisecond)
	def(&so.DrainTimeout, 3*time.Second)
	def(&so.BlockedRetry, 500*time.Millisecond)
	def(&so.UnreadyTimeout, 2*time.Second)
	st := apptest.New(t, apptest.Options{Kind: k, Replicas: o.replicas, Serve: apptest.Listener, Run: apptest.RunAll,
		Vast: vastaisim.Options{StartDelay: o.start, ChunkDelay: o.chunk, Market: o.market, Catalog: o.catalog},
		Config: app.Config{Logger: quiet, NoOAuth: true,
			VastAI: vastai.Options{Timeout: 30 * time.Second},
			Guard:  guardrails.Options{Defaults: o.limits},
			Fleet: fleet.Options{PollInterval: 50 * time.Millisecond, OfferCacheTTL: -1, LifetimeInterval: 200 * time.Millisecond,
				ReconcileInterval: time.Second},
			Proxy:    proxy.Options{AllowNetworks: proxy.LoopbackNetworks(), Cost: o.cost, TokenPrice: o.price},
			Gate:     guardrails.ProxyGateOptions{LeaseSpan: 100 * time.Millisecond, LeaseSettleWait: 200 * time.Millisecond},
			Services: so,
			Alerts:   alertsOpts(o.alertsLoopback),
		}})
	s := &stack{t: t, sim: st.Vast, apps: st.Apps, bases: st.URLs}
	s.key, s.acct = st.Key("acme", "engineer")
	return s
}

func alertsOpts(loopback bool) alerts.Options {
	if !loopback {
		return alerts.Options{}
	}
	return alerts.Options{AllowNetworks: proxy.LoopbackNetworks(), SendInterval: 100 * time.Millisecond}
}

// create defines a service from JSON, on replica 0.
func (s *stack) create(def string) services.View {
	s.t.Helper()
	d, err := services.DecodeDefinition([]byte(def), nil)
	if err != nil {
		s.t.Fatal(err)
	}
	pr := s.principal()
	// The stack's operator: an admin sets the services' token prices.
	pr.Scopes = append(pr.Scopes, gpuproxy.ScopeAdmin)
	v, err := s.apps[0].Services.Create(context.Background(), pr, d)
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

func (s *stack) principal() gpuproxy.Principal {
	s.t.Helper()
	pr, err := s.apps[0].Auth.Authenticate(context.Background(), s.key)
	if err != nil {
		s.t.Fatal(err)
	}
	return pr
}

func (s *stack) get(name string) services.View {
	s.t.Helper()
	v, err := s.apps[0].Services.Get(context.Background(), s.acct.ID, name)
	if err != nil {
		s.t.Fatal(err)
	}
	return v
}

// waitReady waits until the service has n ready replicas (and no other
// live one), and returns it.
func (s *stack) waitReady(name string, n int, within time.Duration) services.View {
	s.t.Helper()
	var v services.View
	if !testpoll.Wait(within, func() bool {
		v = s.get(name)
		return v.Ready == n && len(v.Instances) == n
	}) {
		s.t.Fatalf("service %s has not %d ready replicas after %s: %s", name, n, within, mustJSON(v))
	}
	return v
}

// chat sends a chat completion through gpuproxy replica i's OpenAI
// endpoint and returns the status and body.
func (s *stack) chat(i int, model string, stream bool) (int, []byte) {
	body := `{"model":` + strconv.Quote(model) + `,"messages":[{"role":"user","content":"hello there"}]`
	if stream {
		body += `,"stream":true`
	}
	return s.post(i, "/v1/chat/completions", body+"}")
}

func (s *stack) post(i int, path, body string) (int, []byte) {
	req, _ := http.NewRequest(http.MethodPost, s.bases[i]+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// simID is the vast.ai id of one of our instances.
func (s *stack) simID(instanceID string) int64 {
	s.t.Helper()
	for _, in := range s.sim.Instances() {
		if in.Label == instanceID {
			return in.ID
		}
	}
	s.t.Fatalf("instance %s is not in the simulator", instanceID)
	return 0
}

// events returns the service's event kinds, oldest first.
func (s *stack) events(name string) []string {
	s.t.Helper()
	evs, err := s.apps[0].Services.Events(context.Background(), s.acct.ID, name, 500)
	if err != nil {
		s.t.Fatal(err)
	}
	out := make([]string, 0, len(evs))
	for i := len(evs) - 1; i >= 0; i-- {
		out = append(out, evs[i].Kind)
	}
	return out
}

func count(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

func mustJSON(v any) string {
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(v)
	return b.String()
}
