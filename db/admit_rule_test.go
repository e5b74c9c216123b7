package db_test

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/guardrails"
)

// This file is the Go model of the admission rule (DESIGN.md, "Guard
// rails"), computed from an account's history directly, and the runner
// that plays a script of operations against a store and records what the
// store answered. TestAdmissionMatchesModel and TestAdmissionDifferential
// both use it: for every window of the account (and of the admitting
// key, when it has windows of its own),
//
//	spent_W + committed_W + held + cost ≤ limit_W
//
// where spent_W sums the spend of every ledger row dated after now − W
// (rows dated after now included), committed_W = burn × min(H, W) rounded
// down to the micro-dollar, burn the price per hour of the running meters,
// held the open holds; a key's figures count only what it caused. The
// decision is taken by guardrails' own Fits, the Go twin of both stores'
// SQL, on numbers the model computes without SQL.

// ruleAccount is one account's history as the model keeps it.
type ruleAccount struct {
	id      int64
	limits  []guardrails.Window            // own windows; nil: the defaults
	keys    map[string][]guardrails.Window // the account's keys; nil: no windows of their own
	keyList []string                       // keys in creation order, for reproducible picks
	instKey map[string]string              // instance id → the key that created it
	entries []ruleEntry                    // append-only, as the ledger
	holds   map[int]ruleHold               // open holds by model index
	nHolds  int                            // model indexes handed out
	meters  map[string]ruleMeter           // running meters by id
}

type ruleEntry struct {
	at    int64 // µs
	spend gpuproxy.Micros
	key   string
}

type ruleHold struct {
	amount gpuproxy.Micros
	key    string
}

type ruleMeter struct {
	price gpuproxy.Micros
	key   string
}

func newRuleAccount(id int64) *ruleAccount {
	return &ruleAccount{id: id, keys: map[string][]guardrails.Window{}, instKey: map[string]string{},
		holds: map[int]ruleHold{}, meters: map[string]ruleMeter{}}
}

func (a *ruleAccount) addKey(id string, windows []guardrails.Window) {
	a.keys[id] = sortedWindows(windows)
	a.keyList = append(a.keyList, id)
}

// addEntry records e as the store attributes it: to e.KeyID, or else to
// the key that created the instance it names, unless the callers caused it.
func (a *ruleAccount) addEntry(e billing.Entry) {
	k := e.KeyID
	if k == "" && !e.ByCaller {
		k = a.instKey[e.InstanceID]
	}
	a.entries = append(a.entries, ruleEntry{at: e.At.UnixMicro(), spend: e.Spend(), key: k})
}

func (a *ruleAccount) openHold(amount gpuproxy.Micros, key string) int {
	a.nHolds++
	a.holds[a.nHolds] = ruleHold{amount, key}
	return a.nHolds
}

// spent sums the spend of entries[:n] attributed to key (every entry when
// key is "") dated after now − W: rows dated after now count too
// (DESIGN.md, "What spent sees").
func (a *ruleAccount) spent(n int, key string, now int64, minutes int) gpuproxy.Micros {
	lo := now - int64(minutes)*60_000_000
	var s gpuproxy.Micros
	for _, e := range a.entries[:n] {
		if e.at > lo && (key == "" || e.key == key) {
			s += e.spend
		}
	}
	return s
}

// committedMicros is burn × min(horizon, W) per hour, rounded down to the
// micro-dollar, computed exactly in 128 bits.
func committedMicros(burn gpuproxy.Micros, horizon time.Duration, minutes int) gpuproxy.Micros {
	d := min(horizon.Microseconds(), int64(minutes)*60_000_000)
	if d <= 0 || burn <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(burn), uint64(d))
	q, _ := bits.Div64(hi, lo, 3_600_000_000)
	return gpuproxy.Micros(q)
}

// snapshot is what an admission at now should report, and what it should
// decide is Fits(cost).
func (a *ruleAccount) snapshot(now int64, horizon time.Duration, defaults []guardrails.Window, key string) guardrails.Snapshot {
	snap := guardrails.Snapshot{AccountID: a.id, OnExceed: "block"}
	for _, h := range a.holds {
		snap.Held += h.amount
	}
	for _, m := range a.meters {
		snap.Burn += m.price
	}
	ws := a.limits
	if ws == nil {
		ws = sortedWindows(defaults)
	}
	for _, w := range ws {
		snap.Windows = append(snap.Windows, guardrails.Usage{Window: w, Held: snap.Held,
			Spent:     a.spent(len(a.entries), "", now, w.Minutes),
			Committed: committedMicros(snap.Burn, horizon, w.Minutes)})
	}
	if kws := a.keys[key]; key != "" && kws != nil {
		k := &guardrails.KeyUsage{KeyID: key}
		for _, h := range a.holds {
			if h.key == key {
				k.Held += h.amount
			}
		}
		for _, m := range a.meters {
			if m.key == key {
				k.Burn += m.price
			}
		}
		for _, w := range kws {
			k.Windows = append(k.Windows, guardrails.Usage{Window: w, Held: k.Held,
				Spent:     a.spent(len(a.entries), key, now, w.Minutes),
				Committed: committedMicros(k.Burn, horizon, w.Minutes)})
		}
		snap.Key = k
	}
	return snap
}

