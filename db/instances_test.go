package db_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
)

// The fleet's store needs, the kill switch's included, are checked at
// compile time.
var _ fleet.Store = (*db.Store)(nil)

func admitReq(acct int64, cost gpuproxy.Micros, now time.Time) guardrails.AdmitRequest {
	return guardrails.AdmitRequest{AccountID: acct, Cost: cost, Now: now, Horizon: time.Hour,
		Defaults: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}, {Minutes: 1440, Limit: 1000 * usd}}}
}

func newInstance(id, key string, billingKind string, price gpuproxy.Micros) gpuproxy.Instance {
	in := gpuproxy.Instance{ID: id, Provider: "vast.ai", OfferID: "o-" + id, GPUName: "RTX 4090", NumGPUs: 2,
		PricePerHour: price, Billing: billingKind, Image: "vllm/vllm-openai", Label: "lbl", IdempotencyKey: key}
	if billingKind == "prepaid" {
		in.Provider, in.Hours, in.PrepaidTotal = "io.net", 2, 2*price
	}
	return in
}

// mustAdmitInstance admits an instance that must be admitted and new.
func mustAdmitInstance(t *testing.T, s *db.Store, acct int64, cost gpuproxy.Micros, in gpuproxy.Instance, now time.Time) gpuproxy.Instance {
	t.Helper()
	res, out, existing, err := s.AdmitInstance(context.Background(), admitReq(acct, cost, now), in)
	if err != nil || !res.Admitted || existing || res.HoldID == 0 {
		t.Fatalf("AdmitInstance(%s) = %+v, existing=%v, err=%v", in.ID, res, existing, err)
	}
	return out
}

// wantHeld checks the account's held total, and that it equals its open holds.
func wantHeld(t *testing.T, s *db.Store, acct int64, want gpuproxy.Micros) {
	t.Helper()
	held, sum, err := s.HeldForTest(context.Background(), acct)
	if err != nil {
		t.Fatal(err)
	}
	if held != sum || gpuproxy.Micros(held) != want {
		t.Fatalf("held_micros %d, open holds %d, want %d", held, sum, want)
	}
}

func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if gpuproxy.ErrorCode(err) != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
}

func wantCost(t *testing.T, s *db.Store, acct int64, id string, want gpuproxy.Micros) {
	t.Helper()
	got, err := s.CostToDate(context.Background(), acct, id)
	if err != nil || got != want {
		t.Fatalf("CostToDate(%s) = %s, %v; want %s", id, got, err, want)
	}
	all, err := s.CostsToDate(context.Background(), acct)
	if err != nil || all[id] != want {
		t.Fatalf("CostsToDate[%s] = %s, %v; want %s", id, all[id], err, want)
	}
}

