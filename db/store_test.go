package db_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

const usd = gpuproxy.MicrosPerUSD

// eachStore runs fn as a subtest against SQLite and Postgres.
func eachStore(t *testing.T, fn func(t *testing.T, s *db.Store)) {
	t.Helper()
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			fn(t, dbtest.Open(t, k))
		})
	}
}

func mustAccount(t *testing.T, s *db.Store, name string) gpuproxy.Account {
	t.Helper()
	a, err := s.CreateAccount(context.Background(), name, t0)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func charge(t *testing.T, s *db.Store, acct int64, typ billing.Type, amount gpuproxy.Micros, at time.Time) {
	t.Helper()
	if _, _, err := s.AppendEntry(context.Background(), billing.Entry{AccountID: acct, Type: typ, Amount: amount,
		At: at, Basis: billing.Manual}); err != nil {
		t.Fatal(err)
	}
}

func TestAccountsAndKeys(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "acme")
		if _, err := s.CreateAccount(ctx, "acme", t0); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("duplicate account: got %v, want conflict", err)
		}
		got, err := s.AccountByName(ctx, "acme")
		if err != nil || got.ID != a.ID || got.OnExceed != "block" {
			t.Fatalf("AccountByName = %+v, %v", got, err)
		}
		if _, err := s.AccountByName(ctx, "nope"); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("missing account: %v", err)
		}
		k := gpuproxy.APIKey{ID: "k1", AccountID: a.ID, Name: "ci", Hash: "h", CreatedAt: t0,
			Scopes: []gpuproxy.Scope{gpuproxy.ScopeBillingRead, gpuproxy.ScopeSpendingRead}}
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		kk, err := s.KeyByID(ctx, "k1")
		if err != nil || kk.AccountName != "acme" || len(kk.Scopes) != 2 || !kk.RevokedAt.IsZero() {
			t.Fatalf("KeyByID = %+v, %v", kk, err)
		}
		other := mustAccount(t, s, "other")
		if err := s.RevokeKey(ctx, other.ID, "k1", t0); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("revoking another account's key: %v", err)
		}
		if err := s.RevokeKey(ctx, a.ID, "k1", t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		kk, _ = s.KeyByID(ctx, "k1")
		if !kk.RevokedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("revoked_at = %v", kk.RevokedAt)
		}
		ks, err := s.ListKeys(ctx, a.ID)
		if err != nil || len(ks) != 1 {
			t.Fatalf("ListKeys = %v, %v", ks, err)
		}
	})
}

