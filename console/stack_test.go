package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/alerts"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/app/apptest"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/console"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/server"
	"github.com/aiserve/gpuproxy/services"
)

const usd = gpuproxy.MicrosPerUSD

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// stack is the whole service in-process — a real SQLite store, both
// provider simulators, the REST API and the console on one server — with
// two accounts, keys of every preset for "demo", and a seeded ledger.
type stack struct {
	t      *testing.T
	hc     *http.Client // the stack's (trusting its TLS certificate)
	url    string
	store  *db.Store
	auth   *auth.Service
	guard  *guardrails.Service
	ledger *billing.Ledger
	fleet  *fleet.Service
	alerts *alerts.Service
	svcs   *services.Manager
	vast   *vastaisim.Server
	demo   gpuproxy.Account
	other  gpuproxy.Account
	keys   map[string]string // preset → a key of demo
	// running is demo's running vast.ai instance; ended its terminated
	// io.net deployment.
	running, ended gpuproxy.Instance
}

type stackOpts struct {
	tls       bool
	rateLimit int
}

func newStack(t *testing.T, o stackOpts) *stack {
	t.Helper()
	ctx := context.Background()
	if o.rateLimit == 0 {
		o.rateLimit = 100000
	}
	serve := apptest.HTTPTest
	if o.tls {
		serve = apptest.TLS
	}
	// The service graph as the binary wires it (app); only the
	// fleet's polling runs in the background, not metering or alerts, so
	// the seeded ledger stays as seeded.
	st := apptest.New(t, apptest.Options{Serve: serve, Vast: vastaisim.Options{StartDelay: -1},
		IONet: &ionetsim.Options{StartDelay: -1},
		Run:   func(ctx context.Context, a *app.App) { a.Fleet.Run(ctx) },
		Config: app.Config{Logger: quiet,
			Auth:      auth.Options{CacheTTL: -1},
			RateLimit: o.rateLimit,
			Fleet:     fleet.Options{PollInterval: 20 * time.Millisecond, OfferCacheTTL: -1},
			Console:   console.Options{Secret: []byte("console test secret, 32 bytes ok"), PageSize: 25},
			// Tests sign the same keys in many times from one address; the
			// sign-in throttle is walked in app's route test.
			Server: server.Options{SignInPerMinute: 100000},
		}})
	a := st.App()
	s := &stack{t: t, store: a.Store, keys: map[string]string{}, vast: st.Vast, hc: st.Client(), url: st.URL()}
	s.auth, s.guard, s.ledger, s.fleet, s.alerts, s.svcs = a.Auth, a.Guard, a.Ledger, a.Fleet, a.Alerts, a.Services
	var err error
	if s.demo, err = s.auth.CreateAccount(ctx, "demo"); err != nil {
		t.Fatal(err)
	}
	if s.other, err = s.auth.CreateAccount(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"admin", "engineer", "finance", "assistant"} {
		if s.keys[p], _, err = s.auth.CreateKey(ctx, "demo", p+" key", gpuproxy.Presets[p]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.guard.SetLimits(ctx, s.other.ID, []guardrails.Window{{Minutes: 60, Limit: 20 * usd},
		{Minutes: 10080, Limit: 500 * usd}}, ""); err != nil {
		t.Fatal(err)
	}
	s.seed(ctx)
	return s
}

// seed gives demo a month of history: a credit, daily metered charges,
// an hour of heavy use, a refund and an adjustment; a running vast.ai
// instance with charges of its own; an io.net deployment charged and
// refunded when destroyed early. "other" gets entries demo must never see.
func (s *stack) seed(ctx context.Context) {
	t := s.t
	now := time.Now().UTC()
	add := func(acct int64, typ billing.Type, amount gpuproxy.Micros, at time.Time, provider, inst, desc string, basis billing.Basis) {
		t.Helper()
		if _, err := s.ledger.Append(ctx, billing.Entry{AccountID: acct, Type: typ, Amount: amount, At: at,
			Provider: provider, InstanceID: inst, Description: desc, Basis: basis}); err != nil {
			t.Fatal(err)
		}
	}
	// Instances first: their admissions must fit the windows.
	offer := func(p, gpu string, n int) providers.Offer {
		res, err := s.fleet.Offers(ctx, fleet.OfferQuery{Provider: p, GPUName: gpu, MinGPUs: n, MaxPrice: 5 * usd})
		if err != nil || len(res.Offers) == 0 {
			t.Fatalf("no %s offers: %v %+v", p, err, res.Errors)
		}
		return res.Offers[0]
	}
	// Rented by spec: the cheapest 2× H100 is taken between search and
	// create, so the instance page has a failover to show.
	s.vast.Inject(vastaisim.Fault{Kind: vastaisim.FaultStatus, Method: http.MethodPut, PathPrefix: "/api/v0/asks",
		Count: 1, Status: http.StatusGone, Body: `{"success":false,"error":"no_such_ask","msg":"no longer available"}`,
		ContentType: "application/json"})
	inst, err := s.fleet.Create(ctx, s.demo.ID, fleet.CreateRequest{Spec: &fleet.Spec{GPU: []string{"H100"}, NumGPUs: 2,
		MaxPricePerHour: 5 * usd, Providers: []string{providers.VastAI}}, Image: "vllm/vllm-openai:latest", Label: "llama-70b"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if s.running, err = s.fleet.WaitRunning(wctx, s.demo.ID, inst.ID, nil); err != nil || s.running.Status != gpuproxy.Running {
		t.Fatalf("instance not running: %v %v", s.running.Status, err)
	}
	io, err := s.fleet.Create(ctx, s.demo.ID, fleet.CreateRequest{Provider: providers.IONet, OfferID: offer(providers.IONet, "", 0).ID,
		Image: "vllm/vllm-openai:latest", Label: "batch-embed", Hours: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.fleet.WaitRunning(wctx, s.demo.ID, io.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err = s.fleet.Destroy(ctx, s.demo.ID, io.ID); err != nil {
		t.Fatal(err)
	}
	// The provider confirms the destroy later; the fleet's poller (running
	// as in the service) then closes the row and refunds unused time.
	if !testpoll.Wait(10*time.Second, func() bool {
		v, err := s.fleet.Get(ctx, s.demo.ID, io.ID)
		if err != nil {
			t.Fatal(err)
		}
		s.ended = v.Instance
		return s.ended.Status == gpuproxy.Terminated
	}) {
		t.Fatalf("io.net deployment not terminated: %s", s.ended.Status)
	}

	add(s.demo.ID, billing.Credit, 500*usd, now.AddDate(0, 0, -29), "", "", "prepaid top-up, invoice 2026-117", billing.Manual)
	for d := 28; d >= 1; d-- {
		amt := gpuproxy.Micros(8+d%5*3)*usd + gpuproxy.Micros(d*12_345)
		add(s.demo.ID, billing.Charge, amt, now.AddDate(0, 0, -d), "vast.ai", "gpi_hist"+string(rune('a'+d%4)),
			"metered RTX 4090 time", billing.Metered)
	}
	for h := 23; h >= 1; h-- {
		add(s.demo.ID, billing.Charge, gpuproxy.Micros(1+h%4)*usd+250_000, now.Add(-time.Duration(h)*time.Hour-5*time.Minute),
			"vast.ai", s.running.ID, "metered "+s.running.GPUName+" time", billing.Metered)
	}
	// The last hour: heavy use, near the 60-minute limit with what the
	// running instance commits.
	for m := 50; m >= 10; m -= 10 {
		add(s.demo.ID, billing.Charge, 7*usd+400_000, now.Add(-time.Duration(m)*time.Minute), "vast.ai", s.running.ID,
			"metered "+s.running.GPUName+" time", billing.Metered)
	}
	add(s.demo.ID, billing.Refund, 2*usd+500_000, now.AddDate(0, 0, -3), "vast.ai", "gpi_hista", "provider outage credit", billing.Provider)
	add(s.demo.ID, billing.Adjustment, 1*usd+125_000, now.AddDate(0, 0, -2), "vast.ai", "gpi_histb", "truth-up against vast.ai charges", billing.Provider)
	add(s.other.ID, billing.Credit, 100*usd, now.AddDate(0, 0, -5), "", "", "other's credit", billing.Manual)
	add(s.other.ID, billing.Charge, 9*usd, now.Add(-2*time.Hour), "io.net", "gpi_other", "other's charge", billing.Prepaid)
	// A figure under a cent, which the console shows with its digits.
	add(s.other.ID, billing.Charge, 4_200, now.Add(-90*time.Minute), "io.net", "gpi_other", "other's metered minute", billing.Metered)
}

// api calls the REST API with key and decodes the JSON answer, numbers
// as json.Number.
func (s *stack) api(key, path string) map[string]any {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.url+path, nil)
	req.Header.Set("X-API-Key", key)
	res, err := s.client(nil).Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // amounts stay exact
	if res.StatusCode != 200 || dec.Decode(&m) != nil {
		s.t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	return m
}

// client is an HTTP client for the stack (trusting its TLS certificate)
// that does not follow redirects; jar may be nil.
func (s *stack) client(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, Transport: s.hc.Transport, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// signIn posts key to the sign-in form and returns a client holding the
// session cookie.
func (s *stack) signIn(key string) *http.Client {
	s.t.Helper()
	jar, _ := cookiejar.New(nil)
	c := s.client(jar)
	res, err := c.PostForm(s.url+"/console/login", url.Values{"api_key": {key}})
	if err != nil {
		s.t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/console/" {
		s.t.Fatalf("sign-in: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	return c
}

// get fetches a console page with c and returns status and body.
func (s *stack) get(c *http.Client, path string) (int, string) {
	s.t.Helper()
	res, err := c.Get(s.url + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
