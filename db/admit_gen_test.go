package db_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

// ruleGen writes a random script for one account against the model
// (admit_rule_test.go): admissions at moving clocks with costs on and
// near every window's boundary, between ledger rows, releases, meters
// starting and stopping, limits changing. The model decides each
// admission as it goes, so a script is the same for every store.
type ruleGen struct {
	rng        *rand.Rand
	a          *ruleAccount
	now        time.Time
	scale      gpuproxy.Micros // the account's money scale: limits, charges and prices are drawn around it
	negatives  bool            // refunds and negative adjustments (they keep Postgres off its cache)
	rents      bool            // rent instances through AdmitInstance (the store-API-only model test)
	spare      []string        // instances without a meter, for opMeterStart
	nRent      int
	releasable []int // model indexes of holds that admissions opened and are still open
	ops        []ruleOp
	admits     int
}

// ruleDefaults are the configured default windows an admission passes;
// scripts switch between them (Postgres trusts its cache only for the
// defaults it was computed with).
var ruleDefaults = [][]guardrails.Window{
	{{Minutes: 60, Limit: 50 * usd}, {Minutes: 1440, Limit: 200 * usd}},
	// Not in order: Postgres reports windows by length, SQLite in the
	// order given; checkObs compares them by length.
	{{Minutes: 1440, Limit: 120 * usd}, {Minutes: 30, Limit: 20 * usd}},
}

// ruleHorizons include 0 (no committed spend), sub-millisecond values and
// horizons longer than every window.
var ruleHorizons = []time.Duration{0, time.Microsecond, time.Millisecond, 59*time.Second + 999*time.Millisecond,
	30 * time.Minute, time.Hour, time.Hour, time.Hour, time.Hour + 500*time.Microsecond, 2 * time.Hour,
	25 * time.Hour, 400 * 24 * time.Hour}

var ruleWindowMinutes = []int{1, 5, 15, 30, 60, 60, 90, 240, 1440, 1440, 10080}

func newRuleGen(rng *rand.Rand, a *ruleAccount, now time.Time) *ruleGen {
	scales := []gpuproxy.Micros{usd, 10 * usd, 100 * usd, 1000 * usd}
	return &ruleGen{rng: rng, a: a, now: now, scale: scales[rng.IntN(len(scales))], negatives: rng.IntN(2) == 0}
}

func (g *ruleGen) amount(frac int) gpuproxy.Micros {
	return gpuproxy.Micros(g.rng.Int64N(int64(g.scale)/int64(frac)) + 1)
}

// windows draws 1 to n windows of distinct lengths; a limit may be 0.
func (g *ruleGen) windows(n int) []guardrails.Window {
	var ws []guardrails.Window
	seen := map[int]bool{}
	for range 1 + g.rng.IntN(n) {
		m := ruleWindowMinutes[g.rng.IntN(len(ruleWindowMinutes))]
		if g.rng.IntN(40) == 0 {
			m = 366 * 24 * 60 // the longest window a limit may have
		}
		if seen[m] {
			continue
		}
		seen[m] = true
		lim := gpuproxy.Micros(g.rng.Int64N(3*int64(g.scale) + 1))
		if g.rng.IntN(15) == 0 {
			lim = 0
		}
		ws = append(ws, guardrails.Window{Minutes: m, Limit: lim})
	}
	return ws
}

// windowMinutes lists every window length in play for the account, for
// dating rows and clocks on their edges.
func (g *ruleGen) windowMinutes() []int {
	var ms []int
	for _, w := range g.a.limits {
		ms = append(ms, w.Minutes)
	}
	for _, k := range g.a.keyList {
		for _, w := range g.a.keys[k] {
			ms = append(ms, w.Minutes)
		}
	}
	for _, d := range ruleDefaults {
		for _, w := range d {
			ms = append(ms, w.Minutes)
		}
	}
	return ms
}

func (g *ruleGen) delta() time.Duration { return time.Duration(g.rng.IntN(3)-1) * time.Microsecond }

// entryTime dates a ledger row: on minute boundaries and off them, on a
// window's edge to the microsecond, far in the past, or after now.
func (g *ruleGen) entryTime() time.Time {
	switch g.rng.IntN(9) {
	case 0:
		return g.now.Add(-time.Duration(g.rng.IntN(1500)) * time.Minute).Truncate(time.Minute)
	case 1:
		return g.now.Add(-time.Duration(g.rng.IntN(1500)) * time.Minute).Truncate(time.Minute).Add(g.delta())
	case 2, 3:
		ms := g.windowMinutes()
		return g.now.Add(-time.Duration(ms[g.rng.IntN(len(ms))])*time.Minute + g.delta())
	case 4:
		return g.now.Add(time.Duration(g.rng.Int64N(int64(2 * time.Hour))))
	case 5:
		return g.now.Add(-30 * 24 * time.Hour)
	}
	return g.now.Add(-time.Duration(g.rng.Int64N(int64(1500 * time.Minute))))
}