func admit(t *testing.T, s *db.Store, acct int64, cost gpuproxy.Micros, now time.Time, hold bool) guardrails.AdmitResult {
	t.Helper()
	res, err := s.Admit(context.Background(), guardrails.AdmitRequest{AccountID: acct, Cost: cost, Now: now,
		Horizon: time.Hour, Defaults: []guardrails.Window{{Minutes: 60, Limit: 50 * usd}, {Minutes: 1440, Limit: 1000 * usd}},
		Hold: hold, Ref: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestWindowArithmetic(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "w")
		now := t0.Add(30 * time.Second) // mid-minute, so edge minutes are partial
		// Exactly at now-60m: outside the 60-minute window (t−W, t], inside 1440.
		charge(t, s, a.ID, billing.Charge, 1*usd, now.Add(-60*time.Minute))
		// One microsecond later: inside.
		charge(t, s, a.ID, billing.Charge, 2*usd, now.Add(-60*time.Minute+time.Microsecond))
		// Whole minutes in the middle.
		charge(t, s, a.ID, billing.Charge, 4*usd, now.Add(-30*time.Minute))
		charge(t, s, a.ID, billing.Refund, 1*usd, now.Add(-29*time.Minute))
		// Exactly now: inside; one microsecond in the future: counted too
		// (a row dated after the clock is spent in every window).
		charge(t, s, a.ID, billing.Charge, 8*usd, now)
		charge(t, s, a.ID, billing.Charge, 16*usd, now.Add(time.Microsecond))
		// Credits never count as spend; adjustments do.
		charge(t, s, a.ID, billing.Credit, 500*usd, now.Add(-time.Minute))
		charge(t, s, a.ID, billing.Adjustment, 32*usd, now.Add(-2*time.Hour))
		// Older than a day.
		charge(t, s, a.ID, billing.Charge, 64*usd, now.Add(-1440*time.Minute))

		res := admit(t, s, a.ID, 0, now, false)
		if len(res.Windows) != 2 {
			t.Fatalf("windows = %+v", res.Windows)
		}
		if got, want := res.Windows[0].Spent, gpuproxy.Micros((2+4-1+8+16)*usd); got != want {
			t.Errorf("60-min spent = %s, want %s", got, want)
		}
		if got, want := res.Windows[1].Spent, gpuproxy.Micros((1+2+4-1+8+16+32)*usd); got != want {
			t.Errorf("1440-min spent = %s, want %s", got, want)
		}
		// Minute-aligned now: same answers by the exact rule.
		for _, off := range []time.Duration{0, time.Microsecond, 59*time.Second + 999999*time.Microsecond} {
			n := t0.Add(off)
			want := gpuproxy.Micros(0)
			for _, c := range []struct {
				at time.Time
				v  gpuproxy.Micros
			}{{now.Add(-60 * time.Minute), 1}, {now.Add(-60*time.Minute + time.Microsecond), 2}, {now.Add(-30 * time.Minute), 4},
				{now.Add(-29 * time.Minute), -1}, {now, 8}, {now.Add(time.Microsecond), 16}} {
				if c.at.After(n.Add(-60 * time.Minute)) {
					want += c.v * usd
				}
			}
			if got := admit(t, s, a.ID, 0, n, false).Windows[0].Spent; got != want {
				t.Errorf("at %v: 60-min spent = %s, want %s", n, got, want)
			}
		}
		// Holds count in every window; committed burn looks min(H, W) ahead.
		h := admit(t, s, a.ID, 5*usd, now, true)
		if !h.Admitted || h.HoldID == 0 {
			t.Fatalf("hold not admitted: %+v", h)
		}
		if err := s.CreateMeter(ctx, billing.Meter{ID: "m1", AccountID: a.ID, PricePerHour: 3 * usd, Start: now}); err != nil {
			t.Fatal(err)
		}
		res = admit(t, s, a.ID, 0, now, false)
		for _, u := range res.Windows {
			if u.Held != 5*usd || u.Committed != 3*usd {
				t.Errorf("window %d: held %s committed %s, want 5 and 3", u.Minutes, u.Held, u.Committed)
			}
		}
		if res.Burn != 3*usd {
			t.Errorf("burn = %s", res.Burn)
		}
		// Remaining in the 60-minute window: 50 − 29 − 5 − 3 = 13: 13 fits, 13.000001 does not.
		if r := admit(t, s, a.ID, 13*usd+1, now, true); r.Admitted {
			t.Fatal("admitted past the limit")
		}
		if r := admit(t, s, a.ID, 13*usd, now, true); !r.Admitted {
			t.Fatalf("refused exactly the remainder: %+v", r.Windows)
		}
		// Releasing a hold frees it, once.
		if ok, err := s.ReleaseHold(ctx, a.ID, h.HoldID, now); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		if ok, _ := s.ReleaseHold(ctx, a.ID, h.HoldID, now); ok {
			t.Fatal("released twice")
		}
		if got := admit(t, s, a.ID, 0, now, false).Held; got != 13*usd {
			t.Fatalf("held after release = %s", got)
		}
		if held, sum, err := s.HeldForTest(ctx, a.ID); err != nil || held != sum || held != 13*usd {
			t.Fatalf("held_micros %d, open holds sum %d, err %v", held, sum, err)
		}
		// A shorter window than the horizon commits only W of burn.
		if err := s.SetLimits(ctx, a.ID, []guardrails.Window{{Minutes: 30, Limit: 100 * usd}}, "destroy"); err != nil {
			t.Fatal(err)
		}
		res = admit(t, s, a.ID, 0, now, false)
		if len(res.Windows) != 1 || res.Windows[0].Committed != gpuproxy.Micros(3*usd/2) || res.OnExceed != "destroy" {
			t.Fatalf("account limits: %+v", res)
		}
	})
}

