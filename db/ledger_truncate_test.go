package db_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// moneyState is what an emptied table would change: the ledger's totals,
// each window's spend (read through spend_minutes for whole minutes), the
// held total and the open holds, burn and a meter.
type moneyState struct {
	totals    billing.Totals
	windows   []guardrails.Usage
	held, sum int64
	meter     billing.Meter
}

func readMoney(t *testing.T, s *db.Store, acct int64, now time.Time) moneyState {
	t.Helper()
	ctx := context.Background()
	var st moneyState
	var err error
	if st.totals, err = s.Totals(ctx, billing.Filter{AccountID: acct}); err != nil {
		t.Fatal(err)
	}
	st.windows = admit(t, s, acct, 0, now, false).Windows
	if st.held, st.sum, err = s.HeldForTest(ctx, acct); err != nil {
		t.Fatal(err)
	}
	if st.meter, err = s.Meter(ctx, "m-trunc"); err != nil {
		t.Fatal(err)
	}
	return st
}

func (a moneyState) equal(b moneyState) bool {
	if a.totals != b.totals || a.held != b.held || a.sum != b.sum || a.meter != b.meter || len(a.windows) != len(b.windows) {
		return false
	}
	for i := range a.windows {
		if a.windows[i] != b.windows[i] {
			return false
		}
	}
	return true
}

// TestMoneyTablesRefuseTruncate: TRUNCATE of the ledger, or of a table kept
// in step with it, fails with a clear error and changes nothing, also when
// it arrives by CASCADE from accounts. SQLite has no TRUNCATE; its
// equivalent, DELETE without WHERE, fires the ledger's DELETE trigger (a
// DELETE trigger turns SQLite's truncate optimization off) and is refused.
func TestMoneyTablesRefuseTruncate(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "trunc")
		now := t0.Add(90 * time.Minute)
		charge(t, s, a.ID, billing.Charge, 3*usd, now.Add(-40*time.Minute))
		charge(t, s, a.ID, billing.Refund, usd, now.Add(-20*time.Minute))
		charge(t, s, a.ID, billing.Credit, 100*usd, now.Add(-10*time.Minute))
		if err := s.CreateMeter(ctx, billing.Meter{ID: "m-trunc", AccountID: a.ID, InstanceID: "i-trunc",
			PricePerHour: 2 * usd, Start: now.Add(-30 * time.Minute)}); err != nil {
			t.Fatal(err)
		}
		m, _ := s.Meter(ctx, "m-trunc")
		until, charged, e := tickCharge(m, now.Add(-5*time.Minute))
		if err := s.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
			t.Fatal(err)
		}
		if h := admit(t, s, a.ID, 4*usd, now, true); !h.Admitted {
			t.Fatalf("hold not admitted: %+v", h)
		}
		before := readMoney(t, s, a.ID, now)
		if before.totals.Count != 4 || before.held != 4*usd || before.windows[0].Spent != 2*usd+charged {
			t.Fatalf("set-up: %+v", before)
		}

		var stmts []string
		if s.Dialect() == "postgres" {
			stmts = []string{"TRUNCATE ledger", "TRUNCATE TABLE ONLY ledger", "TRUNCATE ledger CASCADE",
				"TRUNCATE ledger RESTART IDENTITY", "TRUNCATE spend_minutes", "TRUNCATE meters", "TRUNCATE holds",
				"TRUNCATE instances, meters", "TRUNCATE accounts CASCADE", "TRUNCATE account_limits, ledger"}
		} else {
			stmts = []string{"DELETE FROM ledger", "DELETE FROM ledger WHERE 1", "TRUNCATE ledger", "TRUNCATE TABLE ledger"}
		}
		for _, q := range stmts {
			err := s.ExecForTest(ctx, q)
			if err == nil {
				t.Errorf("%s succeeded", q)
			} else if s.Dialect() == "postgres" {
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "55000" || !strings.HasPrefix(pe.Message, "TRUNCATE of ") ||
					!strings.Contains(pe.Message, " refused: ") {
					t.Errorf("%s: %v, want the trigger's refusal (55000, TRUNCATE of … refused: why)", q, err)
				} else {
					t.Logf("%s: %s", q, pe.Message)
				}
			} else if strings.HasPrefix(q, "DELETE") && !strings.Contains(err.Error(), "ledger is append-only") {
				t.Errorf("%s: %v, want the ledger's DELETE trigger", q, err)
			}
			if after := readMoney(t, s, a.ID, now); !after.equal(before) {
				t.Fatalf("after %s:\n got %+v\nwant %+v", q, after, before)
			}
		}
	})
}

// TestRefusalNamesEachTable: the ledger's own refusal says it is
// append-only, and each table's refusal names that table.
func TestRefusalNamesEachTable(t *testing.T) {
	s := dbtest.Open(t, dbtest.Postgres)
	for table, why := range map[string]string{
		"ledger":            "the ledger is append-only",
		"spend_minutes":     "in step with it",
		"key_spend_minutes": "per key and minute",
		"meters":            "meters record how far",
		"holds":             "held_micros",
	} {
		err := s.ExecForTest(context.Background(), "TRUNCATE "+table)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || !strings.HasPrefix(pe.Message, "TRUNCATE of "+table+" refused: ") ||
			!strings.Contains(pe.Message, why) {
			t.Errorf("TRUNCATE %s: %v", table, err)
		}
	}
}
