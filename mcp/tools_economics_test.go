package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/app"
	"github.com/aiserve/gpuproxy/auth"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/economics"
	"github.com/aiserve/gpuproxy/economics/economicstest"
	"github.com/aiserve/gpuproxy/guardrails"
)

// economicsStack is the app over a store of kind k holding the economics
// fixture for acme (and other), its clock at the fixture's Now.
func economicsStack(t *testing.T, k dbtest.Kind) (*stack, gpuproxy.Account, gpuproxy.Account) {
	t.Helper()
	st := dbtest.Open(t, k)
	a, err := app.New(context.Background(), app.Config{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Version: "test", Store: st, Auth: auth.Options{CacheTTL: -1}, RateLimit: 100000, NoInferenceProxy: true,
		Guard: guardrails.Options{Now: func() time.Time { return economicstest.Now }}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	hs := httptest.NewServer(a.Server)
	t.Cleanup(hs.Close)
	s := &stack{t: t, url: hs.URL, mcp: a.MCP, store: a.Store, auth: a.Auth, guard: a.Guard, ledger: a.Ledger,
		fleet: a.Fleet, svcs: a.Services}
	ctx := context.Background()
	acme, err := a.Auth.CreateAccount(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	other, err := a.Auth.CreateAccount(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	economicstest.Seed(t, st, acme.ID, other.ID)
	return s, acme, other
}

// TestEconomicsTool: get_unit_economics answers the fixture's hand-worked
// summary for every grouping (the structured result is REST's JSON,
// valid against the announced output schema), answers "what did
// llama-70b cost per million tokens" with one row and a sentence, and
// refuses bad arguments naming the field; the other account sees only
// its own; on SQLite and Postgres.
func TestEconomicsTool(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s, acme, _ := economicsStack(t, k)
			key, _ := s.key("acme", "finance")
			cs := s.connect(viaStreamable, key, nil)
			valid := outputValidator(t, cs)
			from, to := economicstest.From.Format(time.RFC3339), economicstest.To.Format(time.RFC3339)
			for _, g := range []economics.GroupBy{economics.ByInstance, economics.ByModel, economics.ByKey, economics.ByService} {
				res := callTool(t, cs, "get_unit_economics", map[string]any{"from": from, "to": to, "group_by": string(g)})
				if res.IsError {
					t.Fatalf("%s: %s", g, text(res))
				}
				valid("get_unit_economics", res)
				want := economicstest.Want(g)
				want.Query.AccountID = acme.ID
				sameJSON(t, string(g), res.StructuredContent, economics.NewSummaryJSON("acme", want))
				if tx := text(res); !strings.Contains(tx, "Unit economics of account acme by "+string(g)) ||
					!strings.Contains(tx, "TOTAL (account)") || !strings.Contains(tx, "$2165.22") {
					t.Errorf("%s text:\n%s", g, tx)
				}
			}

			// The assistant's question: one model's row and a sentence.
			res := callTool(t, cs, "get_unit_economics", map[string]any{"from": from, "to": to, "model": economicstest.Llama})
			valid("get_unit_economics", res)
			out := structured[economics.SummaryJSON](t, res)
			if out.GroupBy != economics.ByModel || len(out.Rows) != 1 || out.Rows[0].Group != economicstest.Llama ||
				out.Rows[0].GPUCostMicros != 19_357_144 || *out.Rows[0].CostPer1MOutputTokensMicros != 2_037_594_105 {
				t.Fatalf("llama: %+v", out)
			}
			if tx := text(res); !strings.HasPrefix(tx, "model llama-70b cost $19.357144 of GPU time from 2026-11-02 00:00 "+
				"to 2026-11-02 10:00 UTC for 9500 output tokens (13000 in all): $2037.59 per million output tokens, "+
				"$1489.01 per million tokens; 5 requests (2 errors), utilization 5.0%.") {
				t.Errorf("llama text:\n%s", tx)
			}
			res = callTool(t, cs, "get_unit_economics", map[string]any{"from": from, "to": to, "instance_id": economicstest.InstB})
			if out := structured[economics.SummaryJSON](t, res); len(out.Rows) != 1 || out.Rows[0].Utilization != 0.1 {
				t.Fatalf("instance B: %+v", out)
			}
			res = callTool(t, cs, "get_unit_economics", map[string]any{"from": from, "to": to, "model": "gpt-9"})
			if out := structured[economics.SummaryJSON](t, res); len(out.Rows) != 0 ||
				!strings.HasPrefix(text(res), `No model "gpt-9" in account acme`) {
				t.Fatalf("unknown model: %+v\n%s", out, text(res))
			}

			for _, c := range []struct {
				args  map[string]any
				field string
			}{
				{map[string]any{"from": "last week"}, "from"},
				{map[string]any{"from": to, "to": from}, "to"},
				{map[string]any{"from": "2025-01-01", "to": "2026-01-02"}, "to"},
				{map[string]any{"group_by": "key", "model": economicstest.Llama}, "model"},
				{map[string]any{"model": economicstest.Llama, "instance_id": economicstest.InstA}, "instance_id"},
			} {
				res := callTool(t, cs, "get_unit_economics", c.args)
				if !res.IsError || !strings.Contains(text(res), "Error (invalid): "+c.field+": ") {
					t.Errorf("%v: %s", c.args, text(res))
				}
			}
			if res := callTool(t, cs, "get_unit_economics", map[string]any{"group_by": "gpu"}); !res.IsError {
				t.Errorf("group_by gpu: %s", text(res))
			}

			// The other account's key sees its own instance only.
			okey, _ := s.key("other", "assistant")
			ocs := s.connect(viaStreamable, okey, nil)
			res = callTool(t, ocs, "get_unit_economics", map[string]any{"from": from, "to": to})
			out = structured[economics.SummaryJSON](t, res)
			if out.Account != "other" || len(out.Rows) != 2 || out.Rows[0].Group != economicstest.InstX ||
				out.Totals.GPUCostMicros != 50_000_000 || strings.Contains(text(res), "RTX 4090") {
				t.Fatalf("other: %+v\n%s", out, text(res))
			}
		})
	}
}

// sameJSON compares a structured result with what want renders to.
func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	var g, w any
	_ = json.Unmarshal(gb, &g)
	_ = json.Unmarshal(wb, &w)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %s\nwant %s", what, gb, wb)
	}
}

