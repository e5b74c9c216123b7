package db_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/guardrails"
)

var (
	admitSeed  = flag.Uint64("admit.seed", 0, "seed of TestAdmissionDifferential (0: $ADMIT_SEED, else the clock)")
	admitCases = flag.Int("admit.cases", 0, "admissions TestAdmissionDifferential compares (0: $ADMIT_CASES, else 10000)")
)

// diffAdmitsPerAccount is how many admissions one account's script holds;
// the accounts of a run share one schema and one SQLite file.
const diffAdmitsPerAccount = 25

// TestAdmissionDifferential feeds gp_admit (Postgres) and admitSQL
// (SQLite) the same random account histories and requires, for every
// admission, the decision and the figures (spent, held, committed and
// burn of every window, the account's and the key's) that the Go model
// computes from the history directly (admit_rule_test.go) — so the two
// stores agree with each other and with the rule. A history is bulk
// written to both stores (windows of the account and of its keys; ledger
// rows of every type dated in and out of the windows, on minute
// boundaries and off, after now; open and closed holds and leases; running
// and stopped meters of instances created by keys), then a script runs
// through the store API: reads and holds at moving clocks with costs on
// and ±1 µ$ around every window's remaining, bursts of holds with nothing
// spent in between (Postgres's cache fast path), new rows, releases,
// meters starting and stopping, limits changing.
//
// The seed is logged and printed on failure; rerun one with
// ADMIT_SEED=<seed> (or -args -admit.seed=<seed>). ADMIT_CASES sets the
// number of admissions (default 10,000; raceAdmitCases under -race, where
// .ci/run also runs it at full size without the race detector).
// raceAdmitCases is the default number of admissions under -race.
const raceAdmitCases = 1_500

func TestAdmissionDifferential(t *testing.T) {
	seed := *admitSeed
	if v := os.Getenv("ADMIT_SEED"); seed == 0 && v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("ADMIT_SEED=%q: %v", v, err)
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	cases := *admitCases
	if v := os.Getenv("ADMIT_CASES"); cases == 0 && v != "" {
		var err error
		if cases, err = strconv.Atoi(v); err != nil {
			t.Fatalf("ADMIT_CASES=%q: %v", v, err)
		}
	}
	switch {
	case cases > 0:
	case raceEnabled:
		cases = raceAdmitCases
	default:
		cases = 10_000
	}
	t.Logf("seed %d (rerun with ADMIT_SEED=%d), %d admissions", seed, seed, cases)
	ctx := context.Background()
	start := time.Now()
	accts, scripts := diffHistories(seed, cases)
	stores := map[dbtest.Kind]*db.Store{}
	var setup sync.WaitGroup
	for _, k := range dbtest.Kinds {
		// Every store is opened before any is written: without
		// TEST_DATABASE_URL the Postgres one skips the test, which must not
		// happen while another goroutine writes a store the skip closes.
		stores[k] = dbtest.Open(t, k)
	}
	for k, s := range stores {
		setup.Add(1)
		go func() {
			defer setup.Done()
			if err := seedHistories(ctx, s, accts); err != nil {
				t.Errorf("%s: writing histories: %v", k, err)
			}
		}()
	}
	setup.Wait()
	if t.Failed() {
		t.FailNow()
	}
	seeded := time.Since(start)

	// Each store plays every account's script, a few accounts at a time;
	// the two stores run side by side.
	obs := map[dbtest.Kind][][]ruleObs{}
	errs := map[dbtest.Kind][]error{}
	for _, k := range dbtest.Kinds {
		obs[k], errs[k] = make([][]ruleObs, len(accts)), make([]error, len(accts))
	}
	var run sync.WaitGroup
	took := map[dbtest.Kind]*time.Duration{}
	for _, k := range dbtest.Kinds {
		obs, errs := obs[k], errs[k]
		next := make(chan int)
		d, s := new(time.Duration), stores[k]
		took[k] = d
		var workers sync.WaitGroup
		for range 3 {
			workers.Add(1)
			go func() {
				defer workers.Done()
				for i := range next {
					obs[i] = make([]ruleObs, len(scripts[i].ops))
					errs[i] = runScript(ctx, s, accts[i].a.id, scripts[i].ops, obs[i])
				}
			}()
		}
		run.Add(1)
		go func() {
			defer run.Done()
			for i := range accts {
				next <- i
			}
			close(next)
			workers.Wait()
			*d = time.Since(start) - seeded
		}()
	}
	run.Wait()
	played := time.Since(start) - seeded

	var n diffCounts
	failures := 0
	for i, sc := range scripts {
		a := sc.a
		for _, k := range dbtest.Kinds {
			if errs[k][i] != nil {
				t.Errorf("seed %d, account %d, %s: %v", seed, a.id, k, errs[k][i])
				failures++
			}
		}
		for j, o := range sc.ops {
			if o.kind != opAdmit && o.kind != opRent {
				continue
			}
			pg, sq := obs[dbtest.Postgres][i][j], obs[dbtest.SQLite][i][j]
			if !pg.done || !sq.done {
				break
			}
			n.count(o, pg)
			dPG, dSQ := checkObs(a, o, pg, true), checkObs(a, o, sq, false)
			if pg.res.Admitted != sq.res.Admitted {
				dPG = fmt.Sprintf("stores disagree (postgres admitted %v, sqlite %v); %s", pg.res.Admitted, sq.res.Admitted, dPG)
			}
			if dPG == "" && dSQ == "" {
				continue
			}
			failures++
			t.Errorf("seed %d, account %d, step %d: %s\n  postgres: %s\n  sqlite:   %s\n  model:    %+v%s\n  history:  %s",
				seed, a.id, j, o, orOK(dPG), orOK(dSQ), o.want, fastNote(o, pg), sc.describe(j))
			if failures >= 5 {
				t.Fatalf("seed %d: stopping after %d differences (rerun with ADMIT_SEED=%d)", seed, failures, seed)
			}
		}
	}
	if failures > 0 {
		t.Fatalf("seed %d: %d differences (rerun with ADMIT_SEED=%d)", seed, failures, seed)
	}
	for _, k := range dbtest.Kinds {
		for _, sc := range scripts {
			if held, sum, err := stores[k].HeldForTest(ctx, sc.a.id); err != nil || held != sum {
				t.Fatalf("%s account %d: held_micros %d, open holds %d, %v", k, sc.a.id, held, sum, err)
			}
		}
	}
	t.Logf("%d admissions on each store in %s (histories written in %s, scripts played in %s: postgres %s, sqlite %s): %s",
		n.cases, time.Since(start).Round(time.Millisecond), seeded.Round(time.Millisecond),
		played.Round(time.Millisecond), took[dbtest.Postgres].Round(time.Millisecond),
		took[dbtest.SQLite].Round(time.Millisecond), n)
	n.enough(t, cases)
}

