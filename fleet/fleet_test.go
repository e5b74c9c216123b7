package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/ionet"
	"github.com/aiserve/gpuproxy/providers/ionet/ionetsim"
	"github.com/aiserve/gpuproxy/providers/vastai"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

const usd = gpuproxy.MicrosPerUSD

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// world is a full stack on real stores and the providers' simulators.
type world struct {
	t      *testing.T
	stores []*db.Store
	vast   *vastaisim.Server
	io     *ionetsim.Server
	vastP  []*vastai.Adapter // one adapter (own breaker) per replica
	ioP    []*ionet.Adapter
	fleets []*fleet.Service
	guards []*guardrails.Service
	acct   gpuproxy.Account
}

type worldOpts struct {
	replicas  int
	catalog   []vastaisim.Offer
	limits    []guardrails.Window
	fleetOpts fleet.Options
	vastOpts  func(*vastaisim.Options) // changes the vast.ai simulator's options
}

func newWorld(t *testing.T, k dbtest.Kind, o worldOpts) *world {
	t.Helper()
	if o.replicas == 0 {
		o.replicas = 1
	}
	w := &world{t: t, stores: dbtest.Replicas(t, k, o.replicas)}
	vo := vastaisim.Options{APIKey: "vk", StartDelay: 150 * time.Millisecond, Catalog: o.catalog}
	if o.vastOpts != nil {
		o.vastOpts(&vo)
	}
	w.vast = vastaisim.New(vo)
	vurl, err := w.vast.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.vast.Close)
	w.io = ionetsim.New(ionetsim.Options{APIKey: "ik", StartDelay: 150 * time.Millisecond})
	iurl, err := w.io.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.io.Close)
	ctx := context.Background()
	if w.acct, err = w.stores[0].CreateAccount(ctx, "acme", time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, s := range w.stores {
		va := vastai.New(vastai.Options{BaseURL: vurl, APIKey: "vk", Timeout: 30 * time.Second, RetryWait: time.Millisecond,
			BreakerFailures: 3, BreakerOpenFor: 300 * time.Millisecond})
		ia := ionet.New(ionet.Options{BaseURL: iurl, APIKey: "ik", Timeout: 30 * time.Second, RetryWait: time.Millisecond})
		g := guardrails.New(s, guardrails.Options{Defaults: o.limits, Logger: quiet})
		fo := o.fleetOpts
		fo.Logger, fo.Leader, fo.Ledger = quiet, s.WithLeader, billing.NewLedger(s, nil)
		if fo.PollInterval == 0 {
			fo.PollInterval = 40 * time.Millisecond
		}
		if fo.OfferCacheTTL == 0 {
			fo.OfferCacheTTL = -1
		}
		w.vastP, w.ioP, w.guards = append(w.vastP, va), append(w.ioP, ia), append(w.guards, g)
		w.fleets = append(w.fleets, fleet.New(s, g, []providers.Provider{va, ia}, fo))
	}
	return w
}

func (w *world) offer(provider string, maxPrice float64) providers.Offer {
	w.t.Helper()
	res, err := w.fleets[0].Offers(context.Background(), fleet.OfferQuery{Provider: provider, MaxPrice: gpuproxy.Micros(maxPrice * usd)})
	if err != nil || len(res.Offers) == 0 {
		w.t.Fatalf("no %s offers: %v %+v", provider, err, res.Errors)
	}
	return res.Offers[0]
}

func (w *world) waitRunning(f *fleet.Service, id string) gpuproxy.Instance {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inst, err := f.WaitRunning(ctx, w.acct.ID, id, nil)
	if err != nil || inst.Status != gpuproxy.Running {
		w.t.Fatalf("instance %s not running: %s %v", id, inst.Status, err)
	}
	return inst
}

