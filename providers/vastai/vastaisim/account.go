package vastaisim

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
)

// cost is what an instance was charged over a period, as vast.ai bills:
// storage (storage_cost × disk) for the whole time the instance exists,
// stopped or not, and GPU time (dph_base, or the bid of an interruptible
// instance) only while it runs: from reaching "running" to a stop or the
// destroy. Loading and stopped time bill storage only. (Statuses forced
// with SetInstanceStatus, such as "frozen" or "exited", change what is
// reported, not what is billed.)
type cost struct {
	gpu, disk  float64 // USD
	gpuHours   float64
	start, end time.Time // the instance's existence within the period
	override   bool      // set with SetCharge: total is the set amount
	total      float64
}

// accrued is what an instance cost between from and to (zero times: no
// bound); s.mu must be held.
func (s *Server) accrued(in *instance, from, to time.Time) cost {
	end := s.now()
	if in.destroyed {
		end = in.destroyedAt
	}
	start := in.created
	if start.Before(from) {
		start = from
	}
	if !to.IsZero() && end.After(to) {
		end = to
	}
	c := cost{start: start, end: end}
	if v, ok := s.charges[in.id]; ok {
		c.override, c.total, c.gpu = true, v, v
		return c
	}
	if !end.After(start) {
		c.end = start
		return c
	}
	var gpu time.Duration
	add := func(a, b time.Time, rate float64) {
		a, b = later(a, start), earlier(b, end)
		if b.After(a) {
			gpu += b.Sub(a)
			c.gpu += rate * b.Sub(a).Hours()
		}
	}
	for _, r := range in.runs {
		add(r.from, r.to, r.rate)
	}
	if !in.runFrom.IsZero() {
		add(in.runFrom, end, in.gpuRate())
	}
	c.gpuHours = gpu.Hours()
	c.disk = in.offer.StorageTotalCost * end.Sub(start).Hours()
	c.total = c.gpu + c.disk
	return c
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// currentUser answers GET /api/v0/users/current/. Like vast.ai's, the reply
// contains the caller's api_key.
func (s *Server) currentUser(w http.ResponseWriter, r *http.Request, _ []byte, _ int64) {
	s.mu.Lock()
	spent := 0.0
	for _, in := range s.sortedInstances() {
		spent += s.accrued(in, time.Time{}, time.Time{}).total
	}
	credit := s.credit - spent
	s.mu.Unlock()
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	writeJSON(w, http.StatusOK, map[string]any{
		"id": 1, "username": "sim", "email": "sim@example.invalid", "fullname": "Simulated User",
		"api_key": key, "key_id": 1, "sid": "sim-session",
		"credit": math.Round(credit*1e6) / 1e6, "balance": 0.0,
		"balance_threshold": 0.0, "balance_threshold_enabled": false, "autobill_threshold": 0.0,
		"billing_creditonly": false, "can_pay": true, "has_billing": true, "email_verified": true,
		"got_signup_credit": true, "last4": "4242",
	})
}

// showCharges answers GET /api/v0/charges/ with one result per instance
// that existed in the requested day range; select_filters with both day
// bounds is required. limit defaults to and is capped at pageMax (vast.py:
// "max: 100"). Every result and every line item carries start, end (unix
// seconds), type, source, description, amount (USD), metadata and items,
// the fields vast.py's `show invoices-v1 --charges --verbose` reads at
// every level.
func (s *Server) showCharges(w http.ResponseWriter, r *http.Request, _ []byte, _ int64) {
	v, _ := queryJSON(r, "select_filters")
	sf, _ := v.(map[string]any)
	day, _ := sf["day"].(map[string]any)
	gte, ok1 := numberOf(day["gte"])
	lte, ok2 := numberOf(day["lte"])
	if !ok1 || !ok2 {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false,
			"msg": "Must provide both 'day' gte and lte filters for instance charges"})
		return
	}
	wantInstances := true
	if t, ok := sf["type"].(map[string]any); ok {
		if in, ok := t["in"].([]any); ok {
			wantInstances = false
			for _, x := range in {
				wantInstances = wantInstances || x == "instance"
			}
		}
	}
	limit, ok := pageLimit(r, pageMax)
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_args", "limit must be a positive number")
		return
	}
	offset, ok := pageOffset(r)
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_token", "Invalid pagination token")
		return
	}
	latestFirst := false
	if v, ok := queryJSON(r, "latest_first"); ok {
		latestFirst = v == true || v == "true"
	}
	from := time.Unix(int64(gte), 0)
	to := time.Unix(int64(lte), 0)
	var results []map[string]any
	s.mu.Lock()
	for _, in := range s.sortedInstances() {
		if !wantInstances {
			break
		}
		c := s.accrued(in, from, to)
		if !c.override && !c.end.After(c.start) {
			continue
		}
		start, end := float64(c.start.Unix()), float64(c.end.Unix())
		item := func(typ, desc string, amount float64) map[string]any {
			return map[string]any{"start": start, "end": end, "type": typ, "source": nil,
				"description": desc, "amount": round6(amount), "metadata": map[string]any{}, "items": []any{}}
		}
		results = append(results, map[string]any{
			"start": start, "end": end, "type": "instance",
			"source":      fmt.Sprintf("instance-%d", in.id),
			"description": fmt.Sprintf("Instance %d: %d× %s", in.id, in.offer.NumGPUs, in.offer.GPUName),
			"amount":      round6(c.total),
			"metadata":    map[string]any{"label": in.label, "instance_id": in.id, "is_bid": in.isBid},
			"items": []map[string]any{
				item("gpu", fmt.Sprintf("%.3f hours at $%.3f/hour", c.gpuHours, in.gpuRate()), c.gpu),
				item("disk", fmt.Sprintf("%.3f hours of %.0f GB storage at $%.3f/GB/month",
					c.end.Sub(c.start).Hours(), in.disk, in.offer.StorageCost), c.disk),
			},
		})
	}
	s.mu.Unlock()
	if latestFirst {
		slices.Reverse(results)
	}
	writePage(w, results, offset, limit)
}

