package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/providers"
	"github.com/aiserve/gpuproxy/providers/vastai/vastaisim"
)

// goneBody is vast.ai's answer to a create of an ask someone else took.
const goneBody = `{"success":false,"error":"no_such_ask","msg":"no longer available"}`

// failCreates makes the next n vast.ai creates answer that the ask is gone.
func failCreates(w *world, n int) {
	w.vast.Inject(vastaisim.Fault{Kind: vastaisim.FaultStatus, Method: http.MethodPut, PathPrefix: "/api/v0/asks",
		Count: n, Status: http.StatusGone, Body: goneBody, ContentType: "application/json"})
}

// creates counts the create calls the vast.ai simulator received.
func creates(w *world) int {
	n := 0
	for _, r := range w.vast.Requests() {
		if r.Method == http.MethodPut && strings.HasPrefix(r.Path, "/api/v0/asks") {
			n++
		}
	}
	return n
}

func spec4090(maxPrice float64) *fleet.Spec {
	return &fleet.Spec{GPU: []string{"RTX 4090"}, MaxPricePerHour: gpuproxy.Micros(maxPrice * usd),
		Providers: []string{providers.VastAI}}
}

// TestRentBySpecFailsOver: offers taken between search and create are
// recorded as offer_gone and the next cheapest is tried, until one is
// rented; the attempts are on the instance, cheapest first, all distinct,
// and each is observed for the metric.
func TestRentBySpecFailsOver(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			var mu sync.Mutex
			seen := map[string]int{}
			w := newWorld(t, k, worldOpts{fleetOpts: fleet.Options{OnRentAttempt: func(p, outcome string) {
				mu.Lock()
				seen[p+"/"+outcome]++
				mu.Unlock()
			}}})
			ctx := context.Background()
			failCreates(w, 2)
			sp := &fleet.Spec{MaxPricePerHour: 50 * usd, Providers: []string{providers.VastAI}}
			inst, err := w.fleets[0].Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i"})
			if err != nil {
				t.Fatal(err)
			}
			if len(inst.Attempts) != 3 {
				t.Fatalf("attempts: %+v", inst.Attempts)
			}
			ids := map[string]bool{}
			for i, a := range inst.Attempts {
				want := gpuproxy.RentOfferGone
				if i == 2 {
					want = gpuproxy.RentRented
				}
				if a.Outcome != want || a.Provider != providers.VastAI || ids[a.OfferID] || a.NumGPUs != 1 {
					t.Fatalf("attempt %d: %+v", i, a)
				}
				if i > 0 && a.PricePerHour < inst.Attempts[i-1].PricePerHour {
					t.Fatalf("not cheapest first: %+v", inst.Attempts)
				}
				ids[a.OfferID] = true
			}
			if inst.Attempts[0].Error == "" || inst.OfferID != inst.Attempts[2].OfferID {
				t.Fatalf("attempts: %+v, rented %s", inst.Attempts, inst.OfferID)
			}
			got, err := w.fleets[0].Get(ctx, w.acct.ID, inst.ID)
			if err != nil || len(got.Attempts) != 3 || got.Attempts[2].Outcome != gpuproxy.RentRented {
				t.Fatalf("stored attempts: %+v %v", got.Attempts, err)
			}
			if seen[providers.VastAI+"/offer_gone"] != 2 || seen[providers.VastAI+"/rented"] != 1 {
				t.Fatalf("observed: %v", seen)
			}
			// The failed attempts' holds were released: only the rented
			// instance holds or spends.
			list, err := w.fleets[0].List(ctx, w.acct.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			live := 0
			for _, v := range list {
				if v.Status != gpuproxy.Failed {
					live++
				}
			}
			if live != 1 {
				t.Fatalf("live instances: %d of %d", live, len(list))
			}
		})
	}
}

