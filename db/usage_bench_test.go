package db_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db/dbtest"
)

// benchUsageBatch is the batch the benchmarks write per operation: what
// the proxy's writer takes in at a few hundred requests per tick.
const benchUsageBatch = 500

// benchUsage is a batch of one instance's traffic as the proxy records
// it: one account, key, instance, path and model, per-request times,
// sizes and ids.
func benchUsage(acct int64, round int) []gpuproxy.Usage {
	recs := make([]gpuproxy.Usage, benchUsageBatch)
	for i := range recs {
		recs[i] = gpuproxy.Usage{AccountID: acct, InstanceID: "gpi_bench", Method: "POST", Path: "/v1/chat/completions",
			Status: 200, BytesIn: int64(300 + i%17), BytesOut: int64(1200 + i%91), Latency: time.Duration(800+i) * time.Microsecond,
			TTFB: time.Duration(500+i) * time.Microsecond, Cost: gpuproxy.Micros(37 + i%5),
			At: t0.Add(time.Duration(round*benchUsageBatch+i) * time.Millisecond), RequestID: fmt.Sprintf("gp_%d_%d", round, i),
			Model: "bench-model", PromptTokens: int64(9 + i%7), CompletionTokens: int64(20 + i%13), KeyID: "key_bench"}
	}
	return recs
}

func benchmarkUsageBatch(b *testing.B, k dbtest.Kind) {
	s := dbtest.Open(b, k)
	a, err := s.CreateAccount(context.Background(), "bench", t0)
	if err != nil {
		b.Fatal(err)
	}
	batches := make([][]gpuproxy.Usage, 16)
	for i := range batches {
		batches[i] = benchUsage(a.ID, i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := s.InsertUsage(ctx, fmt.Sprintf("batch-%d", i), batches[i%len(batches)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchUsageBatch), "ns/record")
}

// BenchmarkUsageBatchSQLite writes batches of benchUsageBatch usage
// records, with a batch id, as the proxy's writer does.
func BenchmarkUsageBatchSQLite(b *testing.B) { benchmarkUsageBatch(b, dbtest.SQLite) }

// BenchmarkUsageBatchPostgres is BenchmarkUsageBatchSQLite on Postgres
// (TEST_DATABASE_URL).
func BenchmarkUsageBatchPostgres(b *testing.B) { benchmarkUsageBatch(b, dbtest.Postgres) }