func round6(f float64) float64 { return math.Round(f*1e6) / 1e6 }

// Instances returns a snapshot of every instance, destroyed ones included,
// in id order. Reading it advances the lifecycle like an API read.
func (s *Server) Instances() []SimInstance {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceMarket(s.now())
	var out []SimInstance
	for _, in := range s.sortedInstances() {
		out = append(out, s.snapshot(in))
	}
	return out
}

// Instance returns a snapshot of one instance.
func (s *Server) Instance(id int64) (SimInstance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceMarket(s.now())
	in := s.instances[id]
	if in == nil {
		return SimInstance{}, false
	}
	return s.snapshot(in), true
}

// snapshot copies an instance; s.mu must be held.
func (s *Server) snapshot(in *instance) SimInstance {
	st := s.status(in)
	env := map[string]string{}
	for _, kv := range in.env {
		env[kv[0]] = kv[1]
	}
	si := SimInstance{
		ID: in.id, OfferID: in.offer.ID, Label: in.label, Image: in.image, Env: env, DiskGB: in.disk,
		Status: st, Destroyed: in.destroyed, DPHTotal: in.gpuRate() + in.offer.StorageTotalCost,
		IsBid: in.isBid, Bid: in.bid, Paused: in.paused, Preemptions: in.preemptions, StatusMsg: in.statusMsg,
		Charged:   s.accrued(in, time.Time{}, time.Time{}).total,
		CreatedAt: in.created, DestroyedAt: in.destroyedAt,
	}
	if in.inf != nil {
		si.Endpoint = in.inf.URL()
	}
	return si
}

// SetInstanceStatus forces an instance's actual_status (e.g. "exited",
// "offline", "unknown"); "" returns it to its normal lifecycle.
func (s *Server) SetInstanceStatus(id int64, status string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.lookup(id)
	if err != nil {
		return fmt.Errorf("instance %d: %w", id, err)
	}
	in.forced = status
	s.status(in)
	return nil
}

// InstanceInference returns the inference server of a running instance,
// or nil, so tests can set its chunk delay or hang mode.
func (s *Server) InstanceInference(id int64) *InferenceServer {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil {
		return nil
	}
	s.status(in)
	return in.inf
}

// Offers returns every offer in id order, priced for 5 GB of storage,
// including those rented by us or taken by someone else (OfferChurn,
// RemoveOffer), which are marked Rented.
func (s *Server) Offers() []Offer {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceMarket(s.now())
	s.settleChurn(s.now())
	out := make([]Offer, 0, len(s.offers))
	for _, id := range s.offerIDs() {
		o := s.offers[id].priced(defaultSearchStorage)
		o.Rented = !s.listed(id)
		out = append(out, o)
	}
	return out
}

// RemoveOffer takes an offer off the market, as when someone else rents it.
func (s *Server) RemoveOffer(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.offers[id]
	if o == nil || o.Rented {
		return false
	}
	o.Rented = true
	return true
}

// SetCharge makes the charges endpoint report usd for an instance instead
// of its accrued cost.
func (s *Server) SetCharge(id int64, usd float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.charges[id] = usd
}

// SetCredit sets the account's credit before charges.
func (s *Server) SetCredit(usd float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.credit = usd
}
