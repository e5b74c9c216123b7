package server_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/economics/economicstest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/teststack"
	"github.com/aiserve/gpuproxy/server"
)

// summaryEnv is a server with unit economics over the economics fixture
// (account acme, and other), its clock at the fixture's Now.
type summaryEnv struct {
	*env
	acme, other gpuproxy.Account
}

func newSummaryEnv(t *testing.T, k dbtest.Kind) *summaryEnv {
	t.Helper()
	e := &summaryEnv{env: newEnv(t, k, opts{now: func() time.Time { return economicstest.Now }})}
	st, a := e.store, e.auth
	ctx := context.Background()
	var err error
	for name, acct := range map[string]*gpuproxy.Account{"acme": &e.acme, "other": &e.other} {
		if *acct, err = a.CreateAccount(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	economicstest.Seed(t, st, e.acme.ID, e.other.ID)
	return e
}

// period is the fixture's period as query parameters.
var period = "from=" + url.QueryEscape(economicstest.From.Format(time.RFC3339)) +
	"&to=" + url.QueryEscape(economicstest.To.Format(time.RFC3339))

// TestUsageSummary: the JSON answer of every grouping is the fixture's
// hand-worked summary, valid against the OpenAPI schema; the CSV export
// (format=csv, Accept: text/csv, HEAD) says the same.
func TestUsageSummary(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newSummaryEnv(t, k)
		d := loadAPIDoc(t)
		fin, _ := e.key("acme", "finance")
		for _, g := range []economics.GroupBy{economics.ByInstance, economics.ByModel, economics.ByKey, economics.ByService} {
			r := e.do("GET", "/api/v1/usage/summary?"+period+"&group_by="+string(g), fin, "")
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", g, r.Status, r.Body)
			}
			d.check("GET", "/api/v1/usage/summary", r)
			want := economicstest.Want(g)
			want.Query.AccountID = e.acme.ID
			wantJSON(t, string(g), r.Body, economics.NewSummaryJSON("acme", want))

			c := e.do("GET", "/api/v1/usage/summary?"+period+"&group_by="+string(g)+"&format=csv", fin, "")
			if c.Status != 200 || !strings.HasPrefix(c.Header.Get("Content-Type"), "text/csv") ||
				c.Header.Get("Content-Disposition") != `attachment; filename="usage-summary-by-`+string(g)+`.csv"` {
				t.Fatalf("%s csv: %d %v %s", g, c.Status, c.Header, c.Body)
			}
			d.check("GET", "/api/v1/usage/summary", c)
			csvMatchesJSON(t, string(g), c.Body, r.Body)
			if a := e.do("GET", "/api/v1/usage/summary?"+period+"&group_by="+string(g), fin, "", "Accept", "text/csv"); !bytes.Equal(a.Body, c.Body) {
				t.Fatalf("%s: Accept: text/csv answers %s", g, a.Body)
			}
		}
		h := e.do("HEAD", "/api/v1/usage/summary?"+period+"&format=csv", fin, "")
		if h.Status != 200 || len(h.Body) != 0 || !strings.HasPrefix(h.Header.Get("Content-Type"), "text/csv") {
			t.Fatalf("HEAD: %d %v %q", h.Status, h.Header, h.Body)
		}
		d.check("HEAD", "/api/v1/usage/summary", h)

		// Without from and to: the 7 days up to now, by instance.
		r := e.do("GET", "/api/v1/usage/summary", fin, "")
		m := r.JSON(t)
		if r.Status != 200 || m["from"] != economicstest.Now.Add(-7*24*time.Hour).Format(time.RFC3339) ||
			m["to"] != economicstest.Now.Format(time.RFC3339) || m["group_by"] != "instance" {
			t.Fatalf("defaults: %d %s", r.Status, r.Body)
		}
		d.check("GET", "/api/v1/usage/summary", r)
	})
}

// wantJSON compares a JSON body with what want renders to.
func wantJSON(t *testing.T, what string, body []byte, want any) {
	t.Helper()
	wb, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got, exp any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%s: %v: %s", what, err, body)
	}
	_ = json.Unmarshal(wb, &exp)
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("%s:\n got %s\nwant %s", what, body, wb)
	}
}

// csvMatchesJSON checks that each CSV line, the totals last, carries the
// JSON's figures.
func csvMatchesJSON(t *testing.T, what string, csvBody, jsonBody []byte) {
	t.Helper()
	recs, err := csv.NewReader(bytes.NewReader(csvBody)).ReadAll()
	if err != nil {
		t.Fatalf("%s: csv: %v", what, err)
	}
	var js economics.SummaryJSON
	if err := json.Unmarshal(jsonBody, &js); err != nil {
		t.Fatal(err)
	}
	rows := append(js.Rows, js.Totals)
	if len(recs) != len(rows)+1 {
		t.Fatalf("%s: %d CSV lines for %d rows and the totals", what, len(recs), len(js.Rows))
	}
	if want := economics.CSVHeader(js.GroupBy); !reflect.DeepEqual(recs[0], want) {
		t.Fatalf("%s: header %v, want %v", what, recs[0], want)
	}
	usd := func(s string) string {
		if s == "" {
			return "null"
		}
		m, err := gpuproxy.ParseUSD(s)
		if err != nil {
			t.Fatalf("%s: %q: %v", what, s, err)
		}
		return strconv.FormatInt(int64(m), 10)
	}
	opt := func(v *int64) string {
		if v == nil {
			return "null"
		}
		return strconv.FormatInt(*v, 10)
	}
	num := func(s string) float64 {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", what, s, err)
		}
		return f
	}
	for i, r := range rows {
		c := recs[i+1]
		got := []string{c[0], c[1], c[2], c[3], c[4], c[5], c[6], usd(c[7]), usd(c[8]), usd(c[9]), usd(c[10]),
			fmt.Sprint(num(c[11])), fmt.Sprint(num(c[12])), fmt.Sprint(num(c[13]))}
		want := []string{r.Group, r.Label, fmt.Sprint(r.Requests), fmt.Sprint(r.Errors), fmt.Sprint(r.PromptTokens),
			fmt.Sprint(r.CompletionTokens), fmt.Sprint(r.Tokens), fmt.Sprint(r.GPUCostMicros), fmt.Sprint(r.ProxyChargesMicros),
			opt(r.CostPer1MOutputTokensMicros), opt(r.CostPer1MTokensMicros), fmt.Sprint(r.BusySeconds),
			fmt.Sprint(r.RunningSeconds), fmt.Sprint(r.Utilization)}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s line %d: %q\n  JSON row %q", what, i+1, got, want)
		}
	}
}

