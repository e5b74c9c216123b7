package fleet_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// deleteGate stands in front of the vast.ai simulator, counts the DELETEs
// it is sent and holds the first one until released, so that a test can
// run the poller while a destroy is on the wire.
type deleteGate struct {
	deletes atomic.Int64
	entered chan struct{} // closed when the first DELETE arrives
	release chan struct{} // close to let it through
	once    sync.Once
}

func newDeleteGate() *deleteGate {
	return &deleteGate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *deleteGate) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/api/v0/instances/") {
			if g.deletes.Add(1) == 1 {
				g.once.Do(func() { close(g.entered) })
				<-g.release
			}
		}
		h.ServeHTTP(w, r)
	})
}

// destroyRace is a fleet over one store and a gated vast.ai simulator,
// with a running instance whose max_duration is an hour.
type destroyRace struct {
	st    *db.Store
	f     *fleet.Service
	gate  *deleteGate
	clock *teststack.Clock
	acct  gpuproxy.Account
	inst  gpuproxy.Instance
}

func newDestroyRace(t *testing.T, k dbtest.Kind) *destroyRace {
	t.Helper()
	ctx := context.Background()
	d := &destroyRace{st: dbtest.Open(t, k), gate: newDeleteGate(), clock: teststack.NewClock(time.Now())}
	sim := vastaisim.New(vastaisim.Options{APIKey: "vk", StartDelay: time.Nanosecond})
	hs := httptest.NewServer(d.gate.wrap(sim.Handler()))
	t.Cleanup(hs.Close)
	t.Cleanup(func() {
		select { // never leave a held DELETE behind
		case <-d.gate.release:
		default:
			close(d.gate.release)
		}
	})
	var err error
	if d.acct, err = d.st.CreateAccount(ctx, "acme", time.Now()); err != nil {
		t.Fatal(err)
	}
	va := vastai.New(vastai.Options{BaseURL: hs.URL, APIKey: "vk", Timeout: 30 * time.Second, RetryWait: time.Millisecond})
	g := guardrails.New(d.st, guardrails.Options{Logger: quiet, Now: d.clock.Now})
	d.f = fleet.New(d.st, g, []providers.Provider{va}, fleet.Options{Logger: quiet, Now: d.clock.Now,
		Leader: d.st.WithLeader, PollInterval: 20 * time.Millisecond, OfferCacheTTL: -1})
	res, err := d.f.Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI})
	if err != nil || len(res.Offers) == 0 {
		t.Fatalf("offers: %v %+v", err, res)
	}
	inst, err := d.f.Create(ctx, d.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: res.Offers[0].ID,
		Image: "i", Lifetime: fleet.LifetimeRequest{MaxDuration: dur(time.Hour), IdleTimeout: dur(24 * time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if d.inst, err = d.f.WaitRunning(wctx, d.acct.ID, inst.ID, nil); err != nil || d.inst.Status != gpuproxy.Running {
		t.Fatalf("not running: %s %v", d.inst.Status, err)
	}
	return d
}

// terminated waits until the row is terminated and checks that one DELETE
// was sent for it.
func (d *destroyRace) terminated(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	testpoll.Until(t, 20*time.Second, "the row is terminated", func() bool {
		if _, err := d.f.Get(ctx, d.acct.ID, d.inst.ID); err != nil {
			t.Fatal(err)
		}
		if err := d.f.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		row, err := d.st.Instance(ctx, d.acct.ID, d.inst.ID)
		return err == nil && row.Status == gpuproxy.Terminated
	})
	if n := d.gate.deletes.Load(); n != 1 {
		t.Fatalf("%d DELETEs sent to vast.ai for one destroy, want 1", n)
	}
}

// TestLifetimeDestroyAndPollerSendOneDelete: a lifetime rule's destroy is
// on the wire (the row already terminating, vast.ai not yet told) when the
// poller looks at the terminating row. The poller only confirms a destroy
// another caller claimed; it sent a second DELETE (the attack harness saw
// two, 0-7 ms apart), since both read the instance as running first.
func TestLifetimeDestroyAndPollerSendOneDelete(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			d := newDestroyRace(t, k)
			ctx := context.Background()
			d.clock.Add(d.inst.StartedAt.Add(time.Hour).Sub(d.clock.Now()))
			acted := make(chan fleet.LifetimeReport, 1)
			go func() {
				rep, _ := d.f.Lifetimes(ctx)
				acted <- rep
			}()
			select {
			case <-d.gate.entered:
			case rep := <-acted:
				t.Fatalf("the lifetime pass ended without a DELETE: %+v", rep)
			}
			if err := d.f.Poll(ctx); err != nil {
				t.Fatal(err)
			}
			close(d.gate.release)
			if rep := <-acted; len(rep.Acted) != 1 || len(rep.Errors) != 0 {
				t.Fatalf("lifetime pass: %+v", rep)
			}
			d.terminated(t)
		})
	}
}

// TestStaleDestroyClaimTakenOnce: a destroy whose claimant died after
// marking the row terminating, before vast.ai heard of it, is sent again
// once its claim is older than DestroyRetry, by exactly one of the callers
// that find it then (the poller and an API destroy at once), and not
// before.
func TestStaleDestroyClaimTakenOnce(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			d := newDestroyRace(t, k)
			ctx := context.Background()
			close(d.gate.release)
			if _, err := d.st.MarkTerminating(ctx, d.inst.ID, d.clock.Now()); err != nil {
				t.Fatal(err)
			}
			if err := d.f.Poll(ctx); err != nil {
				t.Fatal(err)
			}
			if n := d.gate.deletes.Load(); n != 0 {
				t.Fatalf("%d DELETEs for a fresh claim", n)
			}
			d.clock.Add(fleet.DefaultDestroyRetry + time.Second)
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := d.f.Poll(ctx); err != nil {
					t.Error(err)
				}
			})
			wg.Go(func() {
				if _, err := d.f.Destroy(ctx, d.acct.ID, d.inst.ID); err != nil {
					t.Error(err)
				}
			})
			wg.Wait()
			d.terminated(t)
		})
	}
}