func TestLifecycleHourly(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{})
			ctx := context.Background()
			f := w.fleets[0]
			o := w.offer(providers.VastAI, 2)
			req := fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "vllm/vllm-openai:latest", IdempotencyKey: "k1"}
			inst, err := f.Create(ctx, w.acct.ID, req)
			if err != nil {
				t.Fatal(err)
			}
			if inst.Status != gpuproxy.Starting || inst.ProviderInstanceID == "" {
				t.Fatalf("after create: %+v", inst)
			}
			// A retried create with the same key is the same instance, not a second rental.
			again, err := f.Create(ctx, w.acct.ID, req)
			if err != nil || again.ID != inst.ID {
				t.Fatalf("idempotent retry: %+v %v", again, err)
			}
			if n := len(w.vast.Instances()); n != 1 {
				t.Fatalf("provider has %d instances, want 1", n)
			}
			snap, _ := w.guards[0].Spending(ctx, w.acct.ID)
			if snap.Held != o.PricePerHour { // H = 1h
				t.Fatalf("held while starting = %s, want %s", snap.Held, o.PricePerHour)
			}
			inst = w.waitRunning(f, inst.ID)
			if inst.Endpoint == "" {
				t.Fatal("no endpoint")
			}
			snap, _ = w.guards[0].Spending(ctx, w.acct.ID)
			if snap.Held != 0 || snap.Burn != o.PricePerHour {
				t.Fatalf("running: held %s burn %s", snap.Held, snap.Burn)
			}
			// pace: models time: the instance runs a while before it is
			// destroyed.
			time.Sleep(50 * time.Millisecond)
			got, err := f.Destroy(ctx, w.acct.ID, inst.ProviderInstanceID) // by the provider's id
			if err != nil || got.Status != gpuproxy.Terminated {
				t.Fatalf("destroy: %+v %v", got, err)
			}
			if sim, _ := w.vast.Instance(mustInt(inst.ProviderInstanceID)); !sim.Destroyed {
				t.Fatal("provider instance not destroyed")
			}
			// Metering long after termination charges only up to it.
			m := billing.NewMeterer(w.stores[0], billing.MeterOptions{Now: func() time.Time { return time.Now().Add(5 * time.Hour) }})
			if _, err := m.Tick(ctx); err != nil {
				t.Fatal(err)
			}
			v, _ := f.Get(ctx, w.acct.ID, inst.ID)
			want := inst.PricePerHour.MulMillis(got.TerminatedAt.Sub(inst.StartedAt).Milliseconds())
			if v.CostToDate != want || want <= 0 {
				t.Fatalf("cost to date %s, want %s (start %v, end %v)", v.CostToDate, want, inst.StartedAt, got.TerminatedAt)
			}
			if _, err := f.Destroy(ctx, w.acct.ID, inst.ID); err != nil {
				t.Fatalf("destroy is not idempotent: %v", err)
			}
			snap, _ = w.guards[0].Spending(ctx, w.acct.ID)
			if snap.Burn != 0 {
				t.Fatalf("burn after destroy = %s", snap.Burn)
			}
		})
	}
}

// TestPrepaidNeedsHours: a prepaid create without hours is refused naming
// the field, before any quote or rental; an hourly one needs none.
func TestPrepaidNeedsHours(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{})
	ctx := context.Background()
	f := w.fleets[0]
	o := w.offer(providers.IONet, 100)
	_, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.IONet, OfferID: o.ID, Image: "img:1"})
	if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || gpuproxy.ErrorDetails(err)["field"] != "hours" {
		t.Fatalf("io.net create without hours: %v", err)
	}
	if msg := gpuproxy.ErrorMessage(err); !strings.Contains(msg, "hours") || !strings.Contains(msg, "up front") ||
		!strings.Contains(msg, "720") {
		t.Fatalf("message %q does not say what hours is", msg)
	}
	if n := len(w.io.Deployments()); n != 0 {
		t.Fatalf("%d deployments after a refused create", n)
	}
	if list, _ := f.List(ctx, w.acct.ID, ""); len(list) != 0 {
		t.Fatalf("refused create left rows: %+v", list)
	}
	v := w.offer(providers.VastAI, 2)
	inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: v.ID, Image: "img:1"})
	if err != nil || inst.Hours != 0 {
		t.Fatalf("vast.ai create without hours: %+v %v", inst, err)
	}
}