func TestSettleHold(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "p")
		h := admit(t, s, a.ID, 10*usd, t0, true)
		e, err := s.SettleHold(ctx, h.HoldID, billing.Entry{AccountID: a.ID, Type: billing.Charge, Amount: 10 * usd,
			At: t0, Basis: billing.Prepaid, IdempotencyKey: "prepaid:x"})
		if err != nil || e.ID == 0 {
			t.Fatalf("settle: %+v %v", e, err)
		}
		res := admit(t, s, a.ID, 0, t0, false)
		if res.Held != 0 || res.Windows[0].Spent != 10*usd {
			t.Fatalf("after settle: held %s spent %s", res.Held, res.Windows[0].Spent)
		}
		if _, err := s.SettleHold(ctx, h.HoldID, billing.Entry{AccountID: a.ID, Type: billing.Charge, Amount: usd,
			At: t0, Basis: billing.Prepaid}); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("settling twice: %v", err)
		}
	})
}

func TestLedger(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "l")
		b := mustAccount(t, s, "other")
		e1, created, err := s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Credit, Amount: 100 * usd,
			At: t0, Basis: billing.Manual, IdempotencyKey: "topup-1", Description: "top-up"})
		if err != nil || !created {
			t.Fatal(err)
		}
		again, created, err := s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: billing.Credit, Amount: 999 * usd,
			At: t0, Basis: billing.Manual, IdempotencyKey: "topup-1"})
		if err != nil || created || again.ID != e1.ID || again.Amount != 100*usd {
			t.Fatalf("idempotent append: %+v created=%v err=%v", again, created, err)
		}
		// The same key on another account is a different entry.
		if _, created, _ := s.AppendEntry(ctx, billing.Entry{AccountID: b.ID, Type: billing.Credit, Amount: usd,
			At: t0, Basis: billing.Manual, IdempotencyKey: "topup-1"}); !created {
			t.Fatal("idempotency key leaked across accounts")
		}
		for i := range 25 {
			typ := billing.Charge
			if i%5 == 4 {
				typ = billing.Refund
			}
			if _, _, err := s.AppendEntry(ctx, billing.Entry{AccountID: a.ID, Type: typ, Amount: gpuproxy.Micros(i+1) * 1000,
				At: t0.Add(time.Duration(i/2) * time.Minute), Provider: []string{"vast.ai", "io.net"}[i%2],
				InstanceID: fmt.Sprintf("i%d", i%3), Basis: billing.Metered}); err != nil {
				t.Fatal(err)
			}
		}
		// Page through everything: no duplicates, newest first, same ties broken by id.
		var seen []int64
		f := billing.Filter{AccountID: a.ID, Limit: 7}
		for {
			es, err := s.ListEntries(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if e.AccountID != a.ID {
					t.Fatal("other account's entry listed")
				}
				seen = append(seen, e.ID)
			}
			if len(es) < f.Limit {
				break
			}
			last := es[len(es)-1]
			f.After = &billing.Cursor{At: last.At, ID: last.ID}
		}
		if len(seen) != 26 {
			t.Fatalf("paged %d entries, want 26", len(seen))
		}
		tot, err := s.Totals(ctx, billing.Filter{AccountID: a.ID, Provider: "vast.ai"})
		if err != nil || tot.Count != 13 {
			t.Fatalf("totals = %+v, %v", tot, err)
		}
		tot, _ = s.Totals(ctx, billing.Filter{AccountID: a.ID, Type: billing.Refund, From: t0.Add(2 * time.Minute), To: t0.Add(10 * time.Minute)})
		if tot.Count != 4 || tot.Refunds != (5+10+15+20)*1000 { // i = 4, 9, 14, 19 (minutes 2, 4, 7, 9)
			t.Fatalf("refund totals = %+v", tot)
		}
		rows, err := s.Summary(ctx, billing.Filter{AccountID: a.ID}, billing.ByInstance)
		if err != nil || len(rows) != 4 { // "", i0, i1, i2
			t.Fatalf("summary = %+v, %v", rows, err)
		}
		if _, err := s.Summary(ctx, billing.Filter{AccountID: a.ID}, "week"); gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Fatalf("bad group: %v", err)
		}
	})
}