func TestAdmitInstanceIdempotent(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		b := mustAccount(t, s, "b")
		first := mustAdmitInstance(t, s, a.ID, 3*usd, newInstance("gpi_1", "key-1", "hourly", 3*usd), t0)
		if first.Status != gpuproxy.Pending || first.AccountID != a.ID || first.IdempotencyKey != "key-1" ||
			first.HoldID == 0 || !first.CreatedAt.Equal(t0) || !first.UpdatedAt.Equal(t0) ||
			first.NumGPUs != 2 || first.PricePerHour != 3*usd || first.GPUName != "RTX 4090" ||
			!first.StartedAt.IsZero() || !first.TerminatedAt.IsZero() {
			t.Fatalf("admitted instance = %+v", first)
		}
		got, err := s.Instance(ctx, a.ID, "gpi_1")
		if err != nil || !reflect.DeepEqual(got, first) {
			t.Fatalf("Instance = %+v, %v; want %+v", got, err, first)
		}
		wantHeld(t, s, a.ID, 3*usd)

		// A retry with the same key (a new id, another price) admits nothing.
		res, again, existing, err := s.AdmitInstance(ctx, admitReq(a.ID, 7*usd, t0.Add(time.Minute)),
			newInstance("gpi_2", "key-1", "hourly", 7*usd))
		if err != nil || !existing || !reflect.DeepEqual(again, first) || !res.Admitted || res.HoldID != first.HoldID {
			t.Fatalf("retry = %+v, %+v, existing=%v, err=%v", res, again, existing, err)
		}
		wantHeld(t, s, a.ID, 3*usd)
		holds, err := s.OpenHolds(ctx, a.ID)
		if err != nil || len(holds) != 1 || holds[first.HoldID] != 3*usd {
			t.Fatalf("open holds = %v, %v", holds, err)
		}
		if _, err := s.InstanceByID(ctx, "gpi_2"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("retry inserted a row: %v", err)
		}

		// Without a key every create is new; the same key on another account too.
		mustAdmitInstance(t, s, a.ID, usd, newInstance("gpi_3", "", "hourly", usd), t0)
		mustAdmitInstance(t, s, a.ID, usd, newInstance("gpi_4", "", "hourly", usd), t0)
		mustAdmitInstance(t, s, b.ID, usd, newInstance("gpi_5", "key-1", "hourly", usd), t0)
		wantHeld(t, s, a.ID, 5*usd)
		wantHeld(t, s, b.ID, usd)

		// Reusing an id under a new key is a conflict, and leaves no hold.
		_, _, _, err = s.AdmitInstance(ctx, admitReq(a.ID, usd, t0), newInstance("gpi_1", "key-2", "hourly", usd))
		wantCode(t, "duplicate id", err, gpuproxy.ECONFLICT)
		wantHeld(t, s, a.ID, 5*usd)
		// An instance naming another account than its admission is refused.
		in := newInstance("gpi_6", "", "hourly", usd)
		in.AccountID = b.ID
		_, _, _, err = s.AdmitInstance(ctx, admitReq(a.ID, usd, t0), in)
		wantCode(t, "mismatched account", err, gpuproxy.EINVALID)
		_, _, _, err = s.AdmitInstance(ctx, admitReq(9999, usd, t0), newInstance("gpi_7", "", "hourly", usd))
		wantCode(t, "unknown account", err, gpuproxy.ENOTFOUND)
	})
}

func TestAdmitInstanceRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "r")
		mustAdmitInstance(t, s, a.ID, 30*usd, newInstance("gpi_1", "k1", "hourly", 30*usd), t0)
		// 30 held + 20.000001 passes the 50/60 min window.
		res, out, existing, err := s.AdmitInstance(ctx, admitReq(a.ID, 20*usd+1, t0), newInstance("gpi_2", "k2", "hourly", 20*usd+1))
		if err != nil || res.Admitted || existing || res.HoldID != 0 || out.ID != "" {
			t.Fatalf("over the limit: %+v, %+v, existing=%v, err=%v", res, out, existing, err)
		}
		if len(res.Windows) != 2 || res.Windows[0].Held != 30*usd || res.Windows[0].Limit != 50*usd {
			t.Fatalf("refusal windows = %+v", res.Windows)
		}
		if _, err := s.InstanceByID(ctx, "gpi_2"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("refused admission inserted a row: %v", err)
		}
		all, err := s.Instances(ctx, a.ID, "")
		if err != nil || len(all) != 1 {
			t.Fatalf("instances = %+v, %v", all, err)
		}
		wantHeld(t, s, a.ID, 30*usd)
		// The refused key stays free: exactly the remainder fits under it.
		mustAdmitInstance(t, s, a.ID, 20*usd, newInstance("gpi_2", "k2", "hourly", 20*usd), t0)
		wantHeld(t, s, a.ID, 50*usd)
	})
}

func TestAdmitInstanceConcurrentDuplicates(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			rs := dbtest.Replicas(t, k, 4)
			ctx := context.Background()
			a := mustAccount(t, rs[0], "dup")
			const n = 20
			type result struct {
				out      gpuproxy.Instance
				existing bool
				err      error
			}
			results := make([]result, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, out, existing, err := rs[i%len(rs)].AdmitInstance(ctx, admitReq(a.ID, 2*usd, t0),
						newInstance(fmt.Sprintf("gpi_%d", i), "same-key", "hourly", 2*usd))
					results[i] = result{out, existing, err}
				}()
			}
			close(start)
			wg.Wait()
			created := 0
			for i, r := range results {
				if r.err != nil {
					t.Fatalf("caller %d: %v", i, r.err)
				}
				if !r.existing {
					created++
				}
				if r.out.ID != results[0].out.ID || r.out.HoldID != results[0].out.HoldID {
					t.Fatalf("caller %d got %s (hold %d), caller 0 got %s (hold %d)",
						i, r.out.ID, r.out.HoldID, results[0].out.ID, results[0].out.HoldID)
				}
			}
			if created != 1 {
				t.Fatalf("%d callers created an instance, want 1", created)
			}
			all, err := rs[0].Instances(ctx, a.ID, "")
			if err != nil || len(all) != 1 {
				t.Fatalf("instances = %d, %v; want 1", len(all), err)
			}
			holds, err := rs[0].OpenHolds(ctx, a.ID)
			if err != nil || len(holds) != 1 || holds[all[0].HoldID] != 2*usd {
				t.Fatalf("open holds = %v, %v; want one of $2 (hold %d)", holds, err, all[0].HoldID)
			}
			wantHeld(t, rs[0], a.ID, 2*usd)
		})
	}
}