// entry draws a ledger row: charges, credits, refunds and adjustments of
// either sign (the negative kinds only when g.negatives), attributed to a
// key, to an instance (whose creator it then counts against, unless the
// callers caused it) or to neither.
func (g *ruleGen) entry() billing.Entry {
	e := billing.Entry{AccountID: g.a.id, Type: billing.Charge, Amount: g.amount(4), At: g.entryTime(),
		Basis: billing.Manual}
	switch r := g.rng.IntN(20); {
	case r < 2:
		e.Type = billing.Credit
	case r < 5 && g.negatives:
		e.Type = billing.Refund
	case r < 8:
		e.Type = billing.Adjustment
		if g.negatives && g.rng.IntN(2) == 0 {
			e.Amount = -e.Amount
		}
	}
	switch r := g.rng.IntN(10); {
	case r < 4 && len(g.a.keyList) > 0:
		e.KeyID = g.a.keyList[g.rng.IntN(len(g.a.keyList))]
	case r < 6 && len(g.a.instKey) > 0:
		ids := make([]string, 0, len(g.a.instKey))
		for id := range g.a.instKey {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		e.InstanceID = ids[g.rng.IntN(len(ids))]
		e.ByCaller = g.rng.IntN(3) == 0
	}
	return e
}

// advance moves the clock: mostly forward, sometimes not at all (a repeat
// admission at the same clock), onto a minute boundary, onto the edge
// where a ledger row leaves a window (±1 µs), or back a little.
func (g *ruleGen) advance() {
	switch r := g.rng.IntN(20); {
	case r < 7:
		g.now = g.now.Add(time.Duration(g.rng.Int64N(int64(90 * time.Second))))
	case r < 10:
	case r < 12:
		g.now = g.now.Add(time.Duration(1+g.rng.IntN(120)) * time.Minute)
	case r < 15 && len(g.a.entries) > 0:
		e := g.a.entries[g.rng.IntN(len(g.a.entries))]
		ms := g.windowMinutes()
		g.now = time.UnixMicro(e.at).UTC().Add(time.Duration(ms[g.rng.IntN(len(ms))])*time.Minute + g.delta())
	case r < 16:
		g.now = g.now.Add(-time.Duration(g.rng.Int64N(int64(2 * time.Minute))))
	case r < 17:
		g.now = g.now.Add(time.Minute).Truncate(time.Minute).Add(g.delta())
	default:
		g.now = g.now.Add(time.Duration(g.rng.Int64N(int64(5 * time.Second))))
	}
}

// cost picks an admission's cost from the model's snapshot: exactly a
// window's remaining (limit − spent − held − committed), one micro-dollar
// under or over it, the smallest remaining ±1, zero, or a small amount.
func (g *ruleGen) cost(snap guardrails.Snapshot) (gpuproxy.Micros, string) {
	us := snap.Windows
	if snap.Key != nil {
		us = append(append([]guardrails.Usage(nil), us...), snap.Key.Windows...)
	}
	d := gpuproxy.Micros(g.rng.IntN(3) - 1)
	var c gpuproxy.Micros
	var label string
	switch r := g.rng.IntN(10); {
	case r < 3 && len(us) > 0:
		u := us[g.rng.IntN(len(us))]
		c, label = u.Remaining()+d, fmt.Sprintf("%d-min remaining%+d", u.Minutes, d)
	case r < 5 && len(us) > 0:
		m := us[0].Remaining()
		for _, u := range us[1:] {
			m = min(m, u.Remaining())
		}
		c, label = m+d, fmt.Sprintf("remaining%+d", d)
	case r < 6:
		c, label = 0, "zero"
	default:
		c, label = g.amount(5), "random"
	}
	if c < 0 {
		c, label = 0, label+", clamped to 0"
	}
	return min(c, gpuproxy.MaxMicros), label
}

// admit appends an admission (or, with rent set, an instance's) and
// applies the model's decision to the model.
func (g *ruleGen) admit(hold bool, key string, small bool) {
	o := ruleOp{kind: opAdmit, now: g.now, hold: hold, key: key,
		horizon: ruleHorizons[g.rng.IntN(len(ruleHorizons))], nEnt: len(g.a.entries)}
	if g.rng.IntN(6) == 0 {
		o.defs = ruleDefaults[1]
	} else {
		o.defs = ruleDefaults[0]
	}
	o.want = g.a.snapshot(g.now.UnixMicro(), o.horizon, o.defs, key)
	o.cost, o.boundary = g.cost(o.want)
	if small {
		o.cost, o.boundary = g.amount(100), "small"
	}
	if hold && g.rents && g.rng.IntN(3) == 0 {
		g.nRent++
		o.kind, o.id = opRent, fmt.Sprintf("r%d_%d", g.a.id, g.nRent)
		o.price = g.amount(3)
		if o.horizon > 0 {
			o.cost, o.boundary = committedMicros(o.price, o.horizon, 1<<30), "price × horizon"
		}
	}
	o.admit = o.want.Fits(o.cost)
	switch {
	case !o.admit:
	case o.kind == opRent: // the hold is released when the meter starts
		g.a.instKey[o.id] = key
		g.a.meters[o.id] = ruleMeter{price: o.price, key: key}
	case hold:
		o.holdIdx = g.a.openHold(o.cost, key)
		g.releasable = append(g.releasable, o.holdIdx)
	}
	g.ops = append(g.ops, o)
	g.admits++
}

// key picks the admitting key: none, or one of the account's.
func (g *ruleGen) key(limitless bool) string {
	var ks []string
	for _, k := range g.a.keyList {
		if !limitless || g.a.keys[k] == nil {
			ks = append(ks, k)
		}
	}
	if len(ks) == 0 || g.rng.IntN(3) == 0 {
		return ""
	}
	return ks[g.rng.IntN(len(ks))]
}

// step appends one random step (or a burst of admissions).
func (g *ruleGen) step() {
	switch r := g.rng.IntN(100); {
	case r < 25:
		g.admit(false, g.key(false), false)
	case r < 50:
		g.admit(true, g.key(false), false)
	case r < 62:
		// A burst: holds with nothing spent in between, the clock still or
		// moving a little — Postgres's cache fast path.
		k := g.key(true)
		for range 3 + g.rng.IntN(4) {
			g.admit(true, k, g.rng.IntN(4) != 0)
			if g.rng.IntN(2) == 0 {
				g.now = g.now.Add(time.Duration(g.rng.Int64N(int64(30 * time.Second))))
			}
		}
	case r < 77:
		e := g.entry()
		g.a.addEntry(e)
		g.ops = append(g.ops, ruleOp{kind: opEntry, entry: e, now: g.now})
	case r < 85 && len(g.releasable) > 0:
		i := g.rng.IntN(len(g.releasable))
		idx := g.releasable[i]
		g.releasable = append(g.releasable[:i], g.releasable[i+1:]...)
		delete(g.a.holds, idx)
		g.ops = append(g.ops, ruleOp{kind: opRelease, holdIdx: idx, now: g.now})
	case r < 89 && len(g.spare) > 0:
		id := g.spare[0]
		g.spare = g.spare[1:]
		p := g.amount(3)
		g.a.meters[id] = ruleMeter{price: p, key: g.a.instKey[id]}
		g.ops = append(g.ops, ruleOp{kind: opMeterStart, id: id, price: p, now: g.now})
	case r < 93 && len(g.a.meters) > 0:
		ids := make([]string, 0, len(g.a.meters))
		for id := range g.a.meters {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		id := ids[g.rng.IntN(len(ids))]
		delete(g.a.meters, id)
		g.ops = append(g.ops, ruleOp{kind: opMeterStop, id: id, now: g.now})
	case r < 96:
		ws := []guardrails.Window{} // back to the defaults
		if g.rng.IntN(3) != 0 {
			ws = g.windows(3)
		}
		g.a.limits = sortedWindows(ws)
		if len(ws) == 0 {
			g.a.limits = nil
		}
		g.ops = append(g.ops, ruleOp{kind: opLimits, windows: ws, now: g.now})
	case len(g.a.keyList) > 0:
		k := g.a.keyList[g.rng.IntN(len(g.a.keyList))]
		ws := []guardrails.Window{} // none of its own
		if g.rng.IntN(3) != 0 {
			ws = g.windows(2)
		}
		g.a.keys[k] = sortedWindows(ws)
		if len(ws) == 0 {
			g.a.keys[k] = nil
		}
		g.ops = append(g.ops, ruleOp{kind: opKeyLimits, key: k, windows: ws, now: g.now})
	default:
		g.admit(true, "", false)
	}
	g.advance()
}
