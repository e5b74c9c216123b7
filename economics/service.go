package economics

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Service answers summaries and series over a Store (see the package
// documentation for the rules).
type Service struct {
	store Store
	now   func() time.Time
}

// New returns a Service over store; now is the clock (nil: time.Now),
// which ends the running time of instances still running and defaults a
// query's period.
func New(store Store, now func() time.Time) *Service {
	if now == nil {
		now = time.Now
	}
	return &Service{store: store, now: now}
}

// Summary returns q's rows and totals. q takes its defaults first
// (Query.WithDefaults); a query Validate refuses is an invalid error
// naming the field.
func (s *Service) Summary(ctx context.Context, q Query) (Summary, error) {
	return s.summary(ctx, q, true)
}

// summary is Summary; without busy it reads no request's span, and the
// busy figures (Busy, Utilization, BusyGPUCost, PerMillionOutputBusy)
// are left zero: every other figure is Summary's to the micro-dollar.
func (s *Service) summary(ctx context.Context, q Query, busy bool) (Summary, error) {
	q = q.WithDefaults(s.now())
	if err := q.Validate(); err != nil {
		return Summary{Query: q}, err
	}
	p, err := s.load(ctx, q)
	if err != nil {
		return Summary{Query: q}, err
	}
	usage, err := s.store.UsageGroups(ctx, q.AccountID, q.From, q.To, 0)
	if err != nil {
		return Summary{Query: q}, err
	}
	charges, err := s.store.InstanceCharges(ctx, q.AccountID, q.From, q.To, 0)
	if err != nil {
		return Summary{Query: q}, err
	}

	var keyCharges []KeyCharge
	if q.GroupBy == ByKey {
		if keyCharges, err = s.store.KeyCharges(ctx, q.AccountID, q.From, q.To); err != nil {
			return Summary{Query: q}, err
		}
	}
	p.foldErrorsOnly(usage, charges)

	rows := map[string]*Row{}
	row := func(g string) *Row {
		r := rows[g]
		if r == nil {
			r = &Row{Group: g, Label: p.label(g), Upstream: p.upstreamOf(g)}
			rows[g] = r
		}
		return r
	}
	// uses: the instances each group's running time counts.
	uses := map[string]map[string]bool{}
	use := func(g, inst string) {
		if uses[g] == nil {
			uses[g] = map[string]bool{}
		}
		uses[g][inst] = true
	}
	used := map[string]bool{} // instances some request used
	for _, u := range usage {
		g := p.groupOf(u)
		r := row(g)
		r.Requests += u.Requests
		r.Errors += u.Errors
		r.PromptTokens += u.PromptTokens
		r.CompletionTokens += u.CompletionTokens
		r.ProxyCharges += u.Cost
		use(g, u.InstanceID)
		used[u.InstanceID] = true
	}
	for g, c := range p.allocate(usage, charges) {
		row(g).SharedGPUCost += c
	}
	for g, c := range p.gpuCost(usage, charges) {
		row(g).GPUCost += c
	}
	for _, kc := range keyCharges {
		if kc.Amount != 0 {
			row(kc.KeyID)
		}
	}
	if q.GroupBy == ByKey {
		for _, r := range rows {
			r.Charged = new(gpuproxy.Micros)
		}
		for _, kc := range keyCharges {
			if r := rows[kc.KeyID]; r != nil {
				*r.Charged += kc.Amount
			}
		}
	}
	// Every instance of the period: those that ran in it, were charged in
	// it or served its requests. One no request used counts for the group
	// its GPU time went to.
	insts := map[string]bool{}
	for id := range p.runs {
		if _, _, ok := p.window(id); ok {
			insts[id] = true
		}
	}
	for _, c := range charges {
		insts[c.InstanceID] = true
	}
	for id := range used {
		insts[id] = true
	}
	for id := range insts {
		if !used[id] {
			g := p.unusedGroup(id)
			row(g)
			use(g, id)
		}
	}

	bm := newBusyMeter(p.window, p.spanGroup)
	if busy {
		if err := s.store.EachUsageSpan(ctx, q.AccountID, q.From, q.To, q.GroupBy, bm.add); err != nil {
			return Summary{Query: q}, err
		}
	}
	bm.done()

	out := Summary{Query: q, Rows: make([]Row, 0, len(rows))}
	for g, r := range rows {
		var running int64
		for id := range uses[g] {
			running += p.runningIn(id)
		}
		r.finish(bm.Busy[g], running)
		out.Rows = append(out.Rows, *r)
		t := &out.Totals
		t.Requests += r.Requests
		t.Errors += r.Errors
		t.PromptTokens += r.PromptTokens
		t.CompletionTokens += r.CompletionTokens
		t.GPUCost += r.GPUCost
		t.SharedGPUCost += r.SharedGPUCost
		t.ProxyCharges += r.ProxyCharges
		if r.Charged != nil {
			if t.Charged == nil {
				t.Charged = new(gpuproxy.Micros)
			}
			*t.Charged += *r.Charged
		}
	}
	var running int64
	for id := range insts {
		running += p.runningIn(id)
	}
	out.Totals.finish(bm.Total, running)
	slices.SortFunc(out.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.GPUCost, a.GPUCost), cmp.Compare(a.Group, b.Group))
	})
	return out, nil
}