// diffScript is one account's history and script.
type diffScript struct {
	a   *ruleAccount
	ops []ruleOp
	// initial describes the bulk-written history, for failure messages.
	initial string
}

func (sc diffScript) describe(upTo int) string {
	var b strings.Builder
	b.WriteString(sc.initial)
	for _, o := range sc.ops[:upTo] {
		if o.kind != opAdmit {
			b.WriteString("; " + o.String())
		}
	}
	return b.String()
}

// diffAccount is an account's bulk-written starting state.
type diffAccount struct {
	a       *ruleAccount
	limits  []guardrails.Window
	keys    []string
	keyWins map[string][]guardrails.Window
	insts   []diffInstance
	entries []billing.Entry
	holds   []diffHold
}

type diffInstance struct {
	id, key     string
	price       gpuproxy.Micros
	meter       bool
	start, stop int64 // stop 0: running
}

type diffHold struct {
	amount gpuproxy.Micros
	key    string
	ref    string
	status string
}

// diffHistories draws the accounts' starting states and scripts from seed.
func diffHistories(seed uint64, cases int) ([]diffAccount, []diffScript) {
	rng := rand.New(rand.NewPCG(seed, 30))
	var accts []diffAccount
	var scripts []diffScript
	for id := int64(1); len(accts)*diffAdmitsPerAccount < cases; id++ {
		a := newRuleAccount(id)
		now := t0.Add(time.Duration(rng.Int64N(int64(30 * 24 * time.Hour))))
		g := newRuleGen(rng, a, now)
		d := diffAccount{a: a, keyWins: map[string][]guardrails.Window{}}
		if rng.IntN(10) < 6 {
			d.limits = g.windows(3)
			a.limits = sortedWindows(d.limits)
		}
		for k := range rng.IntN(4) {
			kid := fmt.Sprintf("k%d_%d", id, k)
			var ws []guardrails.Window
			if rng.IntN(10) < 6 {
				ws = g.windows(2)
			}
			d.keys, d.keyWins[kid] = append(d.keys, kid), ws
			a.addKey(kid, ws)
		}
		for i := range rng.IntN(5) {
			in := diffInstance{id: fmt.Sprintf("i%d_%d", id, i), price: g.amount(3)}
			if len(d.keys) > 0 && rng.IntN(3) != 0 {
				in.key = d.keys[rng.IntN(len(d.keys))]
			}
			a.instKey[in.id] = in.key
			in.start = now.Add(-time.Duration(rng.Int64N(int64(48 * time.Hour)))).UnixMicro()
			switch r := rng.IntN(20); {
			case r < 12:
				in.meter = true
			case r < 15:
				in.meter, in.stop = true, now.Add(-time.Duration(rng.Int64N(int64(time.Hour)))).UnixMicro()
			default:
				g.spare = append(g.spare, in.id)
			}
			if rng.IntN(15) == 0 {
				in.price = 0 // a free instance: burn 0
			}
			if in.meter && in.stop == 0 {
				a.meters[in.id] = ruleMeter{price: in.price, key: in.key}
			}
			d.insts = append(d.insts, in)
		}
		for range rng.IntN(26) {
			e := g.entry()
			d.entries = append(d.entries, e)
			a.addEntry(e)
		}
		for i := range rng.IntN(5) + rng.IntN(3) {
			h := diffHold{amount: g.amount(10), ref: "create", status: "open"}
			if i%2 == 1 {
				h.ref = "lease:" + strconv.Itoa(i)
			}
			if len(d.keys) > 0 && rng.IntN(2) == 0 {
				h.key = d.keys[rng.IntN(len(d.keys))]
			}
			if rng.IntN(4) == 0 {
				h.status = []string{"released", "settled"}[rng.IntN(2)] // closed: counts nowhere
			} else {
				a.openHold(h.amount, h.key)
			}
			d.holds = append(d.holds, h)
		}
		initial := fmt.Sprintf("limits %v, keys %v, instances %+v, %d rows %s, holds %+v, now %d",
			d.limits, d.keyWins, d.insts, len(d.entries), describeEntries(d.entries), d.holds, now.UnixMicro())
		for g.admits < diffAdmitsPerAccount {
			g.step()
		}
		accts = append(accts, d)
		scripts = append(scripts, diffScript{a: a, ops: g.ops, initial: initial})
	}
	return accts, scripts
}