func TestLifecyclePrepaid(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{})
	ctx := context.Background()
	f := w.fleets[0]
	o := w.offer(providers.IONet, 100)
	inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.IONet, OfferID: o.ID, Image: "img:1", Hours: 3})
	if err != nil {
		t.Fatal(err)
	}
	total := inst.PrepaidTotal
	if total <= 0 || total != o.PricePerHour*3 {
		t.Fatalf("prepaid total %s for price %s × 3h", total, o.PricePerHour)
	}
	// The instance and its prepaid charge name the GPU (io.net's price and
	// deploy replies do not; the adapter reads the hardware list).
	if inst.GPUName == "" || inst.GPUName != o.GPUName {
		t.Fatalf("instance GPU %q, offer's %q", inst.GPUName, o.GPUName)
	}
	var descs []string
	if err := billing.NewLedger(w.stores[0], nil).Each(ctx, billing.Filter{AccountID: w.acct.ID, InstanceID: inst.ID},
		func(e billing.Entry) error { descs = append(descs, e.Description); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("io.net prepaid 3h of %d× %s", o.NumGPUs, o.GPUName); len(descs) != 1 || descs[0] != want {
		t.Fatalf("ledger descriptions %q, want [%q]", descs, want)
	}
	snap, _ := w.guards[0].Spending(ctx, w.acct.ID)
	if snap.Held != 0 || snap.Windows[0].Spent != total {
		t.Fatalf("after create: held %s spent %s, want 0 and %s", snap.Held, snap.Windows[0].Spent, total)
	}
	w.waitRunning(f, inst.ID)
	got, err := f.Destroy(ctx, w.acct.ID, inst.ID)
	if err != nil || (got.Status != gpuproxy.Terminated && got.Status != gpuproxy.Terminating) {
		t.Fatalf("destroy: %+v %v", got, err)
	}
	// io.net tears down asynchronously: the poller confirms it.
	testpoll.Wait(5*time.Second, func() bool {
		if got.Status == gpuproxy.Terminated {
			return true
		}
		if err := f.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		got, _ = w.stores[0].Instance(ctx, w.acct.ID, inst.ID)
		return got.Status == gpuproxy.Terminated
	})
	if got.Status != gpuproxy.Terminated {
		t.Fatalf("not terminated: %s", got.Status)
	}
	v, _ := f.Get(ctx, w.acct.ID, inst.ID)
	// Destroyed within the first (non-refundable) hour: two of three hours back.
	if v.CostToDate >= total || v.CostToDate < total/3 {
		t.Fatalf("cost after early destroy %s of %s", v.CostToDate, total)
	}
	deps := w.io.Deployments()
	if len(deps) != 1 || deps[0].Refunded != total-v.CostToDate {
		t.Fatalf("provider refunded %v; our ledger refunds %s", deps, total-v.CostToDate)
	}
}

// TestConcurrentCreatesNeverOverspend: 100 creates over four service
// replicas on one Postgres against $50/60 min with $3/hour offers.
func TestConcurrentCreatesNeverOverspend(t *testing.T) {
	base := vastaisim.DefaultCatalog()[0]
	var cat []vastaisim.Offer
	for i := range 100 {
		o := base
		o.ID, o.AskContractID, o.MachineID = int64(900000+i), int64(900000+i), int64(700000+i)
		o.DPHTotal, o.DPHBase, o.StorageCost = 3.0, 3.0, 0
		cat = append(cat, o)
	}
	w := newWorld(t, dbtest.Postgres, worldOpts{replicas: 4, catalog: cat,
		limits: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}}})
	ctx := context.Background()
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 100 {
		wg.Go(func() {
			<-start
			_, err := w.fleets[i%4].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI,
				OfferID: fmt.Sprint(900000 + i), Image: "img"})
			switch gpuproxy.ErrorCode(err) {
			case "":
				admitted.Add(1)
			case gpuproxy.ELIMIT:
				refused.Add(1)
			default:
				t.Errorf("create %d: %v", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	price := gpuproxy.Micros(3 * usd)
	if admitted.Load()*int64(price) > 50*usd || admitted.Load() != 16 {
		t.Fatalf("admitted %d at $3/h against $50 (refused %d)", admitted.Load(), refused.Load())
	}
	snap, err := w.guards[0].Spending(ctx, w.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Held+snap.Windows[0].Committed > 50*usd {
		t.Fatalf("held %s + committed %s exceed the limit", snap.Held, snap.Windows[0].Committed)
	}
	if n := len(w.vast.Instances()); int64(n) != admitted.Load() {
		t.Fatalf("provider rented %d, we admitted %d", n, admitted.Load())
	}
}

// TestCrashAfterProviderCreate: the service dies between the provider's
// create and our row update; after a restart the reconciler adopts the
// instance, which then runs metered; nothing runs unbilled.
func TestCrashAfterProviderCreate(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			crash := errors.New("killed")
			w := newWorld(t, k, worldOpts{fleetOpts: fleet.Options{
				AfterProviderCreate: func(gpuproxy.Instance, string) error { return crash }}})
			ctx := context.Background()
			o := w.offer(providers.VastAI, 2)
			inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "img"})
			if !errors.Is(err, crash) || inst.Status != gpuproxy.Pending {
				t.Fatalf("crash hook: %+v %v", inst, err)
			}
			// Restart: a fresh service over the same database and provider.
			g := guardrails.New(w.stores[0], guardrails.Options{Logger: quiet})
			restarted := fleet.New(w.stores[0], g, []providers.Provider{w.vastP[0], w.ioP[0]},
				fleet.Options{Logger: quiet, PollInterval: 40 * time.Millisecond, Leader: w.stores[0].WithLeader})
			rep, err := restarted.Reconcile(ctx)
			if err != nil || len(rep.Adopted) != 1 || rep.Adopted[0] != inst.ID {
				t.Fatalf("reconcile: %+v %v", rep, err)
			}
			inst = func() gpuproxy.Instance {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				got, err := restarted.WaitRunning(cctx, w.acct.ID, inst.ID, nil)
				if err != nil || got.Status != gpuproxy.Running {
					t.Fatalf("adopted instance not running: %+v %v", got, err)
				}
				return got
			}()
			snap, _ := g.Spending(ctx, w.acct.ID)
			if snap.Burn != inst.PricePerHour || snap.Held != 0 {
				t.Fatalf("adopted instance not metered: burn %s held %s", snap.Burn, snap.Held)
			}
		})
	}
}

