package services

import (
	"fmt"

	"github.com/aiserve/gpuproxy"
)

// PriceScope is the scope that may set what a service's callers are
// charged: its token_price takes precedence over the account's per-token
// price (which only an admin sets), so setting, changing or removing it is
// an admin's decision too, or any key that may write services could
// cancel the account's price for its own calls.
const PriceScope = gpuproxy.ScopeAdmin

// checkPrices is the one rule over the fields that set what a service's
// callers are charged (token_price is the only one), for every transport:
// the Manager applies it to each create and update. A service whose
// token_price differs from cur's (nil: a new service, which has none)
// may be written only by a principal holding PriceScope. A change that
// keeps the price (an update of other fields) needs no more than the
// route's own scope.
func checkPrices(by gpuproxy.Principal, cur *gpuproxy.Service, next gpuproxy.Service) error {
	var old *gpuproxy.TokenPrice
	if cur != nil {
		old = cur.TokenPrice
	}
	if samePrice(old, next.TokenPrice) || by.Has(PriceScope) {
		return nil
	}
	return &gpuproxy.Error{Code: gpuproxy.EFORBIDDEN, Message: fmt.Sprintf("token_price sets what the service's "+
		"callers are charged per token, in place of the account's price: setting, changing or removing it needs "+
		"the %s scope, which this key lacks (leave token_price out, or ask an admin)", PriceScope),
		Details: map[string]any{"field": "token_price", "required_scope": string(PriceScope)}}
}

// samePrice reports whether two token prices (nil: none) are equal.
func samePrice(a, b *gpuproxy.TokenPrice) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