func TestInstanceLifecycleHourly(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "h")
		in := mustAdmitInstance(t, s, a.ID, 3*usd, newInstance("gpi_h", "k", "hourly", 3*usd), t0)
		id := in.ID

		// Running needs a provider id first.
		_, err := s.MarkRunning(ctx, id, "http://x", t0, &billing.Meter{PricePerHour: 3 * usd})
		wantCode(t, "running while pending without provider id", err, gpuproxy.ECONFLICT)

		t1 := t0.Add(10 * time.Second)
		in, err = s.MarkStarting(ctx, id, "v-100", nil, t1)
		if err != nil || in.Status != gpuproxy.Starting || in.ProviderInstanceID != "v-100" || !in.UpdatedAt.Equal(t1) {
			t.Fatalf("MarkStarting = %+v, %v", in, err)
		}
		wantHeld(t, s, a.ID, 3*usd) // an hourly hold stays until running
		again, err := s.MarkStarting(ctx, id, "v-100", nil, t1.Add(time.Minute))
		if err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("repeated MarkStarting = %+v, %v", again, err)
		}
		_, err = s.MarkStarting(ctx, id, "v-999", nil, t1)
		wantCode(t, "MarkStarting with another provider id", err, gpuproxy.ECONFLICT)
		if got, err := s.InstanceByProviderID(ctx, a.ID, "vast.ai", "v-100"); err != nil || got.ID != id {
			t.Fatalf("InstanceByProviderID = %+v, %v", got, err)
		}
		if _, err := s.InstanceByProviderID(ctx, a.ID, "io.net", "v-100"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("other provider: %v", err)
		}

		// A meter for another instance is refused, and nothing changes.
		_, err = s.MarkRunning(ctx, id, "http://x", t1, &billing.Meter{ID: "other", PricePerHour: 3 * usd})
		wantCode(t, "foreign meter", err, gpuproxy.EINVALID)
		wantHeld(t, s, a.ID, 3*usd)

		started := t0.Add(90*time.Second + 123*time.Microsecond)
		in, err = s.MarkRunning(ctx, id, "http://10.0.0.1:8000", started, &billing.Meter{PricePerHour: 3 * usd})
		if err != nil || in.Status != gpuproxy.Running || in.Endpoint != "http://10.0.0.1:8000" || !in.StartedAt.Equal(started) {
			t.Fatalf("MarkRunning = %+v, %v", in, err)
		}
		wantHeld(t, s, a.ID, 0)
		m, err := s.Meter(ctx, id)
		if err != nil || !m.Start.Equal(started) || !m.ChargedUntil.Equal(started) || !m.Stop.IsZero() ||
			m.AccountID != a.ID || m.InstanceID != id || m.Provider != "vast.ai" || m.PricePerHour != 3*usd {
			t.Fatalf("meter = %+v, %v", m, err)
		}
		res := admit(t, s, a.ID, 0, started, false)
		if res.Burn != 3*usd || res.Held != 0 {
			t.Fatalf("after running: burn %s held %s", res.Burn, res.Held)
		}
		again, err = s.MarkRunning(ctx, id, "http://elsewhere", started.Add(time.Hour), &billing.Meter{PricePerHour: usd})
		if err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("repeated MarkRunning = %+v, %v", again, err)
		}
		_, err = s.MarkFailed(ctx, id, "late", started)
		wantCode(t, "MarkFailed while running", err, gpuproxy.ECONFLICT)
		_, err = s.MarkStarting(ctx, id, "v-100", nil, started)
		wantCode(t, "MarkStarting while running", err, gpuproxy.ECONFLICT)

		// Twenty minutes metered: $1.
		until, charged := billing.Due(m, started.Add(20*time.Minute))
		if err := s.RecordMeterCharge(ctx, m, until, charged, billing.Entry{AccountID: a.ID, Type: billing.Charge,
			Amount: charged, At: until, InstanceID: id, Basis: billing.Metered, IdempotencyKey: "meter:1"}); err != nil {
			t.Fatal(err)
		}
		wantCost(t, s, a.ID, id, usd)

		t4 := started.Add(25 * time.Minute)
		in, err = s.MarkTerminating(ctx, id, t4)
		if err != nil || in.Status != gpuproxy.Terminating || !in.UpdatedAt.Equal(t4) {
			t.Fatalf("MarkTerminating = %+v, %v", in, err)
		}
		if again, err := s.MarkTerminating(ctx, id, t4.Add(time.Minute)); err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("repeated MarkTerminating = %+v, %v", again, err)
		}
		_, err = s.MarkRunning(ctx, id, "http://x", t4, nil)
		wantCode(t, "MarkRunning while terminating", err, gpuproxy.ECONFLICT)

		at := started.Add(30*time.Minute + 7*time.Microsecond)
		in, err = s.MarkTerminated(ctx, id, at, nil)
		if err != nil || in.Status != gpuproxy.Terminated || !in.TerminatedAt.Equal(at) || in.Endpoint != "http://10.0.0.1:8000" {
			t.Fatalf("MarkTerminated = %+v, %v", in, err)
		}
		if m, err := s.Meter(ctx, id); err != nil || !m.Stop.Equal(at) {
			t.Fatalf("meter after terminate = %+v, %v; want stop %v", m, err, at)
		}
		if res := admit(t, s, a.ID, 0, at, false); res.Burn != 0 {
			t.Fatalf("burn after terminate = %s", res.Burn)
		}
		again, err = s.MarkTerminated(ctx, id, at.Add(time.Hour), nil)
		if err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("repeated MarkTerminated = %+v, %v", again, err)
		}
		if m, _ := s.Meter(ctx, id); !m.Stop.Equal(at) {
			t.Fatalf("meter stop moved to %v", m.Stop)
		}
		if again, err := s.MarkTerminating(ctx, id, at.Add(time.Hour)); err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("MarkTerminating after terminated = %+v, %v", again, err)
		}
		_, err = s.MarkRunning(ctx, id, "http://x", at, nil)
		wantCode(t, "MarkRunning while terminated", err, gpuproxy.ECONFLICT)
		wantHeld(t, s, a.ID, 0)
		wantCost(t, s, a.ID, id, usd)
	})
}