// TestRentBySpecNoMatch: a cap under every offer, or memory no offer has,
// is no_matching_offer naming what was searched and the nearest miss, and
// nothing is rented.
func TestRentBySpecNoMatch(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{})
	ctx := context.Background()
	f := w.fleets[0]
	_, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: spec4090(0.01), Image: "i"})
	msg := gpuproxy.ErrorMessage(err)
	if gpuproxy.ErrorCode(err) != gpuproxy.ENOMATCH || !strings.Contains(msg, "cheapest RTX 4090 is $") ||
		!strings.Contains(msg, "over your $0.01 cap") || !strings.Contains(msg, "RTX 4090") {
		t.Fatalf("under every price: %v", err)
	}
	sp := spec4090(50)
	sp.MinVRAMGB = 500
	_, err = f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i"})
	if msg := gpuproxy.ErrorMessage(err); gpuproxy.ErrorCode(err) != gpuproxy.ENOMATCH ||
		!strings.Contains(msg, "no offer with 500 GB per GPU meets your other constraints; the most is") {
		t.Fatalf("500 GB: %v", err)
	}
	sp = spec4090(50)
	sp.GPU = []string{"H900"}
	_, err = f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i"})
	if msg := gpuproxy.ErrorMessage(err); gpuproxy.ErrorCode(err) != gpuproxy.ENOMATCH ||
		!strings.Contains(msg, "no H900 offer meets your other constraints; offered instead:") {
		t.Fatalf("unknown GPU: %v", err)
	}
	if n := creates(w); n != 0 {
		t.Fatalf("%d creates sent", n)
	}
	// Bad input names the field.
	for field, sp := range map[string]*fleet.Spec{
		"spec.max_price_per_hour": {GPU: []string{"A100"}},
		"spec.num_gpus":           {MaxPricePerHour: usd, NumGPUs: 100},
		"spec.providers":          {MaxPricePerHour: usd, Providers: []string{"nope"}},
		"spec.billing":            {MaxPricePerHour: usd, Billing: "monthly"},
		"spec.hours":              {MaxPricePerHour: usd, Billing: "prepaid"},
		"spec.min_reliability":    {MaxPricePerHour: usd, MinReliability: 2},
	} {
		_, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i"})
		if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || !strings.HasPrefix(gpuproxy.ErrorMessage(err), field+":") {
			t.Errorf("%s: %v", field, err)
		}
	}
	_, err = f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: spec4090(1), Provider: providers.VastAI, OfferID: "1", Image: "i"})
	if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || !strings.HasPrefix(gpuproxy.ErrorMessage(err), "spec:") {
		t.Errorf("both forms: %v", err)
	}
}

// TestRentBySpecStopsAtTheLimit: a window that cannot fit the cheapest
// offer refuses at the first attempt — 402 naming the window, one attempt
// recorded as over_limit, no provider create — instead of trying five.
func TestRentBySpecStopsAtTheLimit(t *testing.T) {
	w := newWorld(t, dbtest.SQLite, worldOpts{limits: []guardrails.Window{{Minutes: 60, Limit: usd / 100}}})
	_, err := w.fleets[0].Create(context.Background(), w.acct.ID, fleet.CreateRequest{Spec: spec4090(50), Image: "i"})
	if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
		t.Fatalf("want 402: %v", err)
	}
	atts, _ := gpuproxy.ErrorDetails(err)["attempts"].([]map[string]any)
	if len(atts) != 1 || atts[0]["outcome"] != "over_limit" {
		t.Fatalf("attempts: %v", gpuproxy.ErrorDetails(err))
	}
	if n := creates(w); n != 0 {
		t.Fatalf("%d creates sent", n)
	}
}