func TestLedgerIsAppendOnly(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			s := dbtest.Open(t, k)
			a := mustAccount(t, s, "ao")
			charge(t, s, a.ID, billing.Charge, usd, t0)
			if err := s.ExecForTest(context.Background(), "UPDATE ledger SET amount_micros = 0"); err == nil {
				t.Fatal("UPDATE of the ledger succeeded")
			}
			if err := s.ExecForTest(context.Background(), "DELETE FROM ledger"); err == nil {
				t.Fatal("DELETE from the ledger succeeded")
			}
		})
	}
}

func TestMeterCompareAndSet(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "m")
		if err := s.CreateMeter(ctx, billing.Meter{ID: "m1", AccountID: a.ID, PricePerHour: 3 * usd, Start: t0, InstanceID: "i1"}); err != nil {
			t.Fatal(err)
		}
		m, err := s.Meter(ctx, "m1")
		if err != nil {
			t.Fatal(err)
		}
		until, charged := billing.Due(m, t0.Add(20*time.Minute))
		e := billing.Entry{AccountID: a.ID, Type: billing.Charge, Amount: charged, At: until, Basis: billing.Metered,
			IdempotencyKey: "meter:m1:0"}
		if err := s.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
			t.Fatal(err)
		}
		// A second engine holding the stale meter writes nothing.
		if err := s.RecordMeterCharge(ctx, m, until, charged, e); gpuproxy.ErrorCode(err) != gpuproxy.ECONFLICT {
			t.Fatalf("stale meter: %v", err)
		}
		if err := s.StopMeter(ctx, "m1", t0.Add(30*time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := s.StopMeter(ctx, "m1", t0.Add(90*time.Minute)); err != nil {
			t.Fatal(err)
		}
		due, err := s.DueMeters(ctx, 10)
		if err != nil || len(due) != 1 || !due[0].Stop.Equal(t0.Add(30*time.Minute)) {
			t.Fatalf("due = %+v, %v", due, err)
		}
		if err := s.StopMeter(ctx, "nope", t0); gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
			t.Fatalf("stop unknown meter: %v", err)
		}
	})
}

func TestWithLeader(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			rs := dbtest.Replicas(t, k, 2)
			ctx := context.Background()
			inner := errors.New("inner")
			ran, err := rs[0].WithLeader(ctx, "job", func(ctx context.Context) error {
				ran2, err := rs[1].WithLeader(ctx, "job", func(context.Context) error { return nil })
				if ran2 || err != nil {
					t.Errorf("second replica ran while the first led: %v %v", ran2, err)
				}
				return inner
			})
			if !ran || !errors.Is(err, inner) {
				t.Fatalf("leader: %v %v", ran, err)
			}
			if ran, _ := rs[1].WithLeader(ctx, "job", func(context.Context) error { return nil }); !ran {
				t.Fatal("lock not released")
			}
		})
	}
}

func TestStoreDownIsUnavailable(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			s := dbtest.Open(t, k)
			a := mustAccount(t, s, "down")
			s.Close()
			_, err := s.Admit(context.Background(), guardrails.AdmitRequest{AccountID: a.ID, Now: t0, Hold: true, Cost: 1})
			if gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
				t.Fatalf("closed store: %v", err)
			}
		})
	}
}
