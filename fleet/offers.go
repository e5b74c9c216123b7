package fleet

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// OfferQuery filters an offer search. Zero fields do not filter.
type OfferQuery struct {
	Provider string // "", "all", or a provider name
	MinVRAM  float64
	MaxPrice gpuproxy.Micros
	GPUName  string
	MinGPUs  int
	Limit    int // default 50, at most 500
}

// Validate checks the query, naming the bad field.
func (q *OfferQuery) Validate(known []string) error {
	switch {
	case q.Provider != "" && q.Provider != "all" && !contains(known, q.Provider):
		return gpuproxy.Invalid("provider", "must be one of %s or all", strings.Join(known, ", "))
	case q.MinVRAM < 0 || q.MinVRAM > 10000:
		return gpuproxy.Invalid("min_vram", "must be between 0 and 10000 GB")
	case q.MaxPrice < 0 || q.MaxPrice > 10_000*gpuproxy.MicrosPerUSD:
		return gpuproxy.Invalid("max_price", "must be between 0 and 10000 USD/hour")
	case len(q.GPUName) > 100:
		return gpuproxy.Invalid("gpu_name", "must be at most 100 characters")
	case q.MinGPUs < 0 || q.MinGPUs > 64:
		return gpuproxy.Invalid("min_gpus", "must be between 0 and 64")
	case q.Limit < 0 || q.Limit > 500:
		return gpuproxy.Invalid("limit", "must be between 1 and 500")
	}
	if q.Limit == 0 {
		q.Limit = 50
	}
	return nil
}

// ProviderError is one provider's failure in a fan-out.
type ProviderError struct {
	Provider string
	Message  string
}

// OffersResult is a merged offer list, cheapest first, with per-provider
// errors for providers that failed (the others still answer).
type OffersResult struct {
	Offers []providers.Offer
	Errors []ProviderError
}

type cachedOffers struct {
	offers []providers.Offer
	at     time.Time
}

// offerCache keeps each provider's last unfiltered-by-us answer per filter
// briefly, to respect provider rate limits.
type offerCache struct {
	mu  sync.Mutex
	ttl time.Duration
	m   map[string]cachedOffers
}

func (c *offerCache) get(key string, now time.Time) ([]providers.Offer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[key]
	if !ok || now.Sub(v.at) > c.ttl {
		return nil, false
	}
	return v.offers, true
}

func (c *offerCache) put(key string, offers []providers.Offer, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) > 1000 {
		clear(c.m)
	}
	c.m[key] = cachedOffers{offers: offers, at: now}
}

// drop removes offer id of provider from every cached answer, as soon as it
// is rented: a search within the TTL must not offer it again.
func (c *offerCache) drop(provider, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, v := range c.m {
		if !strings.HasPrefix(key, provider+"|") {
			continue
		}
		if i := slices.IndexFunc(v.offers, func(o providers.Offer) bool { return o.ID == id }); i >= 0 {
			// A new slice: answers in flight may still read the old one.
			v.offers = slices.Delete(slices.Clone(v.offers), i, i+1)
			c.m[key] = v
		}
	}
}

// Offers searches every selected provider concurrently, merges, filters,
// sorts cheapest first and cuts to the limit.
func (s *Service) Offers(ctx context.Context, q OfferQuery) (OffersResult, error) {
	if err := q.Validate(s.ProviderNames()); err != nil {
		return OffersResult{}, err
	}
	f := providers.SearchFilter{MinVRAMGB: q.MinVRAM, MaxPricePerHour: q.MaxPrice, GPUName: q.GPUName,
		MinGPUs: q.MinGPUs, Limit: 500}
	var names []string
	for _, p := range s.providers {
		if q.Provider == "" || q.Provider == "all" || q.Provider == p.Name() {
			names = append(names, p.Name())
		}
	}
	all, perrs := s.search(ctx, names, f, true)
	res := OffersResult{Errors: perrs}
	for _, o := range all {
		if matches(o, q) {
			res.Offers = append(res.Offers, o)
		}
	}
	sort.SliceStable(res.Offers, func(i, j int) bool {
		a, b := res.Offers[i], res.Offers[j]
		if a.PricePerHour != b.PricePerHour {
			return a.PricePerHour < b.PricePerHour
		}
		return a.Provider+a.ID < b.Provider+b.ID
	})
	if len(res.Offers) > q.Limit {
		res.Offers = res.Offers[:q.Limit]
	}
	return res, nil
}

// search asks the named providers concurrently and returns their offers,
// with an error for each provider that failed (the others still answer).
// Each answer is cached for OfferCacheTTL; cached answers are used when
// cached is true (a browsing search), never for a rent (offers perish).
func (s *Service) search(ctx context.Context, names []string, f providers.SearchFilter, cached bool) ([]providers.Offer, []ProviderError) {
	type answer struct {
		name   string
		offers []providers.Offer
		err    error
	}
	answers := make([]answer, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		p := s.byName[name]
		wg.Go(func() {
			key := p.Name() + "|" + filterKey(f)
			now := s.opts.Now()
			if offers, ok := s.cache.get(key, now); ok && cached {
				answers[i] = answer{name: p.Name(), offers: offers}
				return
			}
			cctx, cancel := context.WithTimeout(ctx, s.opts.SearchTimeout)
			defer cancel()
			offers, err := p.Search(cctx, f)
			if err == nil {
				s.cache.put(key, offers, now)
			}
			answers[i] = answer{name: p.Name(), offers: offers, err: err}
		})
	}
	wg.Wait()
	var all []providers.Offer
	var perrs []ProviderError
	for _, a := range answers {
		if a.err != nil {
			perrs = append(perrs, ProviderError{Provider: a.name, Message: gpuproxy.ErrorMessage(providers.AsAppError(a.err))})
			continue
		}
		all = append(all, a.offers...)
	}
	return all, perrs
}

// matches re-applies the filter to normalized offers: providers filter
// coarsely (or not at all), so the result is exact whatever they did.
func matches(o providers.Offer, q OfferQuery) bool {
	switch {
	case q.MinVRAM > 0 && o.VRAMGB+0.5 < q.MinVRAM: // 24564 MB cards are "24 GB"
		return false
	case q.MaxPrice > 0 && o.PricePerHour > q.MaxPrice:
		return false
	case q.GPUName != "" && !strings.Contains(strings.ToLower(o.GPUName), strings.ToLower(q.GPUName)):
		return false
	case q.MinGPUs > 0 && o.NumGPUs < q.MinGPUs:
		return false
	}
	return true
}

func filterKey(f providers.SearchFilter) string {
	return strings.Join([]string{ftoa(f.MinVRAMGB), f.MaxPricePerHour.String(), strings.ToLower(f.GPUName),
		itoa(f.MinGPUs)}, "|")
}

func contains(ss []string, s string) bool {
	for _, v := range ss {
		if v == s {
			return true
		}
	}
	return false
}