// TestUsageSummaryRefusals: bad queries are 400 naming the field; a key
// without billing:read is 403; another account is not found unless an
// admin asks, and the other account's key sees its own data only.
func TestUsageSummaryRefusals(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		e := newSummaryEnv(t, k)
		d := loadAPIDoc(t)
		fin, _ := e.key("acme", "finance")
		for _, c := range []struct{ query, field string }{
			{"from=yesterday", "from"},
			{"to=2026-13-01", "to"},
			{"from=2026-11-02T10:00:00Z&to=2026-11-02T10:00:00Z", "to"},
			{"from=2026-11-02&to=2026-11-01T00:00:00Z", "to"},
			{"from=2025-01-01&to=2026-01-02", "to"}, // 367 days: a date includes its day
			{"group_by=gpu", "group_by"},
			{"group_by=day", "group_by"},
			{"format=xml", "format"},
			{"acount=other", "acount"},
		} {
			r := e.do("GET", "/api/v1/usage/summary?"+c.query, fin, "")
			if r.Status != 400 || r.ErrCode() != gpuproxy.EINVALID || r.ErrDetails()["field"] != c.field {
				t.Errorf("%s: %d %s, want 400 naming %s", c.query, r.Status, r.Body, c.field)
			}
			d.check("GET", "/api/v1/usage/summary", r)
		}
		if r := e.do("GET", "/api/v1/usage/summary?from=2025-01-01&to=2026-01-01", fin, ""); r.Status != 200 {
			t.Errorf("366 days: %d %s", r.Status, r.Body)
		}

		spend, _, err := e.auth.CreateKey(context.Background(), "acme", "spend-only", []gpuproxy.Scope{gpuproxy.ScopeSpendingRead})
		if err != nil {
			t.Fatal(err)
		}
		if r := e.do("GET", "/api/v1/usage/summary", spend, ""); r.Status != 403 {
			t.Errorf("spending:read only: %d %s", r.Status, r.Body)
		} else {
			d.check("GET", "/api/v1/usage/summary", r)
		}
		if r := e.do("GET", "/api/v1/usage/summary", "", ""); r.Status != 401 {
			t.Errorf("no key: %d", r.Status)
		}
		r := e.do("GET", "/api/v1/usage/summary?account=other", fin, "")
		if r.Status != 404 {
			t.Errorf("another account: %d %s", r.Status, r.Body)
		}
		d.check("GET", "/api/v1/usage/summary", r)

		// An admin of another account names acme: acme's summary.
		admin, _ := e.key("root", "admin")
		r = e.do("GET", "/api/v1/usage/summary?account=acme&group_by=key&"+period, admin, "")
		want := economicstest.Want(economics.ByKey)
		want.Query.AccountID = e.acme.ID
		wantJSON(t, "admin", r.Body, economics.NewSummaryJSON("acme", want))

		// The other account's engineer sees its own instance only.
		eng, _ := e.key("other", "engineer")
		r = e.do("GET", "/api/v1/usage/summary?group_by=instance&"+period, eng, "")
		var js economics.SummaryJSON
		if err := json.Unmarshal(r.Body, &js); err != nil || r.Status != 200 {
			t.Fatalf("other: %d %s", r.Status, r.Body)
		}
		if js.Account != "other" || len(js.Rows) != 2 || js.Rows[0].Group != economicstest.InstX ||
			js.Totals.GPUCostMicros != 50_000_000 || strings.Contains(string(r.Body), economicstest.KeyA) ||
			strings.Contains(string(r.Body), "RTX 4090") {
			t.Fatalf("other's summary: %s", r.Body)
		}
	})
}

// TestUsageSummaryNotWired: without economics the route is not there (a
// server wired by hand: the binary always wires it).
func TestUsageSummaryNotWired(t *testing.T) {
	st := dbtest.Open(t, dbtest.SQLite)
	a := auth.New(st, auth.Options{CacheTTL: -1})
	srv := server.New(server.Services{Auth: a, Guard: guardrails.New(st, guardrails.Options{}), Ledger: billing.NewLedger(st, nil),
		Store: st, RateLimiter: auth.NewSharedRateLimiter(0, auth.RateLimitOptions{})}, server.Options{Logger: newTestLogger(discard{})})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	fin, _ := teststack.NewKey(t, a, "acme", "finance")
	if r := teststack.Send(t, "GET", hs.URL+"/api/v1/usage/summary", nil, "X-API-Key", fin); r.Status != 404 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
}