// TestGetServiceToDate: get_service carries what the service cost and
// carried since it was created, the unit economics summary by service
// over [created_at, now) to the micro-dollar, valid against the tool's
// output schema, and says it in its text; on SQLite and Postgres.
func TestGetServiceToDate(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			s, acme, _ := economicsStack(t, k)
			key, _ := s.key("acme", "engineer")
			cs := s.connect(viaStreamable, key, nil)
			valid := outputValidator(t, cs)
			res := callTool(t, cs, "get_service", map[string]any{"service": economicstest.ServiceName})
			if res.IsError {
				t.Fatalf("get_service: %s", text(res))
			}
			valid("get_service", res)
			got := structured[struct {
				CreatedAt time.Time         `json:"created_at"`
				ToDate    *economics.ToDate `json:"to_date"`
			}](t, res)
			if got.ToDate == nil || !got.ToDate.From.Equal(got.CreatedAt) || !got.ToDate.To.Equal(economicstest.Now) {
				t.Fatalf("to_date %+v, service created %s", got.ToDate, got.CreatedAt)
			}
			sum, err := economics.New(s.store, func() time.Time { return economicstest.Now }).Summary(context.Background(),
				economics.Query{AccountID: acme.ID, From: got.ToDate.From, To: got.ToDate.To, GroupBy: economics.ByService})
			if err != nil {
				t.Fatal(err)
			}
			var row economics.Row
			for _, r := range sum.Rows {
				if r.Group == economicstest.ServiceName {
					row = r
				}
			}
			td := *got.ToDate
			if td.GPUCost != row.GPUCost || td.ProxyCharges != row.ProxyCharges || td.Requests != row.Requests ||
				td.PromptTokens != row.PromptTokens || td.CompletionTokens != row.CompletionTokens || row.CompletionTokens == 0 {
				t.Errorf("to_date %+v, the summary by service %+v", td, row)
			}
			if txt := text(res); !strings.Contains(txt, fmt.Sprintf("%d tokens in, %d out over %d requests", row.PromptTokens,
				row.CompletionTokens, row.Requests)) {
				t.Errorf("get_service text lacks the figures to date:\n%s", txt)
			}
		})
	}
}
