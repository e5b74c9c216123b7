package vastai

// Offer search and live quotes.

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy/providers"
)

// search posts a bundles query and normalizes the rows; a bid query's
// rows are interruptible whether or not they say is_bid.
func (a *Adapter) search(ctx context.Context, op string, q map[string]any) ([]providers.Offer, error) {
	bid := q["type"] == "bid"
	resp, _, err := a.do(ctx, op, providers.Call{Method: http.MethodPost, Path: "/api/v0/bundles/", Body: q})
	if err != nil {
		return nil, err
	}
	var body struct {
		Offers []json.RawMessage `json:"offers"`
	}
	if err := a.decode(op, resp, &body); err != nil {
		return nil, err
	}
	out := make([]providers.Offer, 0, len(body.Offers))
	for _, raw := range body.Offers {
		var w wireOffer
		if json.Unmarshal(raw, &w) != nil {
			continue // one odd row must not sink the search
		}
		o, ok := w.offer()
		if !ok {
			continue
		}
		if bid {
			// A bid row's dph_total is its min_bid plus storage.
			o.Interruptible = true
			if o.MinBid == 0 || o.MinBid > o.PricePerHour {
				o.MinBid = o.PricePerHour - o.StoragePerHour
			}
		} else {
			o.Interruptible = false
		}
		out = append(out, o)
	}
	return out, nil
}

// Search returns on-demand offers matching f, or with f.Interruptible bid
// offers (priced at their minimum bid plus storage), cheapest first. Minimum VRAM
// is sent as gpu_ram ≥ GB×1000 MB; the GPU name, a case-insensitive
// substring, is sent as an `in` list of the known names containing it.
func (a *Adapter) Search(ctx context.Context, f providers.SearchFilter) ([]providers.Offer, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultSearchLimit
	}
	limit = min(limit, maxSearchLimit)
	q := a.searchQuery(limit, f.Interruptible)
	if f.MinVRAMGB > 0 {
		q["gpu_ram"] = map[string]any{"gte": gbToMB(f.MinVRAMGB)}
	}
	if f.MaxPricePerHour > 0 {
		q["dph_total"] = map[string]any{"lte": f.MaxPricePerHour.USD()}
	}
	if f.MinGPUs > 0 {
		q["num_gpus"] = map[string]any{"gte": f.MinGPUs}
	}
	name := normalizeGPUName(f.GPUName)
	if name != "" {
		q["gpu_name"] = map[string]any{"in": gpuNameCandidates(name)}
	}
	offers, err := a.search(ctx, "searching offers", q)
	if err != nil {
		return nil, err
	}
	// Re-check on our side: the filter is the provider's, the money is ours.
	out := offers[:0]
	for _, o := range offers {
		switch {
		case f.MaxPricePerHour > 0 && o.PricePerHour > f.MaxPricePerHour,
			f.MinVRAMGB > 0 && gbToMB(o.VRAMGB) < gbToMB(f.MinVRAMGB),
			f.MinGPUs > 0 && o.NumGPUs < f.MinGPUs,
			name != "" && !strings.Contains(strings.ToLower(o.GPUName), strings.ToLower(name)):
			continue
		}
		out = append(out, o)
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Quote re-reads the live offer and returns its hourly price. An offer that
// is rented, unlisted or unknown is KindGone. Hours is ignored: vast.ai
// bills by time, so the quote's Hours and Total stay zero.
func (a *Adapter) Quote(ctx context.Context, offerID string, hours int) (providers.Quote, error) {
	return a.quote(ctx, offerID, false)
}

// QuoteBid re-reads the live bid row of an offer (search type "bid"): its
// PricePerHour is the minimum bid plus storage, with MinBid and
// StoragePerHour apart. An offer no longer listed is KindGone.
func (a *Adapter) QuoteBid(ctx context.Context, offerID string) (providers.Quote, error) {
	return a.quote(ctx, offerID, true)
}

// quote searches for one offer by id, on demand or as a bid.
func (a *Adapter) quote(ctx context.Context, offerID string, bid bool) (providers.Quote, error) {
	id, err := a.parseID("offer", offerID)
	if err != nil {
		return providers.Quote{}, err
	}
	q := a.searchQuery(1, bid)
	q["id"] = map[string]any{"eq": id}
	offers, err := a.search(ctx, "quoting offer "+offerID, q)
	if err != nil {
		return providers.Quote{}, err
	}
	for _, o := range offers {
		if o.ID == strconv.FormatInt(id, 10) {
			return providers.Quote{
				OfferID:        o.ID,
				PricePerHour:   o.PricePerHour,
				Billing:        providers.BillingHourly,
				GPUName:        o.GPUName,
				NumGPUs:        o.NumGPUs,
				Interruptible:  bid,
				MinBid:         o.MinBid,
				StoragePerHour: o.StoragePerHour,
			}, nil
		}
	}
	return providers.Quote{}, a.errorf(providers.KindGone, "offer %s is no longer available", offerID)
}
