package console_test

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/economics/economicstest"
)

// seedEconomics creates the account acme holding the economics fixture
// (economicstest.Seed, with the stack's other as the account it must
// never show) and returns it with a key of each preset of acme's, and
// one with spending:read only.
func seedEconomics(t *testing.T, s *stack) (gpuproxy.Account, map[string]string) {
	t.Helper()
	ctx := context.Background()
	acme, err := s.auth.CreateAccount(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	economicstest.Seed(t, s.store, acme.ID, s.other.ID)
	keys := map[string]string{}
	for _, p := range []string{"finance", "engineer"} {
		if keys[p], _, err = s.auth.CreateKey(ctx, "acme", p+" key", gpuproxy.Presets[p]); err != nil {
			t.Fatal(err)
		}
	}
	if keys["spending"], _, err = s.auth.CreateKey(ctx, "acme", "spending key", []gpuproxy.Scope{gpuproxy.ScopeSpendingRead}); err != nil {
		t.Fatal(err)
	}
	return acme, keys
}

// fixturePeriod is the economics fixture's period as the page's query.
var fixturePeriod = "from=" + url.QueryEscape(economicstest.From.Format(time.RFC3339)) +
	"&to=" + url.QueryEscape(economicstest.To.Format(time.RFC3339))

// shownRow is one row of the unit economics table as the page has it:
// each cell's text, and its data-micros or data-value.
type shownRow struct {
	group string
	text  map[string]string
	num   map[string]string // "" absent
}

var (
	reEconRow  = regexp.MustCompile(`(?s)<tr data-group="([^"]*)"[^>]*>(.*?)</tr>`)
	reEconCell = regexp.MustCompile(`(?s)<td[^>]* data-field="([^"]+)"((?: data-(?:micros|value)="[^"]*")?)>(.*?)</td>`)
	reTags     = regexp.MustCompile(`<[^>]+>`)
	reNumAttr  = regexp.MustCompile(`data-(?:micros|value)="([^"]*)"`)
)

// economicsTable reads the table's body rows and its totals row.
func economicsTable(t *testing.T, body string) (rows []shownRow, totals shownRow) {
	t.Helper()
	tbody, tfoot, ok := strings.Cut(body, "<tfoot>")
	if !ok {
		t.Fatalf("no table totals in the page: %.400s", body)
	}
	_, tbody, _ = strings.Cut(tbody, `<table id="economics">`)
	parse := func(part string) []shownRow {
		var out []shownRow
		for _, m := range reEconRow.FindAllStringSubmatch(part, -1) {
			r := shownRow{group: html.UnescapeString(m[1]), text: map[string]string{}, num: map[string]string{}}
			for _, c := range reEconCell.FindAllStringSubmatch(m[2], -1) {
				r.text[c[1]] = strings.TrimSpace(html.UnescapeString(reTags.ReplaceAllString(c[3], "")))
				if n := reNumAttr.FindStringSubmatch(c[2]); n != nil {
					r.num[c[1]] = n[1]
				}
			}
			out = append(out, r)
		}
		return out
	}
	tot := parse(tfoot)
	if len(tot) != 1 {
		t.Fatalf("%d totals rows", len(tot))
	}
	return parse(tbody), tot[0]
}

// checkRow compares a shown row with a summary's row: every figure, the
// money exact to the micro-dollar.
func checkRow(t *testing.T, what string, got shownRow, want economics.Row) {
	t.Helper()
	opt := func(m *gpuproxy.Micros) string {
		if m == nil {
			return ""
		}
		return strconv.FormatInt(int64(*m), 10)
	}
	count := func(n int64) string { return strconv.FormatInt(n, 10) }
	plain := func(s string) string { return strings.ReplaceAll(s, ",", "") }
	for _, c := range []struct{ field, got, want string }{
		{"label", got.text["label"], want.Label},
		{"requests", plain(got.text["requests"]), count(want.Requests)},
		{"errors", plain(got.text["errors"]), count(want.Errors)},
		{"prompt-tokens", plain(got.text["prompt-tokens"]), count(want.PromptTokens)},
		{"completion-tokens", plain(got.text["completion-tokens"]), count(want.CompletionTokens)},
		{"gpu-cost", got.num["gpu-cost"], opt(&want.GPUCost)},
		{"proxy-charges", got.num["proxy-charges"], opt(&want.ProxyCharges)},
		{"per-1m-output", got.num["per-1m-output"], opt(want.PerMillionOutput)},
		{"per-1m-output-busy", got.num["per-1m-output-busy"], opt(want.PerMillionOutputBusy)},
	} {
		if c.got != c.want {
			t.Errorf("%s %s: shown %q, want %q", what, c.field, c.got, c.want)
		}
	}
	// The shown amounts say the same as their data-micros.
	if m, _ := strconv.ParseInt(got.num["gpu-cost"], 10, 64); got.text["gpu-cost"] != money(gpuproxy.Micros(m)) {
		t.Errorf("%s GPU cost shown %q, data-micros %s", what, got.text["gpu-cost"], got.num["gpu-cost"])
	}
	if want.PerMillionOutput == nil && got.text["per-1m-output"] != "—" {
		t.Errorf("%s $/1M out shown %q without output tokens", what, got.text["per-1m-output"])
	}
	if u, err := strconv.ParseFloat(got.num["utilization"], 64); err != nil || u != want.Utilization {
		t.Errorf("%s utilization %s (%v), want %v", what, got.num["utilization"], err, want.Utilization)
	}
	if wantPct := strconv.FormatFloat(want.Utilization*100, 'f', 1, 64) + "%"; got.text["utilization"] != wantPct {
		t.Errorf("%s utilization shown %q, want %q", what, got.text["utilization"], wantPct)
	}
}

// reCircle is a point of the line chart with its series.
var (
	reSeries = regexp.MustCompile(`(?s)<g class="series (s\d)" data-series="([^"]*)">(.*?)</g>`)
	reCircle = regexp.MustCompile(`<circle class="pt" [^>]*data-micros="(-?\d+)"><title>([^<]*)</title>`)
)

// TestEconomicsPage: for every grouping, the page's rows and totals are
// the summary of the fixture (worked out by hand in economicstest, and
// what economics.Service answers), in its order; its CSV download is the
// API's CSV of that summary; the chart draws one series per model with a
// point for each bucket the service's by-model series has a cost per
// million output tokens in. Without a query the page shows the last 7
// days by model.
func TestEconomicsPage(t *testing.T) {
	s := newStack(t, stackOpts{})
	acme, keys := seedEconomics(t, s)
	ctx := context.Background()
	svc := economics.New(s.store, nil)
	fin := s.signIn(keys["finance"])
	for _, g := range []economics.GroupBy{economics.ByModel, economics.ByInstance, economics.ByKey, economics.ByService} {
		st, body := s.get(fin, "/console/economics?"+fixturePeriod+"&group_by="+string(g))
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", g, st, errorMessage(body))
		}
		want := economicstest.Want(g)
		q := economics.Query{AccountID: acme.ID, From: economicstest.From, To: economicstest.To, GroupBy: g}
		got, err := svc.Summary(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		rows, totals := economicsTable(t, body)
		if len(rows) != len(want.Rows) || len(rows) != len(got.Rows) {
			t.Fatalf("%s: %d rows shown, fixture %d, service %d", g, len(rows), len(want.Rows), len(got.Rows))
		}
		for i := range rows {
			if rows[i].group != want.Rows[i].Group || rows[i].group != got.Rows[i].Group {
				t.Errorf("%s row %d: group %q, fixture %q, service %q", g, i, rows[i].group, want.Rows[i].Group, got.Rows[i].Group)
			}
			w, sr := want.Rows[i], got.Rows[i]
			if g == economics.ByKey {
				// By key, the group column shows the key's name (the label)
				// and what the ledger charged it is a column of its own.
				if w.Group != "" && !strings.HasPrefix(rows[i].text["group"], w.Label+" · ") {
					t.Errorf("key row %q shown as %q, want its name %q first", w.Group, rows[i].text["group"], w.Label)
				}
				if rows[i].num["charged"] != strconv.FormatInt(int64(*w.Charged), 10) {
					t.Errorf("key row %q charged %s shown, want %s", w.Group, rows[i].num["charged"], *w.Charged)
				}
				w.Label, sr.Label = "", ""
			}
			checkRow(t, fmt.Sprintf("%s row %q", g, rows[i].group), rows[i], w)
			checkRow(t, fmt.Sprintf("%s row %q (service)", g, rows[i].group), rows[i], sr)
		}
		checkRow(t, string(g)+" totals", totals, want.Totals)
		if !strings.Contains(body, `<option selected>`+string(g)+`</option>`) {
			t.Errorf("%s: the grouping is not the selected one", g)
		}

		// The CSV link downloads the API's CSV of exactly this summary.
		m := regexp.MustCompile(`id="csv" href="([^"]+)"`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("%s: no CSV link", g)
		}
		res, err := fin.Get(s.url + html.UnescapeString(m[1]))
		if err != nil {
			t.Fatal(err)
		}
		var csvBody bytes.Buffer
		_, _ = csvBody.ReadFrom(res.Body)
		res.Body.Close()
		var wantCSV bytes.Buffer
		if err := economics.WriteCSV(&wantCSV, want); err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/csv") ||
			res.Header.Get("Content-Disposition") != `attachment; filename="usage-summary-acme-by-`+string(g)+`.csv"` ||
			csvBody.String() != wantCSV.String() {
			t.Errorf("%s CSV: %d %v\n%s\nwant\n%s", g, res.StatusCode, res.Header, csvBody.String(), wantCSV.String())
		}

		// The chart: per model, per hour (the period is 10 hours).
		q.GroupBy = economics.ByModel
		pts, err := svc.Series(ctx, q, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		want1M := map[string][]string{}
		for _, p := range pts {
			if p.PerMillionOutput != nil {
				want1M[p.Group] = append(want1M[p.Group], strconv.FormatInt(int64(*p.PerMillionOutput), 10))
			}
		}
		shown := map[string][]string{}
		for _, sr := range reSeries.FindAllStringSubmatch(body, -1) {
			for _, c := range reCircle.FindAllStringSubmatch(sr[3], -1) {
				shown[sr[2]] = append(shown[sr[2]], c[1])
				if !strings.HasPrefix(html.UnescapeString(c[2]), sr[2]+", 2026-11-02 ") {
					t.Errorf("%s: point title %q", g, c[2])
				}
			}
		}
		if fmt.Sprint(shown) != fmt.Sprint(want1M) || len(want1M) != 2 {
			t.Errorf("%s: chart points %v, series %v", g, shown, want1M)
		}
		if !strings.Contains(body, "Cost per 1M output tokens per model, per hour") {
			t.Errorf("%s: the chart is not hourly", g)
		}
	}

	// Without a query: the API's default period (the last 168 hours up
	// to now, economics.DefaultPeriod), by model, and points per day.
	st, body := s.get(fin, "/console/economics")
	m := regexp.MustCompile(`id="period" data-from="([^"]+)" data-to="([^"]+)"`).FindStringSubmatch(body)
	if st != 200 || m == nil {
		t.Fatalf("default page: %d %s", st, errorMessage(body))
	}
	from, err1 := time.Parse(time.RFC3339Nano, m[1])
	to, err2 := time.Parse(time.RFC3339Nano, m[2])
	if err1 != nil || err2 != nil || to.Sub(from) != economics.DefaultPeriod ||
		!from.Equal(economics.Query{}.WithDefaults(to).From) || time.Since(to) > time.Minute {
		t.Errorf("default period %s to %s", m[1], m[2])
	}
	if !strings.Contains(body, `<option selected>model</option>`) || !strings.Contains(body, `id="no-chart"`) {
		t.Error("the default page is not by model, or draws a chart of no tokens")
	}
	if !strings.Contains(body, `<a id="nav-economics" href="/console/economics" aria-current="page">Unit economics</a>`) {
		t.Error("the navigation does not mark the unit economics page")
	}
}

// TestEconomicsRefusals: a bad query is a 400 naming its field, on the
// page and its CSV; another account's page is not found but by an admin,
// whose links keep the account; a key without billing:read is refused
// and not linked; finance and engineer keys see it.
func TestEconomicsRefusals(t *testing.T) {
	s := newStack(t, stackOpts{})
	_, keys := seedEconomics(t, s)
	fin := s.signIn(keys["finance"])
	for _, tc := range []struct{ query, want string }{
		{"from=yesterday", "from: must be an RFC 3339 time"},
		{"to=2026-13-01", "to: must be an RFC 3339 time"},
		{"from=2026-11-02T10:00:00Z&to=2026-11-02T10:00:00Z", "to: must be after from"},
		{"from=2025-01-01&to=2026-01-02", "to: must be at most 366 days after from"},
		{"group_by=gpu", "group_by: must be instance, model, key or service"},
		{"group_by=day&" + fixturePeriod, "group_by: must be"},
		{"acount=other", "unknown query parameter acount (known: account, from, to, group_by)"},
	} {
		for _, path := range []string{"/console/economics?", "/console/economics.csv?"} {
			st, body := s.get(fin, path+tc.query)
			if msg := errorMessage(body); st != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Errorf("GET %s%s: %d %q, want 400 saying %q", path, tc.query, st, msg, tc.want)
			}
		}
	}

	eng, adm := s.signIn(s.keys["engineer"]), s.signIn(s.keys["admin"])
	for _, tc := range []struct {
		who  string
		c    *http.Client
		path string
		want int
	}{
		{"demo's engineer", eng, "/console/economics?account=acme", http.StatusNotFound},
		{"demo's engineer", eng, "/console/economics.csv?account=acme&" + fixturePeriod, http.StatusNotFound},
		{"demo's engineer", eng, "/console/economics", http.StatusOK},
		{"demo's finance", s.signIn(s.keys["finance"]), "/console/economics", http.StatusOK},
		{"demo's assistant", s.signIn(s.keys["assistant"]), "/console/economics", http.StatusOK},
		{"acme's engineer", s.signIn(keys["engineer"]), "/console/economics?" + fixturePeriod, http.StatusOK},
		{"admin", adm, "/console/economics?account=acme&" + fixturePeriod, http.StatusOK},
		{"admin", adm, "/console/economics.csv?account=acme&" + fixturePeriod, http.StatusOK},
		{"admin", adm, "/console/economics?account=nobody", http.StatusNotFound},
		{"spending:read only", s.signIn(keys["spending"]), "/console/economics", http.StatusForbidden},
		{"spending:read only", s.signIn(keys["spending"]), "/console/economics.csv", http.StatusForbidden},
	} {
		res, err := tc.c.Get(s.url + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%s GET %s: %d, want %d", tc.who, tc.path, res.StatusCode, tc.want)
		}
	}

	// The admin sees acme's rows, and the page's links keep the account.
	_, body := s.get(adm, "/console/economics?account=acme&group_by=instance&"+fixturePeriod)
	rows, _ := economicsTable(t, body)
	if len(rows) != len(economicstest.Want(economics.ByInstance).Rows) || rows[0].group != economicstest.InstA {
		t.Errorf("admin's view of acme: %d rows", len(rows))
	}
	for _, want := range []string{
		`<input type="hidden" name="account" value="acme">`,
		`<a href="/console/instances/` + economicstest.InstA + `?account=acme">` + economicstest.InstA + `</a>`,
		`<a id="nav-economics" href="/console/economics?account=acme" aria-current="page">`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("admin's view of acme lacks %s", want)
		}
	}
	if m := regexp.MustCompile(`id="csv" href="([^"]+)"`).FindStringSubmatch(body); m == nil ||
		!strings.Contains(html.UnescapeString(m[1]), "account=acme") {
		t.Errorf("admin's CSV link %v does not name acme", m)
	}

	// Links: finance and engineer keys have it, a key without
	// billing:read has not.
	if _, body := s.get(s.signIn(keys["spending"]), "/console/"); strings.Contains(body, "nav-economics") {
		t.Error("a key without billing:read is linked to the unit economics page")
	}
	if _, body := s.get(fin, "/console/"); !strings.Contains(body, `id="nav-economics"`) {
		t.Error("a finance key is not linked to the unit economics page")
	}
}