// Series returns q's GPU cost and completion tokens per bucket of the
// period ([From + k·bucket, From + (k+1)·bucket), the last one cut at
// To) and per group, allocated in each bucket as a summary of that
// bucket would: one point per bucket and group with requests or GPU cost
// in it (a bucket without any has no point), by time then group. bucket
// must be at least a second and cut the period in at most MaxBuckets.
func (s *Service) Series(ctx context.Context, q Query, bucket time.Duration) ([]Point, error) {
	q = q.WithDefaults(s.now())
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if err := q.validBucket(bucket); err != nil {
		return nil, err
	}
	p, err := s.load(ctx, q)
	if err != nil {
		return nil, err
	}
	usage, err := s.store.UsageGroups(ctx, q.AccountID, q.From, q.To, bucket)
	if err != nil {
		return nil, err
	}
	charges, err := s.store.InstanceCharges(ctx, q.AccountID, q.From, q.To, bucket)
	if err != nil {
		return nil, err
	}
	// Errors-only models are folded as the summary of the whole period
	// folds them, in every bucket alike.
	whole, err := s.store.UsageGroups(ctx, q.AccountID, q.From, q.To, 0)
	if err != nil {
		return nil, err
	}
	wholeCharges, err := s.store.InstanceCharges(ctx, q.AccountID, q.From, q.To, 0)
	if err != nil {
		return nil, err
	}
	p.foldErrorsOnly(whole, wholeCharges)
	var out []Point
	for len(usage) > 0 || len(charges) > 0 {
		// Both lists are ordered by bucket: take the next bucket's rows.
		k := int64(-1)
		if len(usage) > 0 {
			k = usage[0].Bucket
		}
		if len(charges) > 0 && (k < 0 || charges[0].Bucket < k) {
			k = charges[0].Bucket
		}
		nu := 0
		for nu < len(usage) && usage[nu].Bucket == k {
			nu++
		}
		nc := 0
		for nc < len(charges) && charges[nc].Bucket == k {
			nc++
		}
		bu, bc := usage[:nu], charges[:nc]
		usage, charges = usage[nu:], charges[nc:]

		pts := map[string]*Point{}
		at := q.From.Add(time.Duration(k) * bucket)
		point := func(g string) *Point {
			pt := pts[g]
			if pt == nil {
				pt = &Point{At: at, Group: g}
				pts[g] = pt
			}
			return pt
		}
		for _, u := range bu {
			point(p.groupOf(u)).CompletionTokens += u.CompletionTokens
		}
		for g, c := range p.gpuCost(bu, bc) {
			point(g).GPUCost += c
		}
		for _, g := range slices.Sorted(maps.Keys(pts)) {
			pt := pts[g]
			pt.PerMillionOutput = perMillion(pt.GPUCost, pt.CompletionTokens)
			out = append(out, *pt)
		}
	}
	return out, nil
}

// finish sets r's figures computed from its sums: the costs per million
// tokens and utilization, with busy and running in microseconds.
func (r *Row) finish(busy, running int64) {
	r.PerMillionOutput = perMillion(r.SharedGPUCost, r.CompletionTokens)
	r.PerMillionTokens = perMillion(r.SharedGPUCost, r.PromptTokens+r.CompletionTokens)
	r.Busy, r.Running = micros(busy), micros(running)
	if running > 0 {
		r.Utilization = float64(busy) / float64(running)
		r.BusyGPUCost = busyShare(r.SharedGPUCost, busy, running)
	}
	r.PerMillionOutputBusy = perMillion(r.BusyGPUCost, r.CompletionTokens)
	slices.Sort(r.Upstream)
}

