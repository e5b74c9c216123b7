package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/server"
)

// BenchmarkSpendingLatency measures GET /api/v1/spending on Postgres for an
// account with 30 days of per-minute charges from 50 meters (2.16 million
// ledger rows), reporting p50 and p99 latency in ms.
//
//	TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go test ./server -run '^$' -bench SpendingLatency -benchtime 2000x
func BenchmarkSpendingLatency(b *testing.B) {
	ctx := context.Background()
	st, conn := dbtest.OpenPostgresConn(b)
	a, err := st.CreateAccount(ctx, "heavy", time.Now())
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	start := now.Add(-30 * 24 * time.Hour).Truncate(time.Minute)
	// Bulk-load the ledger with the bucket trigger off, then build the
	// minute buckets in one pass: the same rows the trigger would write.
	for _, q := range []string{
		"ALTER TABLE ledger DISABLE TRIGGER ledger_bucket",
		fmt.Sprintf(`INSERT INTO ledger (account_id, type, amount_micros, spend_micros, at_us, provider, instance_id,
			description, idempotency_key, basis, created_us)
			SELECT %d, 'charge', 50000, 50000, %d + m::BIGINT * 60000000, 'vast.ai', 'inst-' || k, 'metered minute',
			       'meter:' || k || ':' || m, 'metered', %d + m::BIGINT * 60000000
			  FROM generate_series(1, 43200) m, generate_series(1, 50) k`, a.ID, start.UnixMicro(), start.UnixMicro()),
		"ALTER TABLE ledger ENABLE TRIGGER ledger_bucket",
		`INSERT INTO spend_minutes (account_id, minute, spend_micros)
			SELECT account_id, at_us / 60000000, sum(spend_micros) FROM ledger GROUP BY 1, 2`,
		"ANALYZE",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatalf("seeding: %v", err)
		}
	}
	as := auth.New(st, auth.Options{})
	key, _, err := as.CreateKey(ctx, "heavy", "bench", string2scope{"spending:read"}.scopes())
	if err != nil {
		b.Fatal(err)
	}
	srv := server.New(server.Services{Auth: as, Guard: guardrails.New(st, guardrails.Options{}),
		Ledger: billing.NewLedger(st, nil), Store: st, RateLimiter: auth.NewSharedRateLimiter(0, auth.RateLimitOptions{})},
		server.Options{Logger: newTestLogger(discard{})})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	req, _ := http.NewRequest("GET", hs.URL+"/api/v1/spending", nil)
	req.Header.Set("X-API-Key", key)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != 200 {
			b.Fatalf("GET /spending: %v %v", err, res)
		}
		_ = res.Body.Close()
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
