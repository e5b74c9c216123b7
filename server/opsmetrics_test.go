package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/fleet"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/server"
)

// metricValue returns the value of the sample whose line starts with
// series (name and labels as exposed), and whether there is one.
func metricValue(t *testing.T, body, series string) (float64, bool) {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("sample %q: %v", l, err)
			}
			return f, true
		}
	}
	return 0, false
}

func scrape(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// TestOperatorMetrics: latency histograms reach 300 s; gauges for running
// instances per provider, each account window's (spent + held +
// committed) / limit (a window that goes away stops being reported) and
// the metering lag; /metrics behind a bearer token, or moved off the API
// listener.
func TestOperatorMetrics(t *testing.T) {
	eachKind(t, func(t *testing.T, k dbtest.Kind) {
		ctx := context.Background()
		st := dbtest.Open(t, k)
		a := auth.New(st, auth.Options{CacheTTL: -1})
		log := newTestLogger(&strings.Builder{})
		guard := guardrails.New(st, guardrails.Options{Logger: log})
		now := time.Now().Truncate(time.Millisecond)
		meterNow := now.Add(90 * time.Second)
		meterer := billing.NewMeterer(st, billing.MeterOptions{Now: func() time.Time { return meterNow }, Logger: log})
		metrics := server.NewMetrics()
		srv := server.New(server.Services{
			Auth: a, Guard: guard, Ledger: billing.NewLedger(st, nil), Store: st, Metrics: metrics, Meterer: meterer,
			Fleet:       fleet.New(st, guard, nil, fleet.Options{Logger: log}),
			RateLimiter: auth.NewSharedRateLimiter(1000, auth.RateLimitOptions{}),
		}, server.Options{Logger: log, MetricsToken: "m-token", GaugeMaxAge: -1})
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)

		acme, err := a.CreateAccount(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if err := guard.SetLimits(ctx, acme.ID, []guardrails.Window{{Minutes: 60, Limit: 10 * usd}, {Minutes: 1440, Limit: 100 * usd}}, ""); err != nil {
			t.Fatal(err)
		}
		inst := gpuproxy.Instance{ID: "gpi_opsmetrics000000001", AccountID: acme.ID, Provider: "vast.ai", OfferID: "o",
			GPUName: "RTX 4090", NumGPUs: 1, PricePerHour: 2 * usd, Billing: "hourly", Status: gpuproxy.Pending, CreatedAt: now}
		if res, _, _, err := st.AdmitInstance(ctx, guard.Request(acme.ID, 2*usd, inst.ID), inst); err != nil || !res.Admitted {
			t.Fatalf("admit: %+v %v", res, err)
		}
		if _, err := st.MarkStarting(ctx, inst.ID, "42", nil, now); err != nil {
			t.Fatal(err)
		}
		if _, err := st.MarkRunning(ctx, inst.ID, "http://203.0.113.9:8000", now,
			&billing.Meter{PricePerHour: 2 * usd, Start: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := billing.NewLedger(st, nil).Append(ctx, billing.Entry{AccountID: acme.ID, Type: billing.Charge,
			Amount: 2_500_000, Basis: billing.Manual}); err != nil {
			t.Fatal(err)
		}
		metrics.ObserveProxyRequest(200, 10, 10, 250*time.Second, 200*time.Second)

		if code, _ := scrape(t, hs.URL+"/metrics", ""); code != 401 {
			t.Fatalf("/metrics without the token: %d", code)
		}
		if code, _ := scrape(t, hs.URL+"/metrics", "wrong"); code != 401 {
			t.Fatalf("/metrics with a wrong token: %d", code)
		}
		code, body := scrape(t, hs.URL+"/metrics", "m-token")
		if code != 200 {
			t.Fatalf("/metrics: %d %s", code, body)
		}
		for _, series := range []string{
			`gpuproxy_proxy_request_duration_seconds_bucket{le="300"}`,
			`gpuproxy_proxy_ttfb_seconds_bucket{le="300"}`,
		} {
			if v, ok := metricValue(t, body, series); !ok || v != 1 {
				t.Errorf("%s = %v (present %v), want 1", series, v, ok)
			}
		}
		if v, ok := metricValue(t, body, `gpuproxy_proxy_request_duration_seconds_bucket{le="120"}`); !ok || v != 0 {
			t.Errorf("a 250 s request fell in the 120 s bucket: %v %v", v, ok)
		}
		if v, _ := metricValue(t, body, `gpuproxy_instances_running{provider="vast.ai"}`); v != 1 {
			t.Errorf("running instances = %v, want 1\n%s", v, body)
		}
		// The ratio is what GET /api/v1/spending shows, window by window.
		sp, err := guard.Spending(ctx, acme.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range sp.Windows {
			series := fmt.Sprintf(`gpuproxy_window_usage_ratio{account_id="%d",window_minutes="%d"}`, acme.ID, u.Minutes)
			want := float64(u.Spent+u.Held+u.Committed) / float64(u.Limit)
			if v, ok := metricValue(t, body, series); !ok || v != want || v == 0 {
				t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
			}
		}
		if strings.Contains(body, "acme") {
			t.Error("the metrics name an account: a tenant's string in a label")
		}
		if v, ok := metricValue(t, body, "gpuproxy_metering_lag_seconds"); !ok || v != 90 {
			t.Errorf("metering lag = %v (present %v), want 90", v, ok)
		}

		// A window that goes away stops being reported; a charged meter
		// has no lag left.
		if err := guard.SetLimits(ctx, acme.ID, []guardrails.Window{{Minutes: 60, Limit: 10 * usd}}, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := meterer.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		_, body = scrape(t, hs.URL+"/metrics", "m-token")
		if _, ok := metricValue(t, body, fmt.Sprintf(`gpuproxy_window_usage_ratio{account_id="%d",window_minutes="1440"}`, acme.ID)); ok {
			t.Error("the removed 1440-minute window is still reported")
		}
		if _, ok := metricValue(t, body, fmt.Sprintf(`gpuproxy_window_usage_ratio{account_id="%d",window_minutes="60"}`, acme.ID)); !ok {
			t.Error("the 60-minute window is gone")
		}
		if v, ok := metricValue(t, body, "gpuproxy_metering_lag_seconds"); !ok || v != 0 {
			t.Errorf("metering lag after a tick = %v (present %v), want 0", v, ok)
		}
		if _, err := st.MarkTerminated(ctx, inst.ID, meterNow, nil); err != nil {
			t.Fatal(err)
		}
		_, body = scrape(t, hs.URL+"/metrics", "m-token")
		if v, ok := metricValue(t, body, `gpuproxy_instances_running{provider="vast.ai"}`); ok && v != 0 {
			t.Errorf("running after termination = %v", v)
		}
		if _, ok := metricValue(t, body, "gpuproxy_metering_lag_seconds"); ok {
			t.Error("metering lag reported with no meter running")
		}
	})
}

// TestMetricsOwnListener: with NoMetricsRoute the API listener does not
// serve /metrics; MetricsListener serves it elsewhere, through the same
// pipeline: behind the token when one is set, and without one to
// loopback callers only (not to one a proxy forwarded).
func TestMetricsOwnListener(t *testing.T) {
	t.Parallel()
	st := dbtest.Open(t, dbtest.SQLite)
	newServer := func(token string) *server.Server {
		return server.New(server.Services{Auth: auth.New(st, auth.Options{}), Guard: guardrails.New(st, guardrails.Options{}),
			Ledger: billing.NewLedger(st, nil), Store: st, Metrics: server.NewMetrics(),
			RateLimiter: auth.NewSharedRateLimiter(100, auth.RateLimitOptions{})},
			server.Options{NoMetricsRoute: true, MetricsToken: token, Logger: newTestLogger(&strings.Builder{})})
	}
	srv := newServer("")
	api := httptest.NewServer(srv)
	t.Cleanup(api.Close)
	if code, _ := scrape(t, api.URL+"/metrics", ""); code != 404 {
		t.Fatalf("API listener /metrics: %d, want 404", code)
	}
	open := httptest.NewServer(srv.MetricsListener())
	t.Cleanup(open.Close)
	if code, body := scrape(t, open.URL+"/metrics", ""); code != 200 || !strings.Contains(body, "gpuproxy_http_requests_total") {
		t.Fatalf("own listener, no token, loopback caller: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, open.URL+"/metrics", nil)
	req.Header.Set("X-Forwarded-For", "198.51.100.7")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Fatalf("own listener, no token, a forwarded caller: %d, want 401", res.StatusCode)
	}
	if code, _ := scrape(t, open.URL+"/health", ""); code != 404 {
		t.Fatalf("own listener /health: %d, want 404", code)
	}
	closed := httptest.NewServer(newServer("t").MetricsListener())
	t.Cleanup(closed.Close)
	if code, _ := scrape(t, closed.URL+"/metrics", ""); code != 401 {
		t.Fatalf("own listener without token: %d", code)
	}
	if code, _ := scrape(t, closed.URL+"/metrics", "t"); code != 200 {
		t.Fatalf("own listener with token: %d", code)
	}
}
