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

// TestInsertUsageRoundTrip: every column of every record reads back as
// written, whatever the batch's size (the INSERTs cut it in chunks of
// 64, 8 and 1 rows) and whichever columns its rows share (a chunk binds
// the values all its rows share once) or not.
func TestInsertUsageRoundTrip(t *testing.T) {
	eachStore(t, func(t *testing.T, s *db.Store) {
		ctx := context.Background()
		accts := []int64{mustAccount(t, s, "a").ID, mustAccount(t, s, "b").ID}
		var want []gpuproxy.Usage
		n := 0
		// vary names the column that differs within the batch, at row
		// at (-1: none).
		for _, c := range []struct {
			size, at int
			vary     string
		}{
			{1, -1, ""}, {2, 1, "instance"}, {7, -1, ""}, {8, 7, "method"}, {9, 8, "path"}, {63, -1, ""},
			{64, 63, "status"}, {64, 0, "service"}, {65, 64, "model"}, {72, 3, "key"}, {130, 100, "account"},
			{200, -1, ""}, {64, 10, "all"}, {3, 1, "empty"},
		} {
			var batch []gpuproxy.Usage
			for i := range c.size {
				u := gpuproxy.Usage{AccountID: accts[0], InstanceID: "gpi_rt", Method: "POST", Path: "/v1/chat/completions",
					Status: 200, BytesIn: int64(n), BytesOut: int64(2 * n), Latency: time.Duration(n) * time.Microsecond,
					TTFB: time.Duration(n/2) * time.Microsecond, Cost: gpuproxy.Micros(n % 1000), At: t0.Add(time.Duration(n) * time.Microsecond),
					RequestID: fmt.Sprintf("rt-%d", n), ServiceID: "svc_rt", Model: "m-rt", PromptTokens: int64(n % 97),
					CompletionTokens: int64(n % 89), KeyID: "key_rt"}
				if i == c.at || (c.at >= 0 && c.vary == "all" && i%2 == 1) {
					switch c.vary {
					case "instance":
						u.InstanceID = "gpi_other"
					case "method":
						u.Method = "GET"
					case "path":
						u.Path = "/v1/models"
					case "status":
						u.Status = 502
					case "service":
						u.ServiceID = ""
					case "model":
						u.Model = "m-other"
					case "key":
						u.KeyID = ""
					case "account":
						u.AccountID = accts[1]
					case "all":
						u.AccountID, u.InstanceID, u.Method, u.Path = accts[1], fmt.Sprintf("gpi_%d", n), "PUT", fmt.Sprintf("/p/%d", n)
						u.Status, u.ServiceID, u.Model, u.KeyID = 400+n%100, "", fmt.Sprintf("m%d", n), fmt.Sprintf("k%d", n)
					case "empty":
						u.InstanceID, u.Method, u.Path, u.ServiceID, u.Model, u.KeyID, u.RequestID = "", "", "", "", "", "", ""
					}
				}
				batch = append(batch, u)
				n++
			}
			if err := s.InsertUsage(ctx, fmt.Sprintf("rt-%d-%d", c.size, c.at), batch); err != nil {
				t.Fatalf("batch of %d varying %q: %v", c.size, c.vary, err)
			}
			want = append(want, batch...)
		}
		got := map[string][]gpuproxy.Usage{}
		for _, a := range accts {
			page, err := s.ListUsage(ctx, gpuproxy.UsageFilter{AccountID: a, Limit: 10000})
			if err != nil {
				t.Fatal(err)
			}
			for i := len(page) - 1; i >= 0; i-- { // oldest (lowest id) first
				u := page[i]
				u.ID = 0
				got[fmt.Sprint(u.AccountID)] = append(got[fmt.Sprint(u.AccountID)], u)
			}
		}
		wantBy := map[string][]gpuproxy.Usage{}
		for _, u := range want {
			wantBy[fmt.Sprint(u.AccountID)] = append(wantBy[fmt.Sprint(u.AccountID)], u)
		}
		for a, w := range wantBy {
			g := got[a]
			if len(g) != len(w) {
				t.Fatalf("account %s: %d records read back, want %d", a, len(g), len(w))
			}
			for i := range w {
				w[i].At = w[i].At.UTC()
				g[i].At = g[i].At.UTC()
				if g[i] != w[i] {
					t.Fatalf("account %s record %d read back as\n%+v\nwant\n%+v", a, i, g[i], w[i])
				}
			}
		}
	})
}
