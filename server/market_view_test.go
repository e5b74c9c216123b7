package server_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/server"
)

// marketEnv is newFleetEnv over a moving vast.ai market, with the fleet
// and the simulator at hand (nothing polls in the background: the test
// polls).
type marketEnv struct {
	*env
	fleet *fleet.Service
	vast  *vastaisim.Server
	logs  *strings.Builder
}

func newMarketEnv(t *testing.T, k dbtest.Kind) *marketEnv {
	t.Helper()
	st := dbtest.Open(t, k)
	a := auth.New(st, auth.Options{CacheTTL: -1})
	logs := &strings.Builder{}
	log := newTestLogger(logs)
	g := guardrails.New(st, guardrails.Options{Logger: log})
	ledger := billing.NewLedger(st, nil)
	sim := vastaisim.New(vastaisim.Options{APIKey: "vk", Market: &vastaisim.Market{Tick: 20 * time.Millisecond}})
	u, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	va := vastai.New(vastai.Options{BaseURL: u, APIKey: "vk", Timeout: 5 * time.Second, RetryWait: time.Millisecond})
	fl := fleet.New(st, g, []providers.Provider{va}, fleet.Options{OfferCacheTTL: time.Minute, Logger: log,
		Leader: st.WithLeader, Ledger: ledger})
	srv := server.New(server.Services{Auth: a, Guard: g, Ledger: ledger, Fleet: fl, Store: st,
		RateLimiter: auth.NewSharedRateLimiter(0, auth.RateLimitOptions{})}, server.Options{Logger: log})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &marketEnv{env: &env{t: t, url: hs.URL, store: st, auth: a, ledger: ledger}, fleet: fl, vast: sim, logs: logs}
}

// TestInstanceViewsShowMarket: the REST instance views show the market,
// the bid of an interruptible instance and, once the poller records a
// preemption, the status preempted with vast.ai's status_msg; an
// on-demand instance shows on-demand and no bid. Every answer validates
// against openapi.json.
func TestInstanceViewsShowMarket(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newMarketEnv(t, k)
		d := loadAPIDoc(t)
		eng, acct := e.key("acme", "engineer")
		r := e.do("POST", "/api/v1/gpu/instances", eng, `{"image":"vllm/vllm-openai:latest","spec":{"gpu":"4090",`+
			`"max_price_per_hour":1,"providers":"vast.ai","market":"interruptible"}}`)
		d.check("POST", "/api/v1/gpu/instances", r)
		bid, _ := r.JSON(t)["bid_per_hour"].(float64)
		if r.Status != 201 || r.JSON(t)["market"] != "interruptible" || bid <= 0 || bid >= r.JSON(t)["price_per_hour"].(float64) {
			t.Fatalf("interruptible create: %d %s", r.Status, r.Body)
		}
		id := r.JSON(t)["id"].(string)
		pid, _ := strconv.ParseInt(r.JSON(t)["provider_instance_id"].(string), 10, 64)
		if si, ok := e.vast.Instance(pid); !ok || si.Bid < bid-1e-6 || si.Bid > bid+1e-6 {
			t.Fatalf("shown bid $%v/h, the simulator has %+v", bid, si)
		}

		od := e.do("POST", "/api/v1/gpu/instances", eng, `{"image":"vllm/vllm-openai:latest","spec":{"gpu":"4090",`+
			`"max_price_per_hour":5,"providers":"vast.ai"}}`)
		d.check("POST", "/api/v1/gpu/instances", od)
		if _, hasBid := od.JSON(t)["bid_per_hour"]; od.Status != 201 || od.JSON(t)["market"] != "on-demand" || hasBid {
			t.Fatalf("on-demand create: %d %s", od.Status, od.Body)
		}

		ctx := context.Background()
		poll := func(want gpuproxy.InstanceStatus) {
			t.Helper()
			testpoll.Until(t, 20*time.Second, id+" "+string(want), func() bool {
				if err := e.fleet.Poll(ctx); err != nil {
					t.Fatal(err)
				}
				in, err := e.store.Instance(ctx, acct.ID, id)
				return err == nil && in.Status == want
			})
		}
		poll(gpuproxy.Running)
		if err := e.vast.Preempt(pid, time.Hour); err != nil {
			t.Fatal(err)
		}
		poll(gpuproxy.Preempted)

		one := e.do("GET", "/api/v1/gpu/instances/"+id, eng, "")
		d.check("GET", "/api/v1/gpu/instances/{id}", one)
		msg, _ := one.JSON(t)["status_msg"].(string)
		if one.JSON(t)["status"] != "preempted" || one.JSON(t)["market"] != "interruptible" ||
			one.JSON(t)["bid_per_hour"] != bid || !strings.HasPrefix(msg, "paused") {
			t.Fatalf("GET preempted instance: %d %s", one.Status, one.Body)
		}
		list := e.do("GET", "/api/v1/gpu/instances", eng, "")
		d.check("GET", "/api/v1/gpu/instances", list)
		markets := map[string]string{}
		for _, x := range list.JSON(t)["instances"].([]any) {
			m := x.(map[string]any)
			markets[m["id"].(string)] = m["market"].(string) + " " + m["status"].(string) + " " + m["status_msg"].(string)
		}
		if got := markets[id]; got != "interruptible preempted "+msg {
			t.Errorf("listed %s as %q", id, got)
		}
		if got := markets[od.JSON(t)["id"].(string)]; !strings.HasPrefix(got, "on-demand ") {
			t.Errorf("listed the on-demand instance as %q", got)
		}
	})
}
