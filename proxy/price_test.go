package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/testpoll"
	"github.com/aiserve/gpuproxy/proxy"
)

// pricedUpstream answers like tokenUpstream and records the max_tokens
// each request asked.
type pricedUpstream struct {
	tokenUpstream
	maxTokens atomic.Int64
	calls     atomic.Int64
}

func (u *pricedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.calls.Add(1)
	b, _ := io.ReadAll(r.Body)
	var m struct {
		MaxTokens int64 `json:"max_tokens"`
	}
	_ = json.Unmarshal(b, &m)
	u.maxTokens.Store(m.MaxTokens)
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	u.tokenUpstream.ServeHTTP(w, r)
}

// ledgerCharges sums the account's charges minus refunds.
func ledgerCharges(t *testing.T, e *env) gpuproxy.Micros {
	t.Helper()
	entries, err := e.store.ListEntries(context.Background(), billing.Filter{AccountID: e.acct.ID, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var sum gpuproxy.Micros
	for _, en := range entries {
		switch en.Type {
		case billing.Charge:
			sum += en.Amount
		case billing.Refund:
			sum -= en.Amount
		}
	}
	return sum
}

// TestTokenPricesChargeCountedTokens: with token prices on, a request
// without max_tokens is refused naming it (or, with a default, is given
// it); a priced request is charged the per-request cost plus its counted
// tokens (usage record and ledger, once the gate settles), a stream the
// same, and a request whose most expensive outcome does not fit the
// window is refused naming the window and the reserved cost.
func TestTokenPricesChargeCountedTokens(t *testing.T) {
	price := gpuproxy.TokenPrice{InputPer1M: 2 * gpuproxy.MicrosPerUSD, OutputPer1M: 10 * gpuproxy.MicrosPerUSD}
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			up := &pricedUpstream{}
			hs := httptest.NewServer(up)
			defer hs.Close()
			e := newEnv(t, envOpts{kind: k, lease: 50 * time.Millisecond,
				proxy: proxy.Options{TokenPrice: price, Cost: 100}})
			e.fleet.add(e.acct.ID, "gpi_tok", hs.URL)
			path := "/api/v1/proxy/gpi_tok/v1/chat/completions"
			r := e.do(e.key, "POST", path, []byte(`{"model":"x","messages":[]}`), nil)
			if r.Status != 400 || !strings.HasPrefix(r.ErrMessage(), "max_tokens: ") {
				t.Fatalf("no max_tokens: %d %s", r.Status, r.Body)
			}
			r = e.do(e.key, "POST", path, []byte(`{"model":"x","max_tokens":50,"messages":[]}`), nil)
			if r.Status != 200 {
				t.Fatalf("priced: %d %s", r.Status, r.Body)
			}
			r = e.do(e.key, "POST", path, []byte(`{"model":"x","max_tokens":50,"stream":true,"messages":[]}`), nil)
			if r.Status != 200 || strings.Contains(string(r.Body), `"usage"`) {
				t.Fatalf("priced stream: %d %s", r.Status, r.Body)
			}
			page := e.usage(e.key, "", 3)
			want := []gpuproxy.Micros{100 + price.Cost(11, 5), 100 + price.Cost(21, 9)} // newest first
			var sum gpuproxy.Micros
			for i, w := range want {
				if got := page.Records[i].Cost; got != w {
					t.Errorf("record %d cost %s, want %s", i, got, w)
				}
				sum += w
			}
			// The gate settles its lease: the ledger holds exactly the
			// counted tokens' charges.
			testpoll.Wait(5*time.Second, func() bool { return ledgerCharges(t, e) == sum })
			if got := ledgerCharges(t, e); got != sum {
				t.Fatalf("ledger charges %s, want %s", got, sum)
			}
			// A window that cannot fit the most expensive outcome: 402
			// naming it and the reserved cost, nothing sent.
			if err := e.guard.SetLimits(context.Background(), e.acct.ID,
				[]guardrails.Window{{Minutes: 60, Limit: sum + 1000}}, ""); err != nil {
				t.Fatal(err)
			}
			// Once the gate sees the new limit.
			testpoll.Wait(5*time.Second, func() bool {
				r = e.do(e.key, "POST", path, []byte(`{"model":"x","max_tokens":4000,"messages":[]}`), nil)
				return r.Status != 200
			})
			if r.Status != 402 || !strings.Contains(r.ErrMessage(), "60-minute window") || !strings.Contains(r.ErrMessage(), "0.040") {
				t.Fatalf("over the limit: %d %s", r.Status, r.Body)
			}
		})
	}
}