func sortedWindows(ws []guardrails.Window) []guardrails.Window {
	if ws == nil {
		return nil
	}
	out := slices.Clone(ws)
	slices.SortFunc(out, func(a, b guardrails.Window) int { return a.Minutes - b.Minutes })
	return out
}

// ruleOpKind names what one step of a script does.
type ruleOpKind int

const (
	opAdmit      ruleOpKind = iota // Store.Admit, read (hold false) or with a hold
	opRent                         // Store.AdmitInstance, then starting and running with a meter
	opEntry                        // Store.AppendEntry
	opRelease                      // Store.ReleaseHold of a hold an admission opened
	opMeterStart                   // Store.CreateMeter on an existing instance
	opMeterStop                    // Store.StopMeter
	opLimits                       // Store.SetLimits (an empty list: back to the defaults)
	opKeyLimits                    // Store.SetKeyLimits (an empty list removes them)
)

// ruleOp is one step, with the model's answer for admissions.
type ruleOp struct {
	kind     ruleOpKind
	now      time.Time
	cost     gpuproxy.Micros
	horizon  time.Duration
	defs     []guardrails.Window
	key      string
	hold     bool
	want     guardrails.Snapshot // the model's figures before the step
	admit    bool                // the model's decision: want.Fits(cost)
	holdIdx  int                 // the model's index of the hold opened (admitted, with a hold)
	nEnt     int                 // how many entries the model had: the fast path's spent is read over these
	boundary string              // how the cost was chosen, for failure messages and counts
	entry    billing.Entry
	id       string // meter or instance id
	price    gpuproxy.Micros
	windows  []guardrails.Window
}

func (o ruleOp) String() string {
	switch o.kind {
	case opAdmit, opRent:
		what := "read"
		if o.kind == opRent {
			what = "rent " + o.id
		} else if o.hold {
			what = "hold"
		}
		return fmt.Sprintf("%s cost %d (%s) at %d horizon %s key %q defaults %v", what, o.cost, o.boundary,
			o.now.UnixMicro(), o.horizon, o.key, o.defs)
	case opEntry:
		return fmt.Sprintf("entry %s %d at %d key %q instance %q by caller %v", o.entry.Type, o.entry.Amount,
			o.entry.At.UnixMicro(), o.entry.KeyID, o.entry.InstanceID, o.entry.ByCaller)
	case opRelease:
		return fmt.Sprintf("release hold #%d at %d", o.holdIdx, o.now.UnixMicro())
	case opMeterStart:
		return fmt.Sprintf("start meter %s at %d, %d/h", o.id, o.now.UnixMicro(), o.price)
	case opMeterStop:
		return fmt.Sprintf("stop meter %s at %d", o.id, o.now.UnixMicro())
	case opLimits:
		return fmt.Sprintf("account limits %v", o.windows)
	case opKeyLimits:
		return fmt.Sprintf("key %s limits %v", o.key, o.windows)
	}
	return "?"
}

// ruleObs is what a store answered to one admission: the result and, on
// Postgres after a hold, the clock of the account's admission cache
// (cache_at_us; the exact path sets it to now, the fast path leaves it).
type ruleObs struct {
	res     guardrails.AdmitResult
	cacheAt int64
	done    bool
}