// TestReconcilerCleansUp: an untracked instance tagged as ours is destroyed;
// a row whose provider instance vanished is terminated and stops metering;
// an ambiguous create whose rental never happened is failed and released.
func TestReconcilerCleansUp(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{fleetOpts: fleet.Options{PendingGrace: time.Millisecond}})
	ctx := context.Background()
	f := w.fleets[0]
	offers, _ := f.Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI, Limit: 3})
	// 1. An instance that vanishes at the provider.
	a, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: offers.Offers[0].ID, Image: "img"})
	if err != nil {
		t.Fatal(err)
	}
	w.waitRunning(f, a.ID)
	// 2. An orphan: rented directly at the provider with a tag of ours.
	orphan, err := w.vastP[0].Create(ctx, providers.CreateRequest{OfferID: offers.Offers[1].ID, Tag: fleet.NewInstanceID(), Image: "img"})
	if err != nil {
		t.Fatal(err)
	}
	// 3. An ambiguous create that the provider never executed.
	w.vast.ReplyNext(1, "PUT", "/api/v0/asks/", 502, "bad gateway")
	amb, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: offers.Offers[2].ID, Image: "img"})
	if err != nil || amb.Status != gpuproxy.Pending {
		t.Fatalf("ambiguous create: %+v %v", amb, err)
	}
	if err := w.vastP[0].Destroy(ctx, a.ProviderInstanceID); err != nil {
		t.Fatal(err)
	}
	rep, err := f.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Terminated) != 1 || rep.Terminated[0] != a.ID || len(rep.Destroyed) != 1 ||
		rep.Destroyed[0] != orphan.ProviderID || len(rep.Failed) != 1 || rep.Failed[0] != amb.ID {
		t.Fatalf("report = %+v", rep)
	}
	snap, _ := w.guards[0].Spending(ctx, w.acct.ID)
	if snap.Burn != 0 || snap.Held != 0 {
		t.Fatalf("after reconcile: burn %s held %s", snap.Burn, snap.Held)
	}
}

