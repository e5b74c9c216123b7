package server_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
	"github.com/aiserve/gpuproxy/server"
)

// TestCreatePassesLoginOnstartArgs: a REST create, of one offer and by
// spec, passes image_login, onstart and args to vast.ai in the create
// body as vast.py sends them (image_login and onstart strings, args a
// list); the login's secret is in no answer (the create, the instance
// view, the list, a refusal) and nowhere in the server's log. io.net,
// which runs no start script, refuses an onstart naming the field before
// anything is rented, and a spec over both providers with one rents on
// vast.ai.
func TestCreatePassesLoginOnstartArgs(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		st := dbtest.Open(t, k)
		a := auth.New(st, auth.Options{CacheTTL: -1})
		logs := &strings.Builder{}
		log := slog.New(slog.NewJSONHandler(&lockedWriter{w: logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		g := guardrails.New(st, guardrails.Options{Logger: log})
		ledger := billing.NewLedger(st, nil)
		vsim := vastaisim.New(vastaisim.Options{APIKey: "vk"})
		vurl, err := vsim.Start("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(vsim.Close)
		isim := ionetsim.New(ionetsim.Options{APIKey: "ik"})
		its := httptest.NewServer(isim.Handler())
		t.Cleanup(its.Close)
		t.Cleanup(isim.Close)
		provs := []providers.Provider{
			vastai.New(vastai.Options{BaseURL: vurl, APIKey: "vk", Timeout: 5 * time.Second, RetryWait: time.Millisecond}),
			ionet.New(ionet.Options{BaseURL: its.URL, APIKey: "ik", Timeout: 5 * time.Second, RetryWait: time.Millisecond}),
		}
		fl := fleet.New(st, g, provs, fleet.Options{OfferCacheTTL: time.Minute, Logger: log, Leader: st.WithLeader,
			Ledger: ledger})
		srv := server.New(server.Services{Auth: a, Guard: g, Ledger: ledger, Fleet: fl, Store: st,
			RateLimiter: auth.NewSharedRateLimiter(0, auth.RateLimitOptions{})}, server.Options{Logger: log})
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		e := &env{t: t, url: hs.URL, store: st, auth: a, ledger: ledger}
		d := loadAPIDoc(t)
		eng, _ := e.key("acme", "engineer")

		const secret = "ghp_PassThroughSecret0123456789"
		login := "-u robot -p " + secret + " ghcr.io"
		onstart := "#!/bin/sh\necho ready > /tmp/ready"
		args := []string{"--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000"}
		pass := func() string {
			b, _ := json.Marshal(map[string]any{"image_login": login, "onstart": onstart, "args": args})
			return strings.TrimSuffix(strings.TrimPrefix(string(b), "{"), "}")
		}()
		noSecret := func(what string, body []byte) {
			t.Helper()
			if strings.Contains(string(body), secret) {
				t.Errorf("%s carries the login's secret: %s", what, body)
			}
		}
		// The create body vast.ai received for the last create.
		lastCreate := func() map[string]any {
			t.Helper()
			var body map[string]any
			for _, r := range vsim.Requests() {
				if r.Method == http.MethodPut && strings.HasPrefix(r.Path, "/api/v0/asks/") {
					body = nil
					if err := json.Unmarshal(r.Body, &body); err != nil {
						t.Fatal(err)
					}
				}
			}
			return body
		}
		wantPassed := func(what string) {
			t.Helper()
			b := lastCreate()
			got, _ := json.Marshal(b["args"])
			want, _ := json.Marshal(args)
			if b["image_login"] != login || b["onstart"] != onstart || string(got) != string(want) {
				t.Errorf("%s: vast.ai's create body %v, want image_login, onstart and args as given", what, b)
			}
		}

		offers := e.offerIDs(eng)
		r := e.do("POST", "/api/v1/gpu/instances", eng, `{"provider":"vast.ai","offer_id":"`+offers[0]+
			`","image":"ghcr.io/acme/llm:1",`+pass+`}`)
		d.check("POST", "/api/v1/gpu/instances", r)
		if r.Status != 201 {
			t.Fatalf("create of one offer: %d %s", r.Status, r.Body)
		}
		noSecret("the create's answer", r.Body)
		wantPassed("one offer")
		id := r.JSON(t)["id"].(string)

		r = e.do("POST", "/api/v1/gpu/instances", eng, `{"image":"ghcr.io/acme/llm:1","spec":{"gpu":"4090",`+
			`"max_price_per_hour":5,"providers":"vast.ai"},`+pass+`}`)
		d.check("POST", "/api/v1/gpu/instances", r)
		if r.Status != 201 {
			t.Fatalf("create by spec: %d %s", r.Status, r.Body)
		}
		noSecret("the spec create's answer", r.Body)
		wantPassed("by spec")

		one := e.do("GET", "/api/v1/gpu/instances/"+id, eng, "")
		d.check("GET", "/api/v1/gpu/instances/{id}", one)
		noSecret("the instance view", one.Body)
		noSecret("the instance list", e.do("GET", "/api/v1/gpu/instances", eng, "").Body)

		// Refusals name the field and never quote the login.
		for _, bad := range []string{`"image_login":"` + secret + `"`,
			`"image_login":"-u robot -p ` + secret + strings.Repeat("x", fleet.MaxImageLogin) + `"`,
			`"image_login":["-u", "robot", "-p", "` + secret + `"]`} {
			r := e.do("POST", "/api/v1/gpu/instances", eng, `{"provider":"vast.ai","offer_id":"`+offers[2]+
				`","image":"img",`+bad+`}`)
			wantField(t, bad[:30], r, "image_login")
			noSecret("a refusal", r.Body)
		}
		for _, bad := range []struct{ body, field string }{
			{`"onstart":["echo"]`, "onstart"},
			{`"args":"--port 8000"`, "args"},
			{`"onstart":"` + strings.Repeat("x", fleet.MaxStartScript) + `","args":["y"]`, "onstart"},
		} {
			r := e.do("POST", "/api/v1/gpu/instances", eng, `{"provider":"vast.ai","offer_id":"`+offers[2]+
				`","image":"img",`+bad.body+`}`)
			wantField(t, bad.body[:12], r, bad.field)
		}

		// io.net runs no start script: one offer is refused, naming
		// onstart, before anything is rented; a spec skips io.net.
		io := e.do("GET", "/api/v1/gpu/offers?provider=io.net", eng, "")
		ioOffers, _ := io.JSON(t)["offers"].([]any)
		if len(ioOffers) == 0 {
			t.Fatalf("io.net offers: %s", io.Body)
		}
		ioOffer := ioOffers[0].(map[string]any)["offer_id"].(string)
		r = e.do("POST", "/api/v1/gpu/instances", eng, `{"provider":"io.net","offer_id":"`+ioOffer+
			`","image":"img","hours":1,"onstart":"echo hi"}`)
		wantField(t, "io.net onstart", r, "onstart")
		r = e.do("POST", "/api/v1/gpu/instances", eng, `{"provider":"io.net","offer_id":"`+ioOffer+
			`","image":"img","hours":1,"onstart":"echo hi","args":["--port","8000"]}`)
		wantField(t, "io.net onstart with args", r, "onstart")
		r = e.do("POST", "/api/v1/gpu/instances", eng, `{"image":"img","onstart":"echo hi","spec":{"max_price_per_hour":50,`+
			`"providers":"io.net","hours":1}}`)
		wantField(t, "a spec of io.net only with onstart", r, "onstart")
		if n := len(isim.Deployments()); n != 0 {
			t.Errorf("%d io.net deployments after the refusals", n)
		}
		r = e.do("POST", "/api/v1/gpu/instances", eng, `{"image":"img","onstart":"echo hi","spec":{"max_price_per_hour":50,`+
			`"hours":1}}`)
		if r.Status != 201 || r.JSON(t)["provider"] != "vast.ai" {
			t.Fatalf("a spec over both providers with onstart: %d %s", r.Status, r.Body)
		}
		for _, at := range r.JSON(t)["attempts"].([]any) {
			if p := at.(map[string]any)["provider"]; p != "vast.ai" {
				t.Errorf("the spec tried %v", at)
			}
		}
		if !slices.ContainsFunc(vsim.Instances(), func(si vastaisim.SimInstance) bool { return si.Label == id }) {
			t.Errorf("no simulator instance for %s", id)
		}
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the server's log carries the login's secret:\n%s", logs.String())
		}
		if !strings.Contains(logs.String(), id) {
			t.Errorf("the log has nothing of %s: is it captured?\n%s", id, logs.String())
		}
	})
}
