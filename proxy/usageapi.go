package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// maxUsagePage is the largest page GET /api/v1/proxy/usage returns.
const maxUsagePage = 1000

// UsageJSON is one usage record as the API shows it.
type UsageJSON struct {
	ID         int64           `json:"id"`
	InstanceID string          `json:"instance_id"`
	Method     string          `json:"method"`
	Path       string          `json:"path"`
	Status     int             `json:"status"`
	BytesIn    int64           `json:"bytes_in"`
	BytesOut   int64           `json:"bytes_out"`
	LatencyMS  float64         `json:"latency_ms"`
	TTFBMS     float64         `json:"ttfb_ms"`
	Cost       gpuproxy.Micros `json:"cost"`
	At         time.Time       `json:"at"`
	RequestID  string          `json:"request_id"`
	// ServiceID is the service whose endpoint took the request (absent
	// for the instance proxy); Model and the token counts are the
	// answer's (absent when it reported none).
	ServiceID        string `json:"service_id,omitempty"`
	Model            string `json:"model,omitempty"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
}

// UsageTotalsJSON sums the records a query matches.
type UsageTotalsJSON struct {
	Requests     int64           `json:"requests"`
	Errors       int64           `json:"errors"`
	BytesIn      int64           `json:"bytes_in"`
	BytesOut     int64           `json:"bytes_out"`
	AvgLatencyMS float64         `json:"avg_latency_ms"`
	AvgTTFBMS    float64         `json:"avg_ttfb_ms"`
	Cost         gpuproxy.Micros `json:"cost"`
}

// UsagePageJSON is the body of GET /api/v1/proxy/usage.
type UsagePageJSON struct {
	Records    []UsageJSON     `json:"records"`
	Totals     UsageTotalsJSON `json:"totals"`
	NextCursor string          `json:"next_cursor,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ServeUsage is GET /api/v1/proxy/usage?from&to&instance_id&limit&cursor:
// the caller's own usage records, newest first, with the totals of
// everything the filter matches. from/to take RFC 3339 times or dates;
// cursor is the next_cursor of the previous page.
func (p *Proxy) ServeUsage(w http.ResponseWriter, r *http.Request) {
	pr, ok := httpapi.PrincipalFrom(r)
	if !ok {
		writeError(w, r, p.log, gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "missing or invalid API key or token"))
		return
	}
	q := r.URL.Query()
	if err := httpapi.KnownQuery(q, []string{"from", "to", "instance_id", "limit", "cursor"}); err != nil {
		writeError(w, r, p.log, err)
		return
	}
	f := gpuproxy.UsageFilter{AccountID: pr.AccountID, InstanceID: q.Get("instance_id"), Limit: 100}
	var err error
	if f.From, f.To, err = httpapi.TimeRange(q.Get); err != nil {
		writeError(w, r, p.log, err)
		return
	}
	if len(f.InstanceID) > 128 {
		writeError(w, r, p.log, gpuproxy.Invalid("instance_id", "must be at most 128 characters"))
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxUsagePage {
			writeError(w, r, p.log, gpuproxy.Invalid("limit", "must be a whole number from 1 to %d", maxUsagePage))
			return
		}
		f.Limit = n
	}
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			writeError(w, r, p.log, gpuproxy.Invalid("cursor", "must be the next_cursor of a previous page"))
			return
		}
		f.BeforeID = n
	}
	want := f.Limit
	f.Limit++ // one extra row tells whether another page exists
	recs, err := p.store.ListUsage(r.Context(), f)
	if err != nil {
		writeError(w, r, p.log, err)
		return
	}
	f.BeforeID = 0
	tot, err := p.store.UsageTotals(r.Context(), f)
	if err != nil {
		writeError(w, r, p.log, err)
		return
	}
	out := UsagePageJSON{Records: make([]UsageJSON, 0, min(len(recs), want))}
	if len(recs) > want {
		recs = recs[:want]
		out.NextCursor = strconv.FormatInt(recs[len(recs)-1].ID, 10)
	}
	for _, u := range recs {
		out.Records = append(out.Records, UsageJSON{ID: u.ID, InstanceID: u.InstanceID, Method: u.Method, Path: u.Path,
			Status: u.Status, BytesIn: u.BytesIn, BytesOut: u.BytesOut, LatencyMS: ms(u.Latency), TTFBMS: ms(u.TTFB),
			Cost: u.Cost, At: u.At, RequestID: u.RequestID, ServiceID: u.ServiceID, Model: u.Model,
			PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens})
	}
	out.Totals = UsageTotalsJSON{Requests: tot.Requests, Errors: tot.Errors, BytesIn: tot.BytesIn, BytesOut: tot.BytesOut,
		Cost: tot.Cost}
	if tot.Requests > 0 {
		out.Totals.AvgLatencyMS = ms(tot.Latency / time.Duration(tot.Requests))
		out.Totals.AvgTTFBMS = ms(tot.TTFB / time.Duration(tot.Requests))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}