func describeEntries(es []billing.Entry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s %d@%d key %q inst %q caller %v", e.Type, e.Amount, e.At.UnixMicro(), e.KeyID,
			e.InstanceID, e.ByCaller)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// seedHistories writes every account's starting state in a few multi-row
// statements per table; the same text runs on both dialects, and the
// stores' own triggers fill the per-minute buckets and versions.
func seedHistories(ctx context.Context, s *db.Store, accts []diffAccount) error {
	null := func(v string) string {
		if v == "" {
			return "NULL"
		}
		return "'" + v + "'"
	}
	tables := []struct {
		head string
		rows func(d diffAccount) []string
	}{
		{"accounts (id, name, created_us)", func(d diffAccount) []string {
			return []string{fmt.Sprintf("(%d, 'diff%d', %d)", d.a.id, d.a.id, t0.UnixMicro())}
		}},
		{"api_keys (id, account_id, name, hash, scopes, created_us)", func(d diffAccount) []string {
			var rs []string
			for _, k := range d.keys {
				rs = append(rs, fmt.Sprintf("('%s', %d, '%s', 'h-%s', 'spending:read', %d)", k, d.a.id, k, k, t0.UnixMicro()))
			}
			return rs
		}},
		{"account_limits (account_id, window_minutes, limit_micros)", func(d diffAccount) []string {
			var rs []string
			for _, w := range d.limits {
				rs = append(rs, fmt.Sprintf("(%d, %d, %d)", d.a.id, w.Minutes, w.Limit))
			}
			return rs
		}},
		{"api_key_limits (key_id, window_minutes, limit_micros)", func(d diffAccount) []string {
			var rs []string
			for _, k := range d.keys {
				for _, w := range d.keyWins[k] {
					rs = append(rs, fmt.Sprintf("('%s', %d, %d)", k, w.Minutes, w.Limit))
				}
			}
			return rs
		}},
		{"instances (id, account_id, provider, status, billing, price_micros, key_id, created_us, updated_us)",
			func(d diffAccount) []string {
				var rs []string
				for _, in := range d.insts {
					rs = append(rs, fmt.Sprintf("('%s', %d, 'vast.ai', 'running', 'hourly', %d, %s, %d, %d)",
						in.id, d.a.id, in.price, null(in.key), in.start, in.start))
				}
				return rs
			}},
		{"meters (id, account_id, provider, instance_id, price_micros, start_us, stop_us, charged_until_us)",
			func(d diffAccount) []string {
				var rs []string
				for _, in := range d.insts {
					if !in.meter {
						continue
					}
					stop := "NULL"
					if in.stop != 0 {
						stop = strconv.FormatInt(in.stop, 10)
					}
					rs = append(rs, fmt.Sprintf("('%s', %d, 'vast.ai', '%s', %d, %d, %s, %d)",
						in.id, d.a.id, in.id, in.price, in.start, stop, in.start))
				}
				return rs
			}},
		{"ledger (account_id, type, amount_micros, spend_micros, at_us, basis, created_us, key_id, instance_id)",
			func(d diffAccount) []string {
				var rs []string
				for _, e := range d.entries {
					// The key as AppendEntry attributes it (the model's rule).
					k := e.KeyID
					if k == "" && !e.ByCaller {
						k = d.a.instKey[e.InstanceID]
					}
					rs = append(rs, fmt.Sprintf("(%d, '%s', %d, %d, %d, 'manual', %d, %s, '%s')",
						d.a.id, e.Type, e.Amount, e.Spend(), e.At.UnixMicro(), e.At.UnixMicro(), null(k), e.InstanceID))
				}
				return rs
			}},
		{"holds (account_id, amount_micros, ref, status, created_us, closed_us, key_id)", func(d diffAccount) []string {
			var rs []string
			for _, h := range d.holds {
				closed := "NULL"
				if h.status != "open" {
					closed = strconv.FormatInt(t0.UnixMicro(), 10)
				}
				rs = append(rs, fmt.Sprintf("(%d, %d, '%s', '%s', %d, %s, %s)",
					d.a.id, h.amount, h.ref, h.status, t0.UnixMicro(), closed, null(h.key)))
			}
			return rs
		}},
	}
	for _, tb := range tables {
		var rows []string
		for _, d := range accts {
			rows = append(rows, tb.rows(d)...)
		}
		for len(rows) > 0 {
			n := min(len(rows), 500)
			if err := s.ExecForTest(ctx, "INSERT INTO "+tb.head+" VALUES "+strings.Join(rows[:n], ", ")); err != nil {
				return fmt.Errorf("%s: %w", tb.head, err)
			}
			rows = rows[n:]
		}
	}
	return s.ExecForTest(ctx, `UPDATE accounts SET held_micros = (SELECT COALESCE(sum(h.amount_micros), 0)
		FROM holds h WHERE h.account_id = accounts.id AND h.status = 'open')`)
}

