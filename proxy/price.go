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
	price, err := p.opts.AccountPrices.AccountTokenPrice(ctx, acct)
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

// pricedBody is what a priced request's body says of its output.
type pricedBody struct {
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	N                   *int64 `json:"n"`
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
		if len(x.data) > 0 && json.Unmarshal(x.data, &b) != nil {
			return gpuproxy.Invalid("body", "must be a JSON object for a token-priced request")
		}
		max := b.MaxTokens
		if max == nil {
			max = b.MaxCompletionTokens
		}
		switch {
		case max == nil && p.opts.DefaultMaxTokens > 0:
			n := int64(p.opts.DefaultMaxTokens)
			max = &n
			x.data = withField(x.data, "max_tokens", strconv.Itoa(p.opts.DefaultMaxTokens))
			x.length = int64(len(x.data))
		case max == nil:
			return gpuproxy.Invalid("max_tokens", "is required while token prices are on: the most tokens the answer "+
				"may have (the request is admitted for that many)")
		case *max < 1:
			return gpuproxy.Invalid("max_tokens", "must be at least 1, got %d", *max)
		}
		out = *max
		if b.N != nil && *b.N > 1 {
			out *= *b.N
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