// TestOrphanPolicyLeave: with orphan_policy leave (and its deprecated
// name adopt, which New warns about) an untracked instance tagged as ours
// is left running, reported in Left and logged for an operator; nothing is
// destroyed and nothing is billed.
func TestOrphanPolicyLeave(t *testing.T) {
	for _, policy := range []string{fleet.OrphanLeave, fleet.OrphanAdopt} {
		t.Run(policy, func(t *testing.T) {
			w := newWorld(t, dbtest.SQLite, worldOpts{})
			ctx := context.Background()
			var logs strings.Builder
			var mu sync.Mutex
			fo := fleet.Options{OrphanPolicy: policy, OfferCacheTTL: -1, Leader: w.stores[0].WithLeader,
				Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))}
			f := fleet.New(w.stores[0], w.guards[0], []providers.Provider{w.vastP[0], w.ioP[0]}, fo)
			o := w.offer(providers.VastAI, 100)
			orphan, err := w.vastP[0].Create(ctx, providers.CreateRequest{OfferID: o.ID, Tag: fleet.NewInstanceID(), Image: "img"})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := f.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Left) != 1 || rep.Left[0] != orphan.ProviderID || len(rep.Destroyed) != 0 {
				t.Fatalf("report = %+v", rep)
			}
			if pi, err := w.vastP[0].Get(ctx, orphan.ProviderID); err != nil || pi.Status == providers.StatusTerminated {
				t.Fatalf("orphan after reconcile: %+v %v", pi, err)
			}
			if snap, _ := w.guards[0].Spending(ctx, w.acct.ID); snap.Burn != 0 || snap.Held != 0 {
				t.Fatalf("orphan billed: burn %s held %s", snap.Burn, snap.Held)
			}
			mu.Lock()
			defer mu.Unlock()
			if !strings.Contains(logs.String(), "orphan_policy leave") {
				t.Errorf("orphan not logged for an operator:\n%s", logs.String())
			}
			if deprecated := strings.Contains(logs.String(), `orphan_policy \"adopt\" is deprecated`); deprecated != (policy == fleet.OrphanAdopt) {
				t.Errorf("deprecation warning %v for %q:\n%s", deprecated, policy, logs.String())
			}
		})
	}
}

// lockedWriter serializes writes to a strings.Builder.
type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestBreaker: a provider returning 5xx opens its breaker; calls then fail
// fast while the other provider keeps serving offers; it closes again after
// recovery.
func TestBreaker(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{})
	ctx := context.Background()
	f := w.fleets[0]
	w.vast.FailNext(1000, 503, "/api/v0/bundles")
	for range 3 {
		res, err := f.Offers(ctx, fleet.OfferQuery{})
		if err != nil || len(res.Errors) != 1 || res.Errors[0].Provider != providers.VastAI || len(res.Offers) == 0 {
			t.Fatalf("partial results: %+v %v", res.Errors, err)
		}
	}
	if st := w.vastP[0].BreakerState(); st != "open" {
		t.Fatalf("breaker %s after 3 failures", st)
	}
	before := w.vast.CountRequests("POST", "/api/v0/bundles")
	best := time.Hour
	for range 5 {
		t0 := time.Now()
		_, err := w.vastP[0].Search(ctx, providers.SearchFilter{})
		if providers.KindOf(err) != providers.KindUnavailable {
			t.Fatalf("open breaker: %v", err)
		}
		best = min(best, time.Since(t0))
	}
	if best > time.Millisecond || w.vast.CountRequests("POST", "/api/v0/bundles") != before {
		t.Fatalf("open breaker took %v or reached the provider", best)
	}
	if res, _ := f.Offers(ctx, fleet.OfferQuery{Provider: providers.IONet}); len(res.Offers) == 0 {
		t.Fatal("io.net stopped serving while vast.ai's breaker is open")
	}
	w.vast.ClearFaults()
	// Once its open interval ends the breaker lets a search through.
	var serr error
	if !testpoll.Wait(5*time.Second, func() bool {
		_, serr = w.vastP[0].Search(ctx, providers.SearchFilter{})
		return serr == nil
	}) {
		t.Fatalf("after recovery: %v", serr)
	}
	if st := w.vastP[0].BreakerState(); st != "closed" {
		t.Fatalf("breaker %s after recovery", st)
	}
}