// TestTokenPriceDefaultMaxTokens: with DefaultMaxTokens a request
// without max_tokens is given it (the instance sees it) and admitted.
func TestTokenPriceDefaultMaxTokens(t *testing.T) {
	up := &pricedUpstream{}
	hs := httptest.NewServer(up)
	defer hs.Close()
	e := newEnv(t, envOpts{proxy: proxy.Options{TokenPrice: gpuproxy.TokenPrice{OutputPer1M: gpuproxy.MicrosPerUSD},
		DefaultMaxTokens: 256}})
	e.fleet.add(e.acct.ID, "gpi_tok", hs.URL)
	r := e.do(e.key, "POST", "/api/v1/proxy/gpi_tok/v1/chat/completions", []byte(`{"model":"x","messages":[]}`), nil)
	if r.Status != 200 || up.maxTokens.Load() != 256 {
		t.Fatalf("%d, upstream saw max_tokens %d: %s", r.Status, up.maxTokens.Load(), r.Body)
	}
}

// slowStream is an upstream whose stream pauses mid-way for pause.
type slowStream struct {
	pause time.Duration
}

func (s slowStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	f := w.(http.Flusher)
	write := func(ev string) { _, _ = io.WriteString(w, "data: "+ev+"\n\n"); f.Flush() }
	write(`{"model":"m","choices":[{"delta":{"content":"one"}}]}`)
	// pace: holds the stream open past its lease.
	time.Sleep(s.pause)
	write(`{"model":"m","choices":[{"delta":{"content":" two"}}]}`)
	write(`{"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}`)
	write("[DONE]")
}

// TestTokenPriceLateSettlement: a priced stream that outlives its lease
// (settled meanwhile, the stream counted at its admitted cost) is
// amended when it ends: the admitted cost refunded, the counted tokens
// charged; the ledger ends exactly at the counted tokens.
func TestTokenPriceLateSettlement(t *testing.T) {
	price := gpuproxy.TokenPrice{InputPer1M: 2 * gpuproxy.MicrosPerUSD, OutputPer1M: 10 * gpuproxy.MicrosPerUSD}
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			hs := httptest.NewServer(slowStream{pause: 800 * time.Millisecond})
			defer hs.Close()
			e := newEnv(t, envOpts{kind: k, lease: 30 * time.Millisecond, settle: 50 * time.Millisecond,
				proxy: proxy.Options{TokenPrice: price}})
			e.fleet.add(e.acct.ID, "gpi_slow", hs.URL)
			body := `{"model":"x","max_tokens":1000,"stream":true,"messages":[]}`
			// At least the output reservation (the prompt estimate counts
			// the body as sent, stream_options added).
			reserved := price.Cost(0, 1000)
			done := make(chan struct{})
			go func() {
				defer close(done)
				r := e.do(e.key, "POST", "/api/v1/proxy/gpi_slow/v1/chat/completions", []byte(body), nil)
				if r.Status != 200 {
					t.Errorf("stream: %d %s", r.Status, r.Body)
				}
			}()
			// Mid-stream the lease is settled, the stream charged its
			// admitted cost.
			testpoll.Wait(3*time.Second, func() bool { return ledgerCharges(t, e) >= reserved })
			if got := ledgerCharges(t, e); got < reserved {
				t.Fatalf("mid-stream charges %s, want at least the admitted %s", got, reserved)
			}
			<-done
			want := price.Cost(7, 2)
			testpoll.Wait(3*time.Second, func() bool { return ledgerCharges(t, e) == want })
			if got := ledgerCharges(t, e); got != want {
				t.Fatalf("after the stream: charges %s, want the counted %s", got, want)
			}
		})
	}
}

// priceWait bounds how long a changed account price may take to apply:
// the proxy reuses a price read for a second (accountPriceTTL).
const priceWait = 3 * time.Second

