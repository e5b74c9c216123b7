package db_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/proxy"
)

func usageRec(acct int64, inst string, status int, at time.Time, i int) gpuproxy.Usage {
	return gpuproxy.Usage{AccountID: acct, InstanceID: inst, Method: "POST", Path: "/v1/chat/completions", Status: status,
		BytesIn: 100, BytesOut: 1000, Latency: 2500 * time.Microsecond, TTFB: 1200 * time.Microsecond,
		Cost: 10, At: at, RequestID: fmt.Sprintf("req-%d", i)}
}

func TestProxyUsage(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		a := mustAccount(t, s, "user")
		b := mustAccount(t, s, "other")
		if err := s.InsertUsage(ctx, "", nil); err != nil {
			t.Fatal(err)
		}
		// 1500 records in one call: more than one INSERT statement.
		var recs []gpuproxy.Usage
		for i := range 1500 {
			inst, status := "gpi_a", 200
			if i%3 == 0 {
				inst = "gpi_b"
			}
			if i%10 == 0 {
				status = 502
			}
			recs = append(recs, usageRec(a.ID, inst, status, t0.Add(time.Duration(i)*time.Second), i))
		}
		recs = append(recs, usageRec(b.ID, "gpi_a", 200, t0, 9999))
		if err := s.InsertUsage(ctx, "", recs); err != nil {
			t.Fatal(err)
		}

		tot, err := s.UsageTotals(ctx, gpuproxy.UsageFilter{AccountID: a.ID})
		if err != nil {
			t.Fatal(err)
		}
		want := gpuproxy.UsageTotals{Requests: 1500, Errors: 150, BytesIn: 150000, BytesOut: 1500000,
			Latency: 1500 * 2500 * time.Microsecond, TTFB: 1500 * 1200 * time.Microsecond, Cost: 15000}
		if tot != want {
			t.Fatalf("totals = %+v, want %+v", tot, want)
		}

		// from/to bound [from, to); instance filter.
		f := gpuproxy.UsageFilter{AccountID: a.ID, From: t0.Add(100 * time.Second), To: t0.Add(200 * time.Second), InstanceID: "gpi_b"}
		tot, err = s.UsageTotals(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if tot.Requests != 33 { // i in [100, 200) with i%3 == 0: 102 … 198
			t.Fatalf("filtered requests = %d, want 33", tot.Requests)
		}
		f.Limit = 10
		page, err := s.ListUsage(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) != 10 || page[0].RequestID != "req-198" || page[0].InstanceID != "gpi_b" {
			t.Fatalf("first page = %d records, first %+v", len(page), page[0])
		}
		got := page[0]
		if got.Method != "POST" || got.Path != "/v1/chat/completions" || got.Status != 200 || got.BytesIn != 100 ||
			got.BytesOut != 1000 || got.Latency != 2500*time.Microsecond || got.TTFB != 1200*time.Microsecond ||
			got.Cost != 10 || !got.At.Equal(t0.Add(198*time.Second)) || got.AccountID != a.ID || got.ID == 0 {
			t.Fatalf("record round trip = %+v", got)
		}
		// Walk every page by cursor.
		seen := 0
		f.BeforeID = 0
		for {
			page, err := s.ListUsage(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i < len(page); i++ {
				if page[i].ID >= page[i-1].ID {
					t.Fatal("not newest first")
				}
			}
			seen += len(page)
			if len(page) < f.Limit {
				break
			}
			f.BeforeID = page[len(page)-1].ID
		}
		if seen != 33 {
			t.Fatalf("paged through %d records, want 33", seen)
		}

		// Accounts never see each other's records.
		other, err := s.ListUsage(ctx, gpuproxy.UsageFilter{AccountID: b.ID})
		if err != nil || len(other) != 1 || other[0].RequestID != "req-9999" {
			t.Fatalf("other account = %+v, %v", other, err)
		}
		none, err := s.UsageTotals(ctx, gpuproxy.UsageFilter{AccountID: a.ID, InstanceID: "gpi_zzz"})
		if err != nil || none != (gpuproxy.UsageTotals{}) {
			t.Fatalf("empty totals = %+v, %v", none, err)
		}

		// Negative values are clamped, never refused (telemetry).
		bad := usageRec(a.ID, "gpi_c", 0, t0, 1)
		bad.BytesIn, bad.Latency, bad.Cost = -1, -time.Second, gpuproxy.Micros(-5)
		if err := s.InsertUsage(ctx, "", []gpuproxy.Usage{bad}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestProxyUsageStoreDown: a closed store reports unavailable (so the
// recorder keeps its records for a retry).
func TestProxyUsageStoreDown(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		s.Close()
		err := s.InsertUsage(context.Background(), "", []gpuproxy.Usage{usageRec(1, "x", 200, t0, 1)})
		if gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
			t.Fatalf("insert with store closed: %v", err)
		}
		if _, err := s.ListUsage(context.Background(), gpuproxy.UsageFilter{AccountID: 1}); gpuproxy.ErrorCode(err) != gpuproxy.EUNAVAILABLE {
			t.Fatalf("list with store closed: %v", err)
		}
	})
}

var _ proxy.UsageStore = (*db.Store)(nil)