// TestCreateCallsAreIdempotent: with an Idempotency-Key, a retry of a rent
// by spec returns the instance the first call rented and rents nothing
// more; a retry of a failed call, by spec or by offer, answers the same
// code and message; the key with another request is refused.
func TestCreateCallsAreIdempotent(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{replicas: 2})
			ctx := context.Background()
			failCreates(w, 1)
			req := fleet.CreateRequest{Spec: spec4090(50), Image: "i", IdempotencyKey: "spec-1"}
			first, err := w.fleets[0].Create(ctx, w.acct.ID, req)
			if err != nil || len(first.Attempts) != 2 {
				t.Fatalf("first: %+v %v", first, err)
			}
			again, err := w.fleets[1].Create(ctx, w.acct.ID, req)
			if err != nil || again.ID != first.ID || len(again.Attempts) != 2 {
				t.Fatalf("retry: %+v %v", again, err)
			}
			if n := creates(w); n != 2 {
				t.Fatalf("creates sent: %d, want 2 (one gone, one rented)", n)
			}
			other := req
			other.Image = "j"
			if _, err := w.fleets[0].Create(ctx, w.acct.ID, other); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT ||
				!strings.Contains(gpuproxy.ErrorMessage(err), "different create") {
				t.Fatalf("key reused: %v", err)
			}
			// A failed spec call: the retry answers the same, even once an
			// offer would match.
			miss := fleet.CreateRequest{Spec: spec4090(0.01), Image: "i", IdempotencyKey: "spec-2"}
			_, err1 := w.fleets[0].Create(ctx, w.acct.ID, miss)
			_, err2 := w.fleets[1].Create(ctx, w.acct.ID, miss)
			if gpuproxy.ErrorCode(err1) != gpuproxy.ENOMATCH || gpuproxy.ErrorCode(err2) != gpuproxy.ENOMATCH ||
				gpuproxy.ErrorMessage(err1) != gpuproxy.ErrorMessage(err2) {
				t.Fatalf("failed call retried: %v / %v", err1, err2)
			}
			// A create of one offer that failed because it was gone: its
			// retry is the same offer_gone, not another provider error.
			o := w.offer(providers.VastAI, 50)
			failCreates(w, 1)
			byOffer := fleet.CreateRequest{Provider: providers.VastAI, OfferID: o.ID, Image: "i", IdempotencyKey: "offer-1"}
			_, err1 = w.fleets[0].Create(ctx, w.acct.ID, byOffer)
			_, err2 = w.fleets[1].Create(ctx, w.acct.ID, byOffer)
			if gpuproxy.ErrorCode(err1) != gpuproxy.EGONE || gpuproxy.ErrorCode(err2) != gpuproxy.EGONE ||
				gpuproxy.ErrorMessage(err1) != gpuproxy.ErrorMessage(err2) {
				t.Fatalf("failed offer create retried: %v / %v", err1, err2)
			}
		})
	}
}

// TestInvalidCreateSavesNoResult: a keyed create refused as bad input
// before anything ran (an offer id that is no id) saves nothing under its
// key, as Stripe's rule says: the same key with the fix rents, and its
// retry answers that instance.
func TestInvalidCreateSavesNoResult(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{replicas: 2})
			ctx := context.Background()
			typo := fleet.CreateRequest{Provider: providers.VastAI, OfferID: "OFFER_ID", Image: "i", IdempotencyKey: "job-42"}
			if _, err := w.fleets[0].Create(ctx, w.acct.ID, typo); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
				t.Fatalf("typo: want 400, got %v", err)
			}
			fixed := typo
			fixed.OfferID = w.offer(providers.VastAI, 50).ID
			inst, err := w.fleets[1].Create(ctx, w.acct.ID, fixed)
			if err != nil || inst.Status == gpuproxy.Failed {
				t.Fatalf("the fix with the same key: %+v %v", inst, err)
			}
			again, err := w.fleets[0].Create(ctx, w.acct.ID, fixed)
			if err != nil || again.ID != inst.ID {
				t.Fatalf("retry of the fix: %+v %v", again, err)
			}
			if _, err := w.fleets[0].Create(ctx, w.acct.ID, typo); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
				t.Fatalf("the typo again, once the key rented: want 409, got %v", err)
			}
			if n := creates(w); n != 1 {
				t.Fatalf("creates sent: %d, want 1", n)
			}
		})
	}
}