// runScript plays ops against s for account a, stopping at the first
// error. Holds opened by admissions are released by model index.
func runScript(ctx context.Context, s *db.Store, acct int64, ops []ruleOp, obs []ruleObs) error {
	holds := map[int]int64{}
	for i, o := range ops {
		var err error
		switch o.kind {
		case opAdmit:
			obs[i].res, err = s.Admit(ctx, guardrails.AdmitRequest{AccountID: acct, Cost: o.cost, Now: o.now,
				Horizon: o.horizon, Defaults: o.defs, Hold: o.hold, Ref: "rule", KeyID: o.key})
		case opRent:
			obs[i].res, err = rent(ctx, s, acct, o)
		case opEntry:
			_, _, err = s.AppendEntry(ctx, o.entry)
		case opRelease:
			var ok bool
			if ok, err = s.ReleaseHold(ctx, acct, holds[o.holdIdx], o.now); err == nil && !ok {
				err = fmt.Errorf("hold #%d (id %d) was not open", o.holdIdx, holds[o.holdIdx])
			}
		case opMeterStart:
			err = s.CreateMeter(ctx, billing.Meter{ID: o.id, AccountID: acct, InstanceID: o.id,
				PricePerHour: o.price, Start: o.now})
		case opMeterStop:
			err = s.StopMeter(ctx, o.id, o.now)
		case opLimits:
			err = s.SetLimits(ctx, acct, o.windows, "")
		case opKeyLimits:
			err = s.SetKeyLimits(ctx, acct, o.key, o.windows)
		}
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", i, o, err)
		}
		if (o.kind == opRent || o.kind == opAdmit && o.hold) && obs[i].res.Admitted {
			if o.kind == opAdmit {
				holds[o.holdIdx] = obs[i].res.HoldID
			}
			// Only an admitted hold can have come through the fast path.
			if obs[i].cacheAt, _, err = s.AdmitCacheForTest(ctx, acct); err != nil {
				return err
			}
		}
		obs[i].done = true
	}
	return nil
}

// rent admits an hourly instance (AdmitInstance: the admission and the
// instance row in one transaction) and, when admitted, runs it: starting,
// then running with a meter, which releases the hold.
func rent(ctx context.Context, s *db.Store, acct int64, o ruleOp) (guardrails.AdmitResult, error) {
	res, _, _, err := s.AdmitInstance(ctx, guardrails.AdmitRequest{AccountID: acct, Cost: o.cost, Now: o.now,
		Horizon: o.horizon, Defaults: o.defs, KeyID: o.key},
		gpuproxy.Instance{ID: o.id, Provider: "vast.ai", OfferID: "o-" + o.id, PricePerHour: o.price, Billing: "hourly"})
	if err != nil || !res.Admitted {
		return res, err
	}
	if _, err := s.MarkStarting(ctx, o.id, "p-"+o.id, nil, o.now); err != nil {
		return res, err
	}
	_, err = s.MarkRunning(ctx, o.id, "http://10.0.0.1:8000", o.now, &billing.Meter{PricePerHour: o.price})
	return res, err
}

// checkObs compares a store's answer to an admission with the model's.
// On Postgres a hold admitted on the cache fast path reports the spent it
// decided on: the exact spent at the cache's clock (an upper bound of the
// spent now; gp_admit.sql), so the account windows' spent is expected at
// obs.cacheAt when that is before now. It returns "" when they agree.
func checkObs(a *ruleAccount, o ruleOp, obs ruleObs, pg bool) string {
	res := obs.res
	var diffs []string
	add := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }
	if res.Admitted != o.admit {
		add("admitted %v, the rule says %v", res.Admitted, o.admit)
	}
	if (o.hold || o.kind == opRent) && res.Admitted != (res.HoldID != 0) {
		add("admitted %v with hold id %d", res.Admitted, res.HoldID)
	}
	want := o.want
	now := o.now.UnixMicro()
	fast := pg && (o.kind == opRent || o.hold) && res.Admitted && obs.cacheAt < now
	if res.OnExceed != want.OnExceed {
		add("on_exceed %q, want %q", res.OnExceed, want.OnExceed)
	}
	if res.Held != want.Held || res.Burn != want.Burn {
		add("account held %d burn %d, want held %d burn %d", res.Held, res.Burn, want.Held, want.Burn)
	}
	cmp := func(scope string, got, exp []guardrails.Usage, atCache bool) {
		got = slices.Clone(got)
		slices.SortFunc(got, func(x, y guardrails.Usage) int { return x.Minutes - y.Minutes })
		if len(got) != len(exp) {
			add("%s windows %v, want %v", scope, got, exp)
			return
		}
		for i, w := range exp {
			if atCache {
				w.Spent = a.spent(o.nEnt, "", obs.cacheAt, w.Minutes)
			}
			if got[i] != w {
				add("%s window %d min: limit %d spent %d held %d committed %d; want limit %d spent %d held %d committed %d",
					scope, w.Minutes, got[i].Limit, got[i].Spent, got[i].Held, got[i].Committed,
					w.Limit, w.Spent, w.Held, w.Committed)
			}
		}
	}
	cmp("account", res.Windows, want.Windows, fast)
	switch {
	case (res.Key == nil) != (want.Key == nil):
		add("key snapshot %+v, want %+v", res.Key, want.Key)
	case want.Key != nil:
		if res.Key.Held != want.Key.Held || res.Key.Burn != want.Key.Burn {
			add("key held %d burn %d, want held %d burn %d", res.Key.Held, res.Key.Burn, want.Key.Held, want.Key.Burn)
		}
		cmp("key", res.Key.Windows, want.Key.Windows, false)
	}
	return strings.Join(diffs, "; ")
}
