package db_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// BenchmarkAdmission measures atomic check-and-hold admissions per second on
// Postgres with 16 concurrent callers on one account, beside a baseline of
// plain single-row UPDATE transactions on the same database and pool size.
// Compare ns/op of the two (admission/baseline throughput = baseline ns/op ÷
// admission ns/op).
//
//	TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go test ./db -run '^$' -bench Admission -benchtime 5s
func BenchmarkAdmission(b *testing.B) {
	ctx := context.Background()
	st, conn := dbtest.OpenPostgresConn(b)
	if _, err := conn.Exec(ctx, "CREATE TABLE bench_counter (id INT PRIMARY KEY, n BIGINT NOT NULL); INSERT INTO bench_counter VALUES (1, 0)"); err != nil {
		b.Fatal(err)
	}
	a, err := st.CreateAccount(ctx, "bench", time.Now())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("baseline-update", func(b *testing.B) {
		b.SetParallelism(benchParallelism())
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := st.ExecForTest(ctx, "UPDATE bench_counter SET n = n + 1 WHERE id = 1"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	// A key without windows of its own keeps the cached fast path; a key
	// with windows is decided on exact sums.
	for _, k := range []gpuproxy.APIKey{{ID: "bench-plain"}, {ID: "bench-windows"}} {
		k.AccountID, k.Hash, k.CreatedAt, k.Scopes = a.ID, "h-"+k.ID, time.Now(), []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}
		if err := st.CreateKey(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.SetKeyLimits(ctx, a.ID, "bench-windows", []guardrails.Window{{Minutes: 60, Limit: gpuproxy.MaxMicros}}); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, key string }{{"admission", ""}, {"admission-key", "bench-plain"},
		{"admission-key-windows", "bench-windows"}} {
		b.Run(c.name, func(b *testing.B) {
			req := guardrails.AdmitRequest{AccountID: a.ID, Cost: 1, Horizon: time.Hour, Hold: true, Ref: "bench", KeyID: c.key,
				Defaults: []guardrails.Window{{Minutes: 60, Limit: gpuproxy.MaxMicros}, {Minutes: 1440, Limit: gpuproxy.MaxMicros}}}
			b.SetParallelism(benchParallelism())
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r := req
					r.Now = time.Now()
					res, err := st.Admit(ctx, r)
					if err != nil || !res.Admitted {
						b.Errorf("admit: %v %v", res.Admitted, err)
						return
					}
				}
			})
		})
	}
}

// benchParallelism gives 16 concurrent callers in all (BENCH_CALLERS
// overrides), whatever GOMAXPROCS is.
func benchParallelism() int {
	callers := 16
	if v, err := strconv.Atoi(os.Getenv("BENCH_CALLERS")); err == nil && v > 0 {
		callers = v
	}
	return max(1, callers/db.TestingProcs())
}

// BenchmarkKeyWindowSum measures a busy key's 24-hour window: 43,200
// charges attributed to it over the last day (a proxy lease settling every
// 2 s). "exact-ledger-sum" is the sum over every one of its ledger rows in
// the window (how key windows were read before key_spend_minutes);
// "minute-buckets" is how gp_admit reads it now (whole minutes from
// key_spend_minutes, the edges from the ledger); "admission" is a whole
// admission by the key. Compare ns/op.
//
//	TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go test ./db -run '^$' -bench KeyWindowSum
func BenchmarkKeyWindowSum(b *testing.B) {
	ctx := context.Background()
	st, conn := dbtest.OpenPostgresConn(b)
	a, err := st.CreateAccount(ctx, "bench", time.Now())
	if err != nil {
		b.Fatal(err)
	}
	if err := st.CreateKey(ctx, gpuproxy.APIKey{ID: "busy", AccountID: a.ID, Hash: "h-busy", CreatedAt: time.Now(),
		Scopes: []gpuproxy.Scope{gpuproxy.ScopeProxyInvoke}}); err != nil {
		b.Fatal(err)
	}
	day := []guardrails.Window{{Minutes: 1440, Limit: gpuproxy.MaxMicros}}
	if err := st.SetKeyLimits(ctx, a.ID, "busy", day); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixMicro()
	if _, err := conn.Exec(ctx, `INSERT INTO ledger (account_id, type, amount_micros, spend_micros, at_us, created_us, basis, key_id)
		SELECT $1, 'charge', 10000, 10000, $2::BIGINT - g::BIGINT * 2000000, $2::BIGINT, 'metered', 'busy' FROM generate_series(0, 43199) AS g`,
		a.ID, now); err != nil {
		b.Fatal(err)
	}
	lo := now - 1440*60_000_000
	s, e := lo/60_000_000+1, now/60_000_000
	for _, c := range []struct{ name, q string }{
		{"exact-ledger-sum", `SELECT COALESCE(sum(spend_micros), 0) FROM ledger WHERE key_id = 'busy' AND at_us > ` + strconv.FormatInt(lo, 10)},
		{"minute-buckets", `SELECT COALESCE((SELECT sum(spend_micros) FROM key_spend_minutes WHERE key_id = 'busy' AND minute >= ` +
			strconv.FormatInt(s, 10) + ` AND minute < ` + strconv.FormatInt(e, 10) + `), 0)
			+ COALESCE((SELECT sum(spend_micros) FROM ledger WHERE key_id = 'busy' AND at_us > ` + strconv.FormatInt(lo, 10) +
			` AND at_us < ` + strconv.FormatInt(s*60_000_000, 10) + `), 0)
			+ COALESCE((SELECT sum(spend_micros) FROM ledger WHERE key_id = 'busy' AND at_us >= ` + strconv.FormatInt(e*60_000_000, 10) + `), 0)`},
	} {
		var want int64
		if err := conn.QueryRow(ctx, c.q).Scan(&want); err != nil || want != 43200*10000 {
			b.Fatalf("%s = %d, %v; want %d", c.name, want, err, 43200*10000)
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := conn.QueryRow(ctx, c.q).Scan(&want); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("admission", func(b *testing.B) {
		for b.Loop() {
			res, err := st.Admit(ctx, guardrails.AdmitRequest{AccountID: a.ID, Cost: 1, Now: time.Now(), Horizon: time.Hour,
				Defaults: day, KeyID: "busy"})
			if err != nil || !res.Admitted || res.Key == nil {
				b.Fatalf("admit: %+v %v", res, err)
			}
		}
	})
}