// TestFailedAttemptsAreNotListed: a rent by spec whose first offer was
// gone leaves that attempt's failed row, which the default list leaves
// out (the rented instance carries both attempts); status=failed lists
// it.
func TestFailedAttemptsAreNotListed(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{})
			ctx := context.Background()
			f := w.fleets[0]
			failCreates(w, 1)
			inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: spec4090(50), Image: "i"})
			if err != nil || len(inst.Attempts) != 2 {
				t.Fatalf("create: %+v %v", inst, err)
			}
			all, err := f.List(ctx, w.acct.ID, "")
			if err != nil || len(all) != 1 || all[0].ID != inst.ID || len(all[0].Attempts) != 2 {
				t.Fatalf("default list: %d rows %+v %v", len(all), all, err)
			}
			failed, err := f.List(ctx, w.acct.ID, string(gpuproxy.Failed))
			if err != nil || len(failed) != 1 || failed[0].ID == inst.ID || failed[0].PricePerHour == 0 {
				t.Fatalf("status=failed: %+v %v", failed, err)
			}
		})
	}
}

// TestRacingRentsBySpec: many callers on two replicas rent by spec at once
// under a limit that fits only some: no offer is rented twice, the window
// is never passed, and every refusal is a 402 or a no_matching_offer.
func TestRacingRentsBySpec(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			limit := gpuproxy.Micros(4 * usd)
			w := newWorld(t, k, worldOpts{replicas: 2, limits: []guardrails.Window{{Minutes: 60, Limit: limit}}})
			ctx := context.Background()
			const callers = 12
			var wg sync.WaitGroup
			insts := make([]gpuproxy.Instance, callers)
			errs := make([]error, callers)
			for i := range callers {
				wg.Go(func() {
					sp := &fleet.Spec{MaxPricePerHour: 2 * usd, Providers: []string{providers.VastAI}}
					insts[i], errs[i] = w.fleets[i%2].Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i",
						IdempotencyKey: fmt.Sprintf("race-%d", i)})
				})
			}
			wg.Wait()
			offers := map[string]bool{}
			var total gpuproxy.Micros
			rented := 0
			for i := range callers {
				if errs[i] != nil {
					if c := gpuproxy.ErrorCode(errs[i]); c != gpuproxy.ELIMIT && c != gpuproxy.ENOMATCH {
						t.Fatalf("caller %d: %v", i, errs[i])
					}
					continue
				}
				rented++
				if offers[insts[i].OfferID] {
					t.Fatalf("offer %s rented twice", insts[i].OfferID)
				}
				offers[insts[i].OfferID] = true
				total += insts[i].PricePerHour
			}
			if rented == 0 || total > limit {
				t.Fatalf("rented %d for $%s/h against a $%s limit", rented, total, limit)
			}
			if n := len(w.vast.Instances()); n != rented {
				t.Fatalf("simulator has %d instances, we rented %d", n, rented)
			}
		})
	}
}

// TestInterruptedCreateCalls: a keyed rent by spec whose replica died
// before recording anything is, once it has shown no progress for longer
// than an attempt takes, run afresh by a retry (it rented nothing); one
// that failed after the provider created the instance is answered, on
// retry, with that instance — never a second rental.
func TestInterruptedCreateCalls(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			w := newWorld(t, k, worldOpts{})
			ctx := context.Background()
			st := w.stores[0]
			req := fleet.CreateRequest{Spec: spec4090(50), Image: "i", IdempotencyKey: "dead-1"}
			// A run begun ten minutes ago that never came back.
			if _, fresh, err := st.BeginCreateCall(ctx, gpuproxy.CreateCall{AccountID: w.acct.ID, Key: req.IdempotencyKey,
				Fingerprint: req.Fingerprint(), CreatedAt: time.Now().Add(-10 * time.Minute)}); err != nil || !fresh {
				t.Fatalf("begin: %v", err)
			}
			inst, err := w.fleets[0].Create(ctx, w.acct.ID, req)
			if err != nil || inst.Status == gpuproxy.Failed || len(inst.Attempts) == 0 {
				t.Fatalf("retry of a dead run: %+v %v", inst, err)
			}
			again, err := w.fleets[0].Create(ctx, w.acct.ID, req)
			if err != nil || again.ID != inst.ID {
				t.Fatalf("second retry: %+v %v", again, err)
			}
			// A run that is recent still counts as running.
			busy := fleet.CreateRequest{Spec: spec4090(50), Image: "i", IdempotencyKey: "busy-1"}
			if _, _, err := st.BeginCreateCall(ctx, gpuproxy.CreateCall{AccountID: w.acct.ID, Key: busy.IdempotencyKey,
				Fingerprint: busy.Fingerprint(), CreatedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if _, err := w.fleets[0].Create(ctx, w.acct.ID, busy); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT ||
				gpuproxy.ErrorDetails(err)["retry_after_seconds"] == nil {
				t.Fatalf("retry of a running call: %v", err)
			}
			// A failure after the provider created the instance (as if our
			// database went away as we recorded it).
			crashy := fleet.New(st, w.guards[0], []providers.Provider{w.vastP[0]}, fleet.Options{Logger: quiet,
				OfferCacheTTL: -1, AfterProviderCreate: func(gpuproxy.Instance, string) error {
					return errors.New("connection reset")
				}})
			before := len(w.vast.Instances())
			crash := fleet.CreateRequest{Spec: spec4090(50), Image: "i", IdempotencyKey: "crash-1"}
			if _, err := crashy.Create(ctx, w.acct.ID, crash); err == nil {
				t.Fatal("the fault hook did not fail the create")
			}
			got, err := w.fleets[0].Create(ctx, w.acct.ID, crash)
			if err != nil || got.Status != gpuproxy.Pending {
				t.Fatalf("retry after the failure: %+v %v", got, err)
			}
			if n := len(w.vast.Instances()); n != before+1 {
				t.Fatalf("rented %d instances for one call", n-before)
			}
		})
	}
}

