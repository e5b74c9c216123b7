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
