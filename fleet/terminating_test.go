package fleet_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
)

// TestDestroyIsAskedOnce: io.net reads "termination requested" for a while
// after a destroy; the poller waits for its confirmation instead of
// sending the DELETE again at every poll (the attack harness counted 24
// repeats), and the row ends terminated.
func TestDestroyIsAskedOnce(t *testing.T) {
	st := dbtest.Open(t, dbtest.SQLite)
	ctx := context.Background()
	sim := ionetsim.New(ionetsim.Options{APIKey: "ik", StartDelay: time.Nanosecond, TerminateDelay: time.Second})
	var deletes atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && strings.Contains(r.URL.Path, "/deployment/") {
			deletes.Add(1)
		}
		sim.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	acct, err := st.CreateAccount(ctx, "acme", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ia := ionet.New(ionet.Options{BaseURL: hs.URL, APIKey: "ik", Timeout: 10 * time.Second, RetryWait: time.Millisecond})
	f := fleet.New(st, guardrails.New(st, guardrails.Options{Logger: quiet}), []providers.Provider{ia},
		fleet.Options{Logger: quiet, PollInterval: 20 * time.Millisecond, OfferCacheTTL: -1})
	res, err := f.Offers(ctx, fleet.OfferQuery{Provider: providers.IONet})
	if err != nil || len(res.Offers) == 0 {
		t.Fatalf("offers: %v %+v", err, res)
	}
	inst, err := f.Create(ctx, acct.ID, fleet.CreateRequest{Provider: providers.IONet, OfferID: res.Offers[0].ID,
		Image: "i", Hours: 1})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := f.WaitRunning(wctx, acct.ID, inst.ID, nil); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.Run(runCtx) }()
	defer func() { stop(); <-done }()
	if _, err := f.Destroy(ctx, acct.ID, inst.ID); err != nil {
		t.Fatal(err)
	}
	testpoll.Until(t, 20*time.Second, "the destroyed instance is terminated", func() bool {
		row, err := st.Instance(ctx, acct.ID, inst.ID)
		if err != nil {
			t.Fatal(err)
		}
		return row.Status == gpuproxy.Terminated
	})
	if n := deletes.Load(); n != 1 {
		t.Fatalf("%d DELETEs sent for one destroy", n)
	}
}