// TestAccountTokenPrice: an account's own price replaces the proxy-wide
// one for its requests (within a second of being set), and removing it
// brings the proxy-wide one back.
func TestAccountTokenPrice(t *testing.T) {
	up := &pricedUpstream{}
	hs := httptest.NewServer(up)
	defer hs.Close()
	e := newEnv(t, envOpts{})
	e.fleet.add(e.acct.ID, "gpi_tok", hs.URL)
	sent := 0
	send := func() (int, gpuproxy.Micros) {
		t.Helper()
		sent++
		r := e.do(e.key, "POST", "/api/v1/proxy/gpi_tok/v1/chat/completions", []byte(`{"model":"x","max_tokens":9,"messages":[]}`), nil)
		if r.Status != 200 && r.Status != 400 {
			t.Fatalf("%d %s", r.Status, r.Body)
		}
		if r.Status != 200 {
			return r.Status, 0
		}
		page := e.usage(e.key, "", sent)
		return r.Status, page.Records[0].Cost
	}
	if _, cost := send(); cost != 0 {
		t.Fatalf("no price: charged %s", cost)
	}
	price := gpuproxy.TokenPrice{InputPer1M: 5 * gpuproxy.MicrosPerUSD, OutputPer1M: 7 * gpuproxy.MicrosPerUSD}
	if err := e.store.SetAccountTokenPrice(context.Background(), e.acct.ID, &price); err != nil {
		t.Fatal(err)
	}
	// The proxy reads it again once its cached price (a second) expires:
	// requests until then are charged the proxy-wide price (none).
	// The upstream counts 21 prompt tokens, more than the body's 42
	// bytes / 3 it was admitted for: the charge stops at the admission.
	want := min(price.Cost(21, 9), price.Cost(14, 9))
	var cost gpuproxy.Micros
	if !testpoll.Wait(priceWait, func() bool { _, cost = send(); return cost != 0 }) || cost != want {
		t.Fatalf("the account's price: charged %s, want %s", cost, want)
	}
	if err := e.store.SetAccountTokenPrice(context.Background(), e.acct.ID, nil); err != nil {
		t.Fatal(err)
	}
	if !testpoll.Wait(priceWait, func() bool { _, cost = send(); return cost != want }) || cost != 0 {
		t.Fatalf("the price removed: charged %s", cost)
	}
}

// TestTokenPriceBadBody: with token prices on, a body whose max_tokens,
// max_completion_tokens or n is a fraction, of the wrong type or out of
// range is a 400 naming the field and its range, before any admission:
// not clamped and refused as a 402 for an absurd reservation, and
// nothing reaches the instance.
func TestTokenPriceBadBody(t *testing.T) {
	price := gpuproxy.TokenPrice{InputPer1M: 2 * gpuproxy.MicrosPerUSD, OutputPer1M: 10 * gpuproxy.MicrosPerUSD}
	up := &pricedUpstream{}
	hs := httptest.NewServer(up)
	defer hs.Close()
	e := newEnv(t, envOpts{kind: dbtest.SQLite, proxy: proxy.Options{TokenPrice: price}})
	e.fleet.add(e.acct.ID, "gpi_tok", hs.URL)
	path := "/api/v1/proxy/gpi_tok/v1/chat/completions"
	for _, tc := range []struct{ body, field, want string }{
		{`{"model":"x","max_tokens":1e12,"messages":[]}`, "max_tokens", "must be an integer from 1 to 1000000, got 1e12"},
		{`{"model":"x","max_tokens":1000000000000,"messages":[]}`, "max_tokens", "from 1 to 1000000"},
		{`{"model":"x","max_tokens":2.5,"messages":[]}`, "max_tokens", "got 2.5"},
		{`{"model":"x","max_tokens":"9","messages":[]}`, "max_tokens", `got "9"`},
		{`{"model":"x","max_tokens":0,"messages":[]}`, "max_tokens", "got 0"},
		{`{"model":"x","max_completion_tokens":-4,"messages":[]}`, "max_completion_tokens", "got -4"},
		{`{"model":"x","max_tokens":9,"n":1e9,"messages":[]}`, "n", "must be an integer from 1 to 128, got 1e9"},
		{`{"model":"x","max_tokens":9,"n":1000000000,"messages":[]}`, "n", "from 1 to 128"},
	} {
		r := e.do(e.key, "POST", path, []byte(tc.body), nil)
		if r.Status != 400 || r.ErrDetails()["field"] != tc.field || !strings.Contains(r.ErrMessage(), tc.want) {
			t.Errorf("%s: %d %s, want 400 naming %s: …%s", tc.body, r.Status, r.Body, tc.field, tc.want)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("%d bad bodies reached the instance", n)
	}
	snap, err := e.guard.Spending(context.Background(), e.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range snap.Windows {
		if w.Held != 0 || w.Spent != 0 {
			t.Fatalf("a refused body was admitted: %+v", w)
		}
	}
}
