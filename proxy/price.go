package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

// Per-token prices (Options.TokenPrice, or a service's): a request is
// admitted against the budget for its most expensive outcome — its prompt
// estimated from the body (bytes / 3, rounded up) and its output at its
// max_tokens (required, unless Options.DefaultMaxTokens is set: then it
// is added to a request without one) — and settled, when its answer
// ends, at the tokens the answer counted (a stream cut before its usage
// chunk: the content events delivered, and the estimated prompt). A
// charge never passes what the request was admitted for, so no window
// passes its limit whatever the answer holds.

// AccountPrices gives an account's own per-token price, nil when it has
// none (db.Store implements it).
type AccountPrices interface {
	AccountTokenPrice(ctx context.Context, accountID int64) (*gpuproxy.TokenPrice, error)
}

// accountPriceTTL is how long an account's price is reused: a price set
// on any replica applies within it.
const accountPriceTTL = time.Second

type accountPrice struct {
	price   *gpuproxy.TokenPrice
	expires time.Time
}

// priceFor is the per-token price of a request of the account: the
// service's own (svc, on its endpoint), else the account's, else
// Options.TokenPrice.
func (p *Proxy) priceFor(ctx context.Context, acct int64, svc *gpuproxy.TokenPrice) (gpuproxy.TokenPrice, error) {
	if svc != nil {
		return *svc, nil
	}
	if p.opts.AccountPrices == nil {
		return p.opts.TokenPrice, nil
	}
	now := time.Now()
	if v, ok := p.acctPrices.Load(acct); ok {
		if e := v.(accountPrice); now.Before(e.expires) {
			if e.price != nil {
				return *e.price, nil
			}
			return p.opts.TokenPrice, nil
		}
	}
	rctx, cancel := context.WithTimeout(ctx, storeReadTimeout)
	price, err := p.opts.AccountPrices.AccountTokenPrice(rctx, acct)
	cancel()
	if err != nil {
		return gpuproxy.TokenPrice{}, &gpuproxy.Error{Code: gpuproxy.EUNAVAILABLE, Cause: err,
			Message: "the account's token price could not be read; try again", Details: map[string]any{"retry_after_seconds": 1}}
	}
	p.acctPrices.Store(acct, accountPrice{price: price, expires: now.Add(accountPriceTTL)})
	if price != nil {
		return *price, nil
	}
	return p.opts.TokenPrice, nil
}

// promptBytesPerToken is the prompt estimate's divisor.
const promptBytesPerToken = 3

// pricedCall is an admitted token-priced request waiting for its answer's
// end (Proxy.priced, by request id).
type pricedCall struct {
	pass      guardrails.Pass
	price     gpuproxy.TokenPrice
	promptEst int64
}

// MaxMaxTokens bounds a priced request's max_tokens (and
// max_completion_tokens); MaxN bounds its n.
const (
	MaxMaxTokens = 1_000_000
	MaxN         = 128
)

// ChatRules are the rules of the body fields a token-priced request is
// admitted by (its most expensive outcome is max_tokens × n): a value of
// the wrong type, a fraction or a value out of range is refused naming
// the field and its range, before any admission, on /v1 and on the
// instance proxy alike.
var ChatRules = gpuproxy.FieldRules{
	{Name: "max_tokens", Kind: gpuproxy.FieldInteger, Min: 1, Max: MaxMaxTokens},
	{Name: "max_completion_tokens", Kind: gpuproxy.FieldInteger, Min: 1, Max: MaxMaxTokens},
	{Name: "n", Kind: gpuproxy.FieldInteger, Min: 1, Max: MaxN},
}

// pricedBody is what a priced request's body says of its output, each
// field as it came (checked against ChatRules).
type pricedBody struct {
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	N                   json.RawMessage `json:"n"`
}

// pricedField checks one of the body's fields against its rule and returns
// its value, 0 when absent or null.
func pricedField(name string, raw json.RawMessage) (int64, error) {
	if n, ok := plainDigits(raw); ok { // the common case, without CheckJSON's copies
		if err := ChatRules.Rule(name).CheckInt(n); err != nil {
			return 0, err
		}
		return n, nil
	}
	if err := ChatRules.Rule(name).CheckJSON(raw); err != nil {
		return 0, err
	}
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	return strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
}