func TestInstanceLifecyclePrepaid(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "p")
		in := mustAdmitInstance(t, s, a.ID, 10*usd, newInstance("gpi_p", "k", "prepaid", 5*usd), t0)
		id := in.ID
		wantHeld(t, s, a.ID, 10*usd)
		chargeOf := func() *billing.Entry {
			return &billing.Entry{Type: billing.Charge, Amount: 10 * usd, Basis: billing.Prepaid,
				IdempotencyKey: "prepaid:" + id, Description: "2 h prepaid"}
		}
		// A charge naming another account is refused, and nothing changes.
		bad := chargeOf()
		bad.AccountID = a.ID + 1000
		_, err := s.MarkStarting(ctx, id, "io-1", bad, t0)
		wantCode(t, "foreign charge", err, gpuproxy.EINVALID)
		wantHeld(t, s, a.ID, 10*usd)
		wantCost(t, s, a.ID, id, 0)

		t1 := t0.Add(5 * time.Second)
		in, err = s.MarkStarting(ctx, id, "io-1", chargeOf(), t1)
		if err != nil || in.Status != gpuproxy.Starting {
			t.Fatalf("MarkStarting = %+v, %v", in, err)
		}
		wantHeld(t, s, a.ID, 0)
		wantCost(t, s, a.ID, id, 10*usd)
		if res := admit(t, s, a.ID, 0, t1, false); res.Windows[0].Spent != 10*usd {
			t.Fatalf("spent after prepaid charge = %s", res.Windows[0].Spent)
		}
		if _, err := s.MarkStarting(ctx, id, "io-1", chargeOf(), t1.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		es, err := s.ListEntries(ctx, billing.Filter{AccountID: a.ID, InstanceID: id})
		if err != nil || len(es) != 1 || es[0].Amount != 10*usd || !es[0].At.Equal(t1) || es[0].Provider != "io.net" {
			t.Fatalf("ledger after MarkStarting twice = %+v, %v", es, err)
		}

		// Prepaid: no meter.
		started := t1.Add(time.Minute)
		in, err = s.MarkRunning(ctx, id, "https://io-1.example", started, nil)
		if err != nil || in.Status != gpuproxy.Running || !in.StartedAt.Equal(started) {
			t.Fatalf("MarkRunning = %+v, %v", in, err)
		}
		if _, err := s.Meter(ctx, id); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("prepaid instance got a meter: %v", err)
		}

		at := started.Add(30 * time.Minute)
		refund := &billing.Entry{Type: billing.Refund, Amount: 7 * usd, Basis: billing.Provider, IdempotencyKey: "refund:io-1"}
		in, err = s.MarkTerminated(ctx, id, at, refund)
		if err != nil || in.Status != gpuproxy.Terminated || !in.TerminatedAt.Equal(at) {
			t.Fatalf("MarkTerminated = %+v, %v", in, err)
		}
		wantCost(t, s, a.ID, id, 3*usd)
		if _, err := s.MarkTerminated(ctx, id, at.Add(time.Minute), refund); err != nil {
			t.Fatal(err)
		}
		wantCost(t, s, a.ID, id, 3*usd)
		tot, err := s.Totals(ctx, billing.Filter{AccountID: a.ID, InstanceID: id, Type: billing.Refund})
		if err != nil || tot.Count != 1 || tot.Refunds != 7*usd {
			t.Fatalf("refund totals = %+v, %v", tot, err)
		}
		es, _ = s.ListEntries(ctx, billing.Filter{AccountID: a.ID, InstanceID: id, Type: billing.Refund})
		if len(es) != 1 || !es[0].At.Equal(at) {
			t.Fatalf("refund entries = %+v", es)
		}
		// A refund without a key is still once-only.
		in2 := mustAdmitInstance(t, s, a.ID, 10*usd, newInstance("gpi_p2", "", "prepaid", 5*usd), at)
		for range 2 {
			if _, err := s.MarkTerminated(ctx, in2.ID, at, &billing.Entry{Type: billing.Refund, Amount: usd,
				Basis: billing.Provider}); err != nil {
				t.Fatal(err)
			}
		}
		wantCost(t, s, a.ID, in2.ID, -usd)
		wantHeld(t, s, a.ID, 0)
	})
}