func TestKillSwitch(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{limits: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}}})
	ctx := context.Background()
	f := w.fleets[0]
	o := w.offer(providers.VastAI, 2)
	inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "img"})
	if err != nil {
		t.Fatal(err)
	}
	w.waitRunning(f, inst.ID)
	if err := w.guards[0].SetLimits(ctx, w.acct.ID, nil, gpuproxy.OnExceedDestroy); err != nil {
		t.Fatal(err)
	}
	// Spend reaches the limit (e.g. other charges land).
	if _, _, err := w.stores[0].AppendEntry(ctx, billing.Entry{AccountID: w.acct.ID, Type: billing.Charge, Amount: 50 * usd,
		At: time.Now(), Basis: billing.Manual}); err != nil {
		t.Fatal(err)
	}
	rep, err := f.Reconcile(ctx)
	if err != nil || len(rep.KillSwitch) != 1 {
		t.Fatalf("kill switch: %+v %v", rep, err)
	}
	v, _ := f.Get(ctx, w.acct.ID, inst.ID)
	if v.Status != gpuproxy.Terminated {
		t.Fatalf("status %s", v.Status)
	}
}

func TestCreateRefusalsAndIsolation(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{limits: []guardrails.Window{{Minutes: 60, Limit: 1 * usd}}})
	ctx := context.Background()
	f := w.fleets[0]
	o := w.offer(providers.VastAI, 100)
	for _, tc := range []struct {
		req  fleet.CreateRequest
		code string
	}{
		{fleet.CreateRequest{Provider: "aws", OfferID: o.ID, Image: "i"}, gpuproxy.EINVALID},
		{fleet.CreateRequest{Provider: providers.VastAI, Image: "i"}, gpuproxy.EINVALID},
		{fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID}, gpuproxy.EINVALID},
		{fleet.CreateRequest{Provider: providers.VastAI, OfferID: "999999999", Image: "i"}, gpuproxy.EGONE},
		{fleet.CreateRequest{Provider: providers.VastAI, OfferID: w.offer(providers.VastAI, 100).ID, Image: "i", Ports: []int{70000}}, gpuproxy.EINVALID},
	} {
		if _, err := f.Create(ctx, w.acct.ID, tc.req); gpuproxy.ErrorCode(err) != tc.code {
			t.Errorf("%+v: got %v, want %s", tc.req, err, tc.code)
		}
	}
	// Over the $1 limit: refused before any provider call.
	all, _ := f.Offers(ctx, fleet.OfferQuery{Provider: providers.VastAI, Limit: 500})
	expensive := all.Offers[len(all.Offers)-1]
	before := w.vast.CountRequests("PUT", "/api/v0/asks")
	_, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Provider: providers.VastAI, OfferID: expensive.ID, Image: "i"})
	if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT || expensive.PricePerHour <= usd {
		t.Fatalf("over limit: %v", err)
	}
	if w.vast.CountRequests("PUT", "/api/v0/asks") != before {
		t.Fatal("a refused create reached the provider")
	}
	other, _ := w.stores[0].CreateAccount(ctx, "other", time.Now())
	if _, err := f.Get(ctx, other.ID, "gpi_00000000000000000000"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
		t.Fatalf("get unknown: %v", err)
	}
}

func mustInt(s string) int64 {
	var n int64
	_, _ = fmt.Sscan(s, &n)
	return n
}