// outcomes lists the outcomes of an instance's attempts.
func outcomes(attempts []gpuproxy.RentAttempt) string {
	var out []string
	for _, a := range attempts {
		out = append(out, string(a.Outcome))
	}
	return strings.Join(out, " ")
}

// TestReplayAfterRestartKeepsAttempts: a keyed rent by spec whose first
// offer is gone rents the second, and its replica loses the database (or
// dies) right after the provider created the instance; the reconciler
// adopts the row. A replay of the call, whether the first run recorded
// its outcome or died with the call still running, answers the rented
// instance with the attempts the first answer would have listed — the
// offer gone, then the one rented — not only those before the rented one.
func TestReplayAfterRestartKeepsAttempts(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			clock := teststack.NewClock(time.Now())
			w := newWorld(t, k, worldOpts{fleetOpts: fleet.Options{Now: clock.Now}})
			ctx := context.Background()
			st := w.stores[0]
			anyGPU := &fleet.Spec{MaxPricePerHour: 50 * usd, Providers: []string{providers.VastAI}}
			cut := make(chan struct{})
			t.Cleanup(func() {
				select {
				case <-cut:
				default:
					close(cut)
				}
			})
			crashy := func(hook func(gpuproxy.Instance, string) error) *fleet.Service {
				return fleet.New(st, w.guards[0], []providers.Provider{w.vastP[0]}, fleet.Options{Logger: quiet, Now: clock.Now,
					OfferCacheTTL: -1, AfterProviderCreate: hook})
			}
			replay := func(req fleet.CreateRequest) {
				t.Helper()
				if _, err := w.fleets[0].Reconcile(ctx); err != nil {
					t.Fatal(err)
				}
				// A restarted replica answers the retry.
				got, err := crashy(nil).Create(ctx, w.acct.ID, req)
				if err != nil || got.Status == gpuproxy.Pending || got.Status == gpuproxy.Failed {
					t.Fatalf("replay: %+v %v", got, err)
				}
				if o := outcomes(got.Attempts); o != "offer_gone rented" {
					t.Fatalf("replay answered attempts %q, want \"offer_gone rented\"", o)
				}
				last := got.Attempts[len(got.Attempts)-1]
				if last.OfferID != got.OfferID || last.Provider != got.Provider || last.PricePerHour != got.PricePerHour {
					t.Fatalf("the rented attempt %+v is not the instance's offer %s", last, got.OfferID)
				}
			}

			// The first run records its outcome (the instance rented) but
			// answers an error: its database went away as it recorded the
			// provider id.
			failCreates(w, 1)
			req := fleet.CreateRequest{Spec: anyGPU, Image: "i", IdempotencyKey: "cut-1"}
			if _, err := crashy(func(gpuproxy.Instance, string) error { return errors.New("connection reset") }).
				Create(ctx, w.acct.ID, req); err == nil {
				t.Fatal("the fault hook did not fail the create")
			}
			replay(req)

			// The first run dies mid-rent, its call still running: a
			// retry after the call went quiet answers what it rented.
			failCreates(w, 1)
			req = fleet.CreateRequest{Spec: anyGPU, Image: "i", IdempotencyKey: "cut-2"}
			entered := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := crashy(func(gpuproxy.Instance, string) error {
					close(entered)
					<-cut
					return errors.New("the replica died")
				}).Create(ctx, w.acct.ID, req)
				done <- err
			}()
			select {
			case <-entered:
			case err := <-done:
				t.Fatalf("the run ended before its provider create: %v", err)
			}
			clock.Add(10 * time.Minute)
			replay(req)
			close(cut)
			<-done
		})
	}
}