func TestInstanceFailure(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "f")

		// pending → failed releases the hold, once.
		in := mustAdmitInstance(t, s, a.ID, 4*usd, newInstance("gpi_f1", "k1", "hourly", 4*usd), t0)
		wantHeld(t, s, a.ID, 4*usd)
		t1 := t0.Add(time.Second)
		in, err := s.MarkFailed(ctx, in.ID, "offer gone", t1)
		if err != nil || in.Status != gpuproxy.Failed || in.Error != "offer gone" || !in.UpdatedAt.Equal(t1) {
			t.Fatalf("MarkFailed = %+v, %v", in, err)
		}
		wantHeld(t, s, a.ID, 0)
		if again, err := s.MarkFailed(ctx, in.ID, "other", t1.Add(time.Minute)); err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("repeated MarkFailed = %+v, %v", again, err)
		}
		_, err = s.MarkStarting(ctx, in.ID, "v-1", nil, t1)
		wantCode(t, "MarkStarting while failed", err, gpuproxy.ECONFLICT)
		_, err = s.MarkRunning(ctx, in.ID, "http://x", t1, nil)
		wantCode(t, "MarkRunning while failed", err, gpuproxy.ECONFLICT)
		if got, err := s.MarkTerminating(ctx, in.ID, t1); err != nil || !reflect.DeepEqual(got, in) {
			t.Fatalf("MarkTerminating on failed = %+v, %v", got, err)
		}
		if got, err := s.MarkTerminated(ctx, in.ID, t1, nil); err != nil || !reflect.DeepEqual(got, in) {
			t.Fatalf("MarkTerminated on failed = %+v, %v", got, err)
		}

		// starting → failed also releases.
		in = mustAdmitInstance(t, s, a.ID, 4*usd, newInstance("gpi_f2", "k2", "hourly", 4*usd), t0)
		if _, err := s.MarkStarting(ctx, in.ID, "v-2", nil, t1); err != nil {
			t.Fatal(err)
		}
		if in, err = s.MarkFailed(ctx, in.ID, "never came up", t1); err != nil || in.Status != gpuproxy.Failed {
			t.Fatalf("MarkFailed from starting = %+v, %v", in, err)
		}
		wantHeld(t, s, a.ID, 0)

		// An ambiguous create left pending with a provider id can run.
		in = mustAdmitInstance(t, s, a.ID, 4*usd, newInstance("gpi_f3", "k3", "hourly", 4*usd), t0)
		if err := s.ExecForTest(ctx, "UPDATE instances SET provider_instance_id = 'v-3' WHERE id = 'gpi_f3'"); err != nil {
			t.Fatal(err)
		}
		if in, err = s.MarkRunning(ctx, in.ID, "http://x", t1, &billing.Meter{PricePerHour: 4 * usd}); err != nil ||
			in.Status != gpuproxy.Running {
			t.Fatalf("MarkRunning from pending with provider id = %+v, %v", in, err)
		}
		wantHeld(t, s, a.ID, 0)

		// A pending instance terminated (the reconciler found it gone)
		// releases its hold.
		in = mustAdmitInstance(t, s, a.ID, 4*usd, newInstance("gpi_f4", "k4", "hourly", 4*usd), t0)
		wantHeld(t, s, a.ID, 4*usd)
		if in, err = s.MarkTerminated(ctx, in.ID, t1, nil); err != nil || in.Status != gpuproxy.Terminated {
			t.Fatalf("MarkTerminated from pending = %+v, %v", in, err)
		}
		wantHeld(t, s, a.ID, 0)

		for name, f := range map[string]func() error{
			"MarkStarting":    func() error { _, err := s.MarkStarting(ctx, "nope", "v", nil, t1); return err },
			"MarkRunning":     func() error { _, err := s.MarkRunning(ctx, "nope", "", t1, nil); return err },
			"MarkFailed":      func() error { _, err := s.MarkFailed(ctx, "nope", "", t1); return err },
			"MarkTerminating": func() error { _, err := s.MarkTerminating(ctx, "nope", t1); return err },
			"MarkTerminated":  func() error { _, err := s.MarkTerminated(ctx, "nope", t1, nil); return err },
		} {
			err := f()
			wantCode(t, name+" of an unknown instance", err, gpuproxy.ENOTFOUND)
			if !strings.Contains(gpuproxy.ErrorMessage(err), `instance "nope" not found`) {
				t.Fatalf("%s: message %q", name, gpuproxy.ErrorMessage(err))
			}
		}
	})
}