// diffCounts shows what a run exercised; enough fails a run that did not.
type diffCounts struct {
	cases, admitted, refused, holds, fast, keyScope, committed, horizon0Burn, atRemaining, overRemaining int
}

func (n *diffCounts) count(o ruleOp, pg ruleObs) {
	n.cases++
	if o.admit {
		n.admitted++
	} else {
		n.refused++
	}
	if o.hold || o.kind == opRent {
		n.holds++
		if pg.res.Admitted && pg.cacheAt < o.now.UnixMicro() {
			n.fast++
		}
	}
	if o.want.Key != nil {
		n.keyScope++
	}
	for _, u := range o.want.Windows {
		if u.Committed > 0 {
			n.committed++
			break
		}
	}
	if o.horizon == 0 && o.want.Burn > 0 {
		n.horizon0Burn++
	}
	switch {
	case strings.Contains(o.boundary, "remaining+0") && o.admit:
		n.atRemaining++
	case strings.Contains(o.boundary, "remaining+1") && !o.admit:
		n.overRemaining++
	}
}

func (n diffCounts) String() string {
	return fmt.Sprintf("%d admitted, %d refused; %d holds, %d of them on Postgres's cache fast path; %d with key windows; "+
		"%d with committed spend, %d with horizon 0 and a running instance; %d admitted at exactly a remaining, "+
		"%d refused 1 µ$ over one", n.admitted, n.refused, n.holds, n.fast, n.keyScope, n.committed, n.horizon0Burn,
		n.atRemaining, n.overRemaining)
}

// enough fails a run that did not exercise what it is for: a differential
// test that never reaches a path cannot fail on it.
func (n diffCounts) enough(t *testing.T, cases int) {
	t.Helper()
	for _, c := range []struct {
		what      string
		got, want int
	}{
		{"admissions", n.cases, cases},
		{"refusals", n.refused, cases / 10},
		{"admissions", n.admitted, cases / 10},
		{"fast-path holds", n.fast, cases / 50},
		{"key-window admissions", n.keyScope, cases / 10},
		{"admissions with committed spend", n.committed, cases / 5},
		{"horizon-0 admissions with burn", n.horizon0Burn, cases / 100},
		{"admissions at exactly a remaining", n.atRemaining, cases / 100},
		{"refusals 1 µ$ over a remaining", n.overRemaining, cases / 100},
	} {
		if c.got < c.want {
			t.Errorf("only %d %s, want at least %d: the histories no longer exercise them", c.got, c.what, c.want)
		}
	}
}

func orOK(s string) string {
	if s == "" {
		return "agrees with the model"
	}
	return s
}

func fastNote(o ruleOp, pg ruleObs) string {
	if pg.res.Admitted && (o.hold || o.kind == opRent) && pg.cacheAt < o.now.UnixMicro() {
		return fmt.Sprintf(" (postgres on its fast path, cache at %d)", pg.cacheAt)
	}
	return ""
}