// risingQuote is vast.ai whose live price for one offer rose after the
// search: its quote answers price instead.
type risingQuote struct {
	providers.Provider
	offerID string
	price   gpuproxy.Micros
}

func (r *risingQuote) Quote(ctx context.Context, offerID string, hours int) (providers.Quote, error) {
	q, err := r.Provider.Quote(ctx, offerID, hours)
	if err == nil && offerID == r.offerID {
		q.PricePerHour = r.price
	}
	return q, err
}

// TestRentBySpecStopsWhenAdmissionRefuses: the pre-check fits the
// cheapest offer at its searched price, but its live quote rose and the
// real admission refuses it: the rent answers 402 with that one attempt,
// over_limit, and stops — it does not go on to the next offer, which
// would fit — and nothing is created at the provider.
func TestRentBySpecStopsWhenAdmissionRefuses(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			base := vastaisim.DefaultCatalog()[0]
			var cat []vastaisim.Offer
			for i, price := range []float64{1.0, 1.2} {
				o := base
				o.ID, o.AskContractID, o.MachineID = int64(910000+i), int64(910000+i), int64(710000+i)
				o.DPHTotal, o.DPHBase, o.StorageCost = price, price, 0
				cat = append(cat, o)
			}
			w := newWorld(t, k, worldOpts{catalog: cat, limits: []guardrails.Window{{Minutes: 60, Limit: usd * 3 / 2}}})
			ctx := context.Background()
			rising := &risingQuote{Provider: w.vastP[0], offerID: "910000", price: 2 * usd}
			f := fleet.New(w.stores[0], w.guards[0], []providers.Provider{rising}, fleet.Options{Logger: quiet, OfferCacheTTL: -1})
			sp := &fleet.Spec{MaxPricePerHour: 5 * usd, Providers: []string{providers.VastAI}}
			inst, err := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i", IdempotencyKey: "rising-1"})
			if gpuproxy.ErrorCode(err) != gpuproxy.ELIMIT {
				t.Fatalf("want 402 limit_exceeded, got %+v %v", inst, err)
			}
			atts, _ := gpuproxy.ErrorDetails(err)["attempts"].([]map[string]any)
			if len(atts) != 1 || atts[0]["outcome"] != "over_limit" || atts[0]["offer_id"] != "910000" ||
				atts[0]["price_per_hour"] != gpuproxy.Micros(2*usd) {
				t.Fatalf("attempts: %v", atts)
			}
			if n := creates(w); n != 0 {
				t.Fatalf("%d creates sent after the refusal", n)
			}
			insts, err := w.stores[0].Instances(ctx, w.acct.ID, "")
			if err != nil || len(insts) != 0 {
				t.Fatalf("rows left: %+v %v", insts, err)
			}
			// The replay answers the same refusal.
			if _, again := f.Create(ctx, w.acct.ID, fleet.CreateRequest{Spec: sp, Image: "i", IdempotencyKey: "rising-1"}); gpuproxy.ErrorCode(again) != gpuproxy.ELIMIT {
				t.Fatalf("replay: %v", again)
			}
		})
	}
}