func TestInstancesTenantIsolation(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "a")
		b := mustAccount(t, s, "b")
		for i := range 3 {
			mustAdmitInstance(t, s, a.ID, usd, newInstance(fmt.Sprintf("gpi_a%d", i), "", "hourly", usd), t0.Add(time.Duration(i)*time.Minute))
		}
		mustAdmitInstance(t, s, b.ID, usd, newInstance("gpi_b0", "", "hourly", usd), t0.Add(30*time.Second))
		if _, err := s.MarkStarting(ctx, "gpi_a1", "v-a1", nil, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkStarting(ctx, "gpi_b0", "v-b0", nil, t0); err != nil {
			t.Fatal(err)
		}

		if _, err := s.Instance(ctx, b.ID, "gpi_a0"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("account b read a's instance: %v", err)
		}
		if _, err := s.InstanceByProviderID(ctx, b.ID, "vast.ai", "v-a1"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("account b found a's provider id: %v", err)
		}
		if got, err := s.InstanceByID(ctx, "gpi_a0"); err != nil || got.AccountID != a.ID {
			t.Fatalf("InstanceByID = %+v, %v", got, err)
		}

		ids := func(is []gpuproxy.Instance) string {
			var out []string
			for _, in := range is {
				out = append(out, in.ID)
			}
			return strings.Join(out, ",")
		}
		all, err := s.Instances(ctx, a.ID, "")
		if err != nil || ids(all) != "gpi_a2,gpi_a1,gpi_a0" {
			t.Fatalf("Instances(a) = %s, %v", ids(all), err)
		}
		pending, err := s.Instances(ctx, a.ID, gpuproxy.Pending)
		if err != nil || ids(pending) != "gpi_a2,gpi_a0" {
			t.Fatalf("Instances(a, pending) = %s, %v", ids(pending), err)
		}
		bs, err := s.Instances(ctx, b.ID, "")
		if err != nil || ids(bs) != "gpi_b0" {
			t.Fatalf("Instances(b) = %s, %v", ids(bs), err)
		}
		live, err := s.InstancesInStatus(ctx, gpuproxy.Pending, gpuproxy.Starting)
		if err != nil || ids(live) != "gpi_a0,gpi_b0,gpi_a1,gpi_a2" {
			t.Fatalf("InstancesInStatus(pending, starting) = %s, %v", ids(live), err)
		}
		starting, err := s.InstancesInStatus(ctx, gpuproxy.Starting)
		if err != nil || ids(starting) != "gpi_b0,gpi_a1" {
			t.Fatalf("InstancesInStatus(starting) = %s, %v", ids(starting), err)
		}
		if none, err := s.InstancesInStatus(ctx); err != nil || len(none) != 0 {
			t.Fatalf("InstancesInStatus() = %s, %v", ids(none), err)
		}

		// Cost to date counts only the account's own entries for the instance.
		for _, e := range []billing.Entry{
			{AccountID: a.ID, Type: billing.Charge, Amount: 5 * usd, InstanceID: "gpi_a0"},
			{AccountID: a.ID, Type: billing.Adjustment, Amount: 2 * usd, InstanceID: "gpi_a0"},
			{AccountID: a.ID, Type: billing.Refund, Amount: 1 * usd, InstanceID: "gpi_a0"},
			{AccountID: a.ID, Type: billing.Credit, Amount: 100 * usd, InstanceID: "gpi_a0"},
			{AccountID: a.ID, Type: billing.Charge, Amount: 9 * usd, InstanceID: "gpi_a1"},
			{AccountID: b.ID, Type: billing.Charge, Amount: 50 * usd, InstanceID: "gpi_a0"},
		} {
			e.At, e.Basis = t0, billing.Manual
			if _, _, err := s.AppendEntry(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		wantCost(t, s, a.ID, "gpi_a0", 6*usd)
		wantCost(t, s, a.ID, "gpi_a1", 9*usd)
		wantCost(t, s, a.ID, "gpi_a2", 0)
	})
}