// period is what a query reads besides its sums: the instances and the
// names of services and keys.
type period struct {
	q        Query
	from, to int64 // microseconds
	now      int64
	runs     map[string]InstanceRun
	services map[string]ServiceName
	names    []ServiceName // in the store's order (by id), for labels
	keys     map[string]string
	// fold holds the models folded into ErrorsOnly (by model);
	// upstream the other names instances reported per model group.
	fold     map[string]bool
	upstream map[string]map[string]bool
}

func (s *Service) load(ctx context.Context, q Query) (*period, error) {
	p := &period{q: q, from: q.From.UnixMicro(), to: q.To.UnixMicro(), now: s.now().UnixMicro(),
		runs: map[string]InstanceRun{}, services: map[string]ServiceName{}, fold: map[string]bool{},
		upstream: map[string]map[string]bool{}}
	runs, err := s.store.InstanceRuns(ctx, q.AccountID, q.From, q.To)
	if err != nil {
		return nil, err
	}
	for _, r := range runs {
		p.runs[r.ID] = r
	}
	names, err := s.store.ServiceNames(ctx, q.AccountID)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		p.services[n.ID] = n
	}
	p.names = names
	if q.GroupBy == ByKey {
		if p.keys, err = s.store.KeyNames(ctx, q.AccountID); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// window is the part of the period in which instance id ran, in
// microseconds; ok is false when it did not run in it.
func (p *period) window(id string) (lo, hi int64, ok bool) {
	r, found := p.runs[id]
	if !found || r.Started.IsZero() {
		return 0, 0, false
	}
	end := p.now
	if !r.Ended.IsZero() {
		end = r.Ended.UnixMicro()
	}
	lo, hi = max(p.from, r.Started.UnixMicro()), min(p.to, end)
	return lo, hi, hi > lo
}

// runningIn is how long instance id ran in the period, in microseconds.
func (p *period) runningIn(id string) int64 {
	lo, hi, ok := p.window(id)
	if !ok {
		return 0
	}
	return hi - lo
}

// serviceGroup is a service's group: its name ("" for none; its id when
// the account has no such service).
func (p *period) serviceGroup(id string) string {
	if n, ok := p.services[id]; ok {
		return n.Name
	}
	return id
}

// modelOf is a request's model group: the model of the service it went
// through (the name callers asked for, whatever the upstream answered),
// else the model the record names; ErrorsOnly for a folded one.
func (p *period) modelOf(model, serviceID string) string {
	if n, ok := p.services[serviceID]; ok && serviceID != "" && n.Model != "" {
		model = n.Model
	}
	if p.fold[model] {
		return ErrorsOnly
	}
	return model
}

// foldErrorsOnly finds, by model, the models whose requests in usage all
// failed, with no tokens, proxy charges or GPU cost (charges allocated
// by token share), and records the upstream names of the others.
func (p *period) foldErrorsOnly(usage []UsageGroup, charges []InstanceCharge) {
	if p.q.GroupBy != ByModel {
		return
	}
	type sums struct {
		requests, failed, tokens int64
		cost                     gpuproxy.Micros
	}
	by := map[string]*sums{}
	for _, u := range usage {
		g := p.modelOf(u.Model, u.ServiceID)
		if g != u.Model {
			if p.upstream[g] == nil {
				p.upstream[g] = map[string]bool{}
			}
			p.upstream[g][u.Model] = true
		}
		if by[g] == nil {
			by[g] = &sums{}
		}
		by[g].requests += u.Requests
		by[g].failed += u.Failed
		by[g].tokens += u.PromptTokens + u.CompletionTokens
		by[g].cost += u.Cost
	}
	cost := p.allocate(usage, charges)
	for g, v := range by {
		if g != "" && v.requests > 0 && v.failed == v.requests && v.tokens == 0 && v.cost == 0 && cost[g] == 0 {
			p.fold[g] = true
		}
	}
	for g := range p.fold {
		delete(p.upstream, g)
	}
}

// upstreamOf is Row.Upstream of group g.
func (p *period) upstreamOf(g string) []string {
	if g == ErrorsOnly && p.q.GroupBy == ByModel {
		return slices.Sorted(maps.Keys(p.fold))
	}
	if up := p.upstream[g]; len(up) > 0 {
		return slices.Sorted(maps.Keys(up))
	}
	return nil
}

// groupOf is the group of a usage group.
func (p *period) groupOf(u UsageGroup) string {
	switch p.q.GroupBy {
	case ByModel:
		return p.modelOf(u.Model, u.ServiceID)
	case ByKey:
		return u.KeyID
	case ByService:
		return p.serviceGroup(u.ServiceID)
	}
	return u.InstanceID
}

// spanGroup is the group of a span (EachUsageSpan's Group is the
// grouping's column).
func (p *period) spanGroup(sp Span) string {
	switch p.q.GroupBy {
	case ByService:
		return p.serviceGroup(sp.Group)
	case ByModel:
		return p.modelOf(sp.Group, sp.ServiceID)
	}
	return sp.Group
}

// unusedGroup is the group an instance's GPU time goes to when no
// request used it: the instance itself, its service (by service; "" for
// an instance that is no replica), the key that created it (by key; ""
// for none), or "".
func (p *period) unusedGroup(id string) string {
	switch p.q.GroupBy {
	case ByInstance:
		return id
	case ByKey:
		return p.runs[id].KeyID
	case ByService:
		return p.serviceGroup(p.runs[id].ServiceID)
	}
	return ""
}

// allocate splits each instance's charges over the groups of its
// requests (usage and charges of one bucket): by instance, its own; else
// by the groups' tokens on it, or without tokens their requests, or
// without requests to unusedGroup. The result sums exactly to the
// charges.
func (p *period) allocate(usage []UsageGroup, charges []InstanceCharge) map[string]gpuproxy.Micros {
	type weight struct{ tokens, requests int64 }
	on := map[string]map[string]*weight{}
	for _, u := range usage {
		g := p.groupOf(u)
		if on[u.InstanceID] == nil {
			on[u.InstanceID] = map[string]*weight{}
		}
		w := on[u.InstanceID][g]
		if w == nil {
			w = &weight{}
			on[u.InstanceID][g] = w
		}
		w.tokens += u.PromptTokens + u.CompletionTokens
		w.requests += u.Requests
	}
	out := map[string]gpuproxy.Micros{}
	for _, c := range charges {
		if p.q.GroupBy == ByInstance {
			out[c.InstanceID] += c.Amount
			continue
		}
		groups := slices.Sorted(maps.Keys(on[c.InstanceID]))
		var tokens, requests int64
		for _, g := range groups {
			tokens += on[c.InstanceID][g].tokens
			requests += on[c.InstanceID][g].requests
		}
		if requests == 0 {
			out[p.unusedGroup(c.InstanceID)] += c.Amount
			continue
		}
		ws := make([]int64, len(groups))
		for i, g := range groups {
			if tokens > 0 {
				ws[i] = on[c.InstanceID][g].tokens
			} else {
				ws[i] = on[c.InstanceID][g].requests
			}
		}
		for i, share := range split(c.Amount, ws) {
			out[groups[i]] += share
		}
	}
	return out
}

// gpuCost is each group's GPU cost (Row.GPUCost): by key, the ledger's
// attribution (an instance's charges go to the key its entries name, the
// key that created it); otherwise the allocation by token share.
func (p *period) gpuCost(usage []UsageGroup, charges []InstanceCharge) map[string]gpuproxy.Micros {
	if p.q.GroupBy != ByKey {
		return p.allocate(usage, charges)
	}
	out := map[string]gpuproxy.Micros{}
	for _, c := range charges {
		out[c.KeyID] += c.Amount
	}
	return out
}

// busyShare is cost × busy / running, rounded toward zero (exact: big
// integers).
func busyShare(cost gpuproxy.Micros, busy, running int64) gpuproxy.Micros {
	if running <= 0 {
		return 0
	}
	n := new(big.Int).Mul(big.NewInt(int64(cost)), big.NewInt(min(busy, running)))
	return gpuproxy.Micros(n.Quo(n, big.NewInt(running)).Int64())
}

// label names group g for people.
func (p *period) label(g string) string {
	switch p.q.GroupBy {
	case ByInstance:
		if g == "" {
			return "requests without an instance"
		}
		if r, ok := p.runs[g]; ok && r.GPUName != "" {
			return fmt.Sprintf("%d× %s on %s", max(r.NumGPUs, 1), r.GPUName, r.Provider)
		}
	case ByModel:
		switch g {
		case "":
			return "unused GPU time; requests without a model"
		case ErrorsOnly:
			return "errors (unknown model): " + strings.Join(slices.Sorted(maps.Keys(p.fold)), ", ")
		}
		if up := p.upstream[g]; len(up) > 0 {
			return "upstream: " + strings.Join(slices.Sorted(maps.Keys(up)), ", ")
		}
	case ByKey:
		if g == "" {
			return "instances created, requests made without an API key"
		}
		return p.keys[g]
	case ByService:
		if g == "" {
			return "unused GPU time outside services; requests not through a service"
		}
		for _, n := range p.names {
			if n.Name == g {
				return n.Model
			}
		}
	}
	return ""
}