// plainDigits reads raw when it is a short run of decimal digits (a JSON
// integer as topFields hands it over: no sign, no spaces).
func plainDigits(raw []byte) (int64, bool) {
	if len(raw) == 0 || len(raw) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// read reads the body's fields: without allocating when topFields can,
// else with encoding/json; false when the body is not a JSON object (or
// null).
func (b *pricedBody) read(data []byte) bool {
	if topFields(data, func(k, v []byte) {
		switch {
		case fieldIs(k, "max_tokens"):
			b.MaxTokens = v
		case fieldIs(k, "max_completion_tokens"):
			b.MaxCompletionTokens = v
		case fieldIs(k, "n"):
			b.N = v
		}
	}) {
		return true
	}
	var slow pricedBody // on the heap only on this path
	ok := json.Unmarshal(data, &slow) == nil
	*b = slow
	return ok
}

// reserve prices x at price: its admitted cost becomes the per-request
// cost plus its most expensive token outcome, and a request without
// max_tokens gets DefaultMaxTokens (or is refused, naming the field).
func (p *Proxy) reserve(x *exchange, price gpuproxy.TokenPrice) error {
	if !price.On() {
		return nil
	}
	if x.data == nil && x.stream != nil {
		return gpuproxy.Invalid("body", "is too large for a token-priced request (read whole to price it; at most %s)",
			strconv.FormatInt(p.opts.MaxRequestBody, 10)+" bytes")
	}
	var out int64
	if x.method == http.MethodPost && !strings.HasSuffix(x.path, "embeddings") {
		var b pricedBody
		if len(x.data) > 0 && !b.read(x.data) {
			return gpuproxy.Invalid("body", "must be a JSON object for a token-priced request")
		}
		var vals [3]int64
		for i, f := range [...]struct {
			name string
			raw  json.RawMessage
		}{{"max_tokens", b.MaxTokens}, {"max_completion_tokens", b.MaxCompletionTokens}, {"n", b.N}} {
			v, err := pricedField(f.name, f.raw)
			if err != nil {
				return err
			}
			vals[i] = v
		}
		max, n := vals[0], vals[2]
		if max == 0 {
			max = vals[1]
		}
		switch {
		case max == 0 && p.opts.DefaultMaxTokens > 0:
			max = int64(p.opts.DefaultMaxTokens)
			x.data = withField(x.data, "max_tokens", strconv.Itoa(p.opts.DefaultMaxTokens))
			x.length = int64(len(x.data))
		case max == 0:
			return gpuproxy.Invalid("max_tokens", "is required while token prices are on: the most tokens the answer "+
				"may have (the request is admitted for that many), %s", ChatRules.Rule("max_tokens").Range())
		}
		out = max
		if n > 1 {
			out *= n
		}
	}
	est := (int64(len(x.data)) + promptBytesPerToken - 1) / promptBytesPerToken
	x.cost = p.opts.Cost + price.Cost(est, out)
	x.price = &pricedCall{price: price, promptEst: est}
	return nil
}

// unprice ends a priced request whose answer is not used (retried on
// another replica): nothing is charged.
func (p *Proxy) unprice(rid, instanceID string) {
	if v, ok := p.priced.LoadAndDelete(rid); ok {
		p.pricedN.Add(-1)
		// Settled at nothing: refunded by an amend if its lease was settled
		// meanwhile (Done would leave it charged at its admitted cost).
		v.(*pricedCall).pass.Settle(instanceID, rid, 0)
	}
}

// withField adds "name":value to a JSON object's end.
func withField(body []byte, name, value string) []byte {
	end := bytes.LastIndexByte(body, '}')
	if end < 0 {
		return body
	}
	sep := ","
	if len(bytes.TrimSpace(body[:end])) <= 1 { // "{}"
		sep = ""
	}
	out := make([]byte, 0, len(body)+len(name)+len(value)+5)
	out = append(out, body[:end]...)
	out = append(out, sep+`"`+name+`":`+value...)
	return append(out, body[end:]...)
}

// settlePriced settles a priced request at its end (finish): the
// per-request cost and its counted tokens, at most what it was admitted
// for; the usage record's cost is what was charged.
func (p *Proxy) settlePriced(u *gpuproxy.Usage) {
	v, ok := p.priced.LoadAndDelete(u.RequestID)
	if !ok {
		return
	}
	p.pricedN.Add(-1)
	c := v.(*pricedCall)
	prompt := u.PromptTokens
	if prompt == 0 {
		prompt = c.promptEst // a cut stream, or an answer without usage: the prompt was read
	}
	charge := p.opts.Cost + c.price.Cost(prompt, u.CompletionTokens)
	charge = min(charge, c.pass.Cost())
	c.pass.Settle(u.InstanceID, u.RequestID, charge)
	u.Cost = charge
}