// TestCostToDateLeavesProxyChargesOut: what an instance cost is its own
// ledger entries, not the proxy's charges for requests to it (lease
// charges and their amends): the reconciler's truth-up compares it with
// the provider's bill, which knows nothing of them.
func TestCostToDateLeavesProxyChargesOut(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			s := dbtest.Open(t, k)
			ctx := context.Background()
			a, err := s.CreateAccount(ctx, "acme", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			l := billing.NewLedger(s, nil)
			now := time.Now()
			for _, e := range []billing.Entry{
				{Type: billing.Charge, Amount: 1_000_000, IdempotencyKey: "meter:gpi_c:1", Description: "GPU time"},
				{Type: billing.Charge, Amount: 300_000, IdempotencyKey: "lease:7:gpi_c", Description: "proxy requests: 3", ByCaller: true},
				{Type: billing.Refund, Amount: 50_000, IdempotencyKey: "lease:7:amend:r1:refund", ByCaller: true},
				{Type: billing.Adjustment, Amount: 20_000, IdempotencyKey: "truthup:gpi_c:1020000", Description: "provider"},
			} {
				e.AccountID, e.InstanceID, e.At, e.Basis = a.ID, "gpi_c", now, billing.Metered
				if _, err := l.Append(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			wantCost(t, s, a.ID, "gpi_c", 1_020_000)
		})
	}
}
