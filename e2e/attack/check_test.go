package attack

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The invariants are read straight from the database (one repeatable-read
// snapshot), never through gpuproxy: the harness trusts only the tables.

const hourUS = int64(time.Hour / time.Microsecond)

type accountRow struct {
	id     int64
	name   string
	held   int64
	limits []windowLimit
}

type windowLimit struct {
	minutes int
	limit   int64
}

type holdRow struct {
	id, account, amount int64
	ref, status         string
	createdUS           int64
	keyID               string // the key whose admission took it ("" for none)
}

type ledgerRow struct {
	id, account          int64
	typ                  string
	amount, spend, atUS  int64
	provider, instanceID string
	key, basis           string
	keyID                string // the API key the row is attributed to ("" for none)
}

type instanceRow struct {
	id, provider, providerID, status, billing string
	account                                   int64
	hours                                     int
	prepaid, price, holdID                    int64
	createdUS, startedUS, terminatedUS        int64
	idemKey                                   string
	keyID                                     string // the key that created it
	offerID                                   string // the provider's offer (vast.ai: ask id) it rented
	// Its lifetime (issue 21; zero on a build without lifetimes): the
	// idle rule, the rule that acted on it and when, its last activity.
	idleTimeoutMS, idleGraceMS, actedUS, lastActivityUS int64
	idleAction, actedRule                               string
	// market is "interruptible" for a bid (issue 33; "" on a build
	// without markets): its meter may pause while it is preempted.
	market string
}

// callKey names a create call: its account and Idempotency-Key.
type callKey struct {
	account int64
	key     string
}

// callRow is a create call with an Idempotency-Key (create_calls):
// running, done with an instance, or failed with an error.
type callRow struct {
	account                int64
	key, state, instanceID string
	errCode, errMessage    string
}

// keyRow is an API key and its own windows (none: only its account's).
type keyRow struct {
	id, name string
	account  int64
	limits   []windowLimit
}

type meterRow struct {
	id, instanceID                  string
	account, price, startUS, stopUS int64
	chargedUntilUS, chargedMicros   int64
	stopped                         bool
}

// dbState is every row the invariants look at, read in one snapshot.
type dbState struct {
	nowUS     int64
	accounts  map[int64]*accountRow
	byName    map[string]*accountRow
	holds     []holdRow
	ledger    []ledgerRow
	instances map[string]*instanceRow
	meters    []meterRow
	// hasKeys: the schema has per-key windows (an older build's has not,
	// and then every key column reads as "").
	hasKeys bool
	keys    map[string]*keyRow // by id
	// calls are the create calls with an Idempotency-Key (issue 20's
	// create_calls), by account id and key; nil when the schema has none.
	calls map[callKey]*callRow
	// hasLifetimes: the schema has instance lifetimes (issue 21).
	hasLifetimes bool
	// hasMarket: the schema has instance markets (issue 33).
	hasMarket bool
}

func readState(ctx context.Context, url string) (*dbState, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	s := &dbState{accounts: map[int64]*accountRow{}, byName: map[string]*accountRow{}, instances: map[string]*instanceRow{},
		keys: map[string]*keyRow{}}
	var hasCalls bool
	if err := tx.QueryRow(ctx, `SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT,
	                                   to_regclass('api_key_limits') IS NOT NULL, to_regclass('create_calls') IS NOT NULL,
	                                   EXISTS (SELECT 1 FROM information_schema.columns
	                                            WHERE table_name = 'instances' AND column_name = 'acted_rule'),
	                                   EXISTS (SELECT 1 FROM information_schema.columns
	                                            WHERE table_name = 'instances' AND column_name = 'market')`).
		Scan(&s.nowUS, &s.hasKeys, &hasCalls, &s.hasLifetimes, &s.hasMarket); err != nil {
		return nil, err
	}
	keyCol := "''"
	if s.hasKeys {
		keyCol = "COALESCE(key_id, '')"
	}
	q := func(sql string, scan func(pgx.Rows) error) error {
		rows, err := tx.Query(ctx, sql)
		if err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	if err := q("SELECT id, name, held_micros FROM accounts", func(r pgx.Rows) error {
		a := &accountRow{}
		if err := r.Scan(&a.id, &a.name, &a.held); err != nil {
			return err
		}
		s.accounts[a.id], s.byName[a.name] = a, a
		return nil
	}); err != nil {
		return nil, err
	}
	if err := q("SELECT account_id, window_minutes, limit_micros FROM account_limits ORDER BY window_minutes", func(r pgx.Rows) error {
		var id int64
		var w windowLimit
		if err := r.Scan(&id, &w.minutes, &w.limit); err != nil {
			return err
		}
		if a := s.accounts[id]; a != nil {
			a.limits = append(a.limits, w)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := q("SELECT id, account_id, name FROM api_keys", func(r pgx.Rows) error {
		k := &keyRow{}
		if err := r.Scan(&k.id, &k.account, &k.name); err != nil {
			return err
		}
		s.keys[k.id] = k
		return nil
	}); err != nil {
		return nil, err
	}
	if s.hasKeys {
		if err := q("SELECT key_id, window_minutes, limit_micros FROM api_key_limits ORDER BY window_minutes", func(r pgx.Rows) error {
			var id string
			var w windowLimit
			if err := r.Scan(&id, &w.minutes, &w.limit); err != nil {
				return err
			}
			if k := s.keys[id]; k != nil {
				k.limits = append(k.limits, w)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	if err := q("SELECT id, account_id, amount_micros, ref, status, created_us, "+keyCol+" FROM holds ORDER BY id", func(r pgx.Rows) error {
		var h holdRow
		if err := r.Scan(&h.id, &h.account, &h.amount, &h.ref, &h.status, &h.createdUS, &h.keyID); err != nil {
			return err
		}
		s.holds = append(s.holds, h)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := q(`SELECT id, account_id, type, amount_micros, spend_micros, at_us, provider, instance_id,
	                    COALESCE(idempotency_key, ''), basis, `+keyCol+` FROM ledger ORDER BY id`, func(r pgx.Rows) error {
		var e ledgerRow
		if err := r.Scan(&e.id, &e.account, &e.typ, &e.amount, &e.spend, &e.atUS, &e.provider, &e.instanceID,
			&e.key, &e.basis, &e.keyID); err != nil {
			return err
		}
		s.ledger = append(s.ledger, e)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := q(`SELECT id, account_id, provider, provider_instance_id, status, billing, hours, prepaid_total_micros,
	                    price_micros, COALESCE(hold_id, 0), created_us, COALESCE(started_us, 0),
	                    COALESCE(terminated_us, 0), COALESCE(idempotency_key, ''), `+keyCol+`, offer_id FROM instances`, func(r pgx.Rows) error {
		i := &instanceRow{}
		if err := r.Scan(&i.id, &i.account, &i.provider, &i.providerID, &i.status, &i.billing, &i.hours, &i.prepaid,
			&i.price, &i.holdID, &i.createdUS, &i.startedUS, &i.terminatedUS, &i.idemKey, &i.keyID, &i.offerID); err != nil {
			return err
		}
		s.instances[i.id] = i
		return nil
	}); err != nil {
		return nil, err
	}
	if s.hasLifetimes {
		if err := q(`SELECT id, idle_timeout_ms, idle_grace_ms, idle_action, acted_rule, COALESCE(acted_us, 0),
		                    COALESCE(last_activity_us, 0) FROM instances`, func(r pgx.Rows) error {
			var id string
			var l instanceRow
			if err := r.Scan(&id, &l.idleTimeoutMS, &l.idleGraceMS, &l.idleAction, &l.actedRule, &l.actedUS,
				&l.lastActivityUS); err != nil {
				return err
			}
			if i := s.instances[id]; i != nil {
				i.idleTimeoutMS, i.idleGraceMS, i.idleAction = l.idleTimeoutMS, l.idleGraceMS, l.idleAction
				i.actedRule, i.actedUS, i.lastActivityUS = l.actedRule, l.actedUS, l.lastActivityUS
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	if s.hasMarket {
		if err := q(`SELECT id, market FROM instances`, func(r pgx.Rows) error {
			var id, market string
			if err := r.Scan(&id, &market); err != nil {
				return err
			}
			if i := s.instances[id]; i != nil {
				i.market = market
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	if err := q(`SELECT id, account_id, instance_id, price_micros, start_us, stop_us IS NOT NULL, COALESCE(stop_us, 0),
	                    charged_until_us, charged_micros FROM meters`, func(r pgx.Rows) error {
		var m meterRow
		if err := r.Scan(&m.id, &m.account, &m.instanceID, &m.price, &m.startUS, &m.stopped, &m.stopUS,
			&m.chargedUntilUS, &m.chargedMicros); err != nil {
			return err
		}
		s.meters = append(s.meters, m)
		return nil
	}); err != nil {
		return nil, err
	}
	if hasCalls {
		s.calls = map[callKey]*callRow{}
		if err := q(`SELECT account_id, idempotency_key, state, instance_id, error_code, error_message FROM create_calls`,
			func(r pgx.Rows) error {
				c := &callRow{}
				if err := r.Scan(&c.account, &c.key, &c.state, &c.instanceID, &c.errCode, &c.errMessage); err != nil {
					return err
				}
				s.calls[callKey{c.account, c.key}] = c
				return nil
			}); err != nil {
			return nil, err
		}
	}
	return s, tx.Commit(ctx)
}

// usd renders micro-dollars as dollars.
func usd(m int64) string {
	sign := ""
	if m < 0 {
		sign, m = "-", -m
	}
	return fmt.Sprintf("%s$%d.%06d", sign, m/1_000_000, m%1_000_000)
}

// windowFigures is where one window of an account, or of one of its keys,
// stands.
type windowFigures struct {
	account                    string
	key                        string // the key's name for a key's own window; "" for the account's
	minutes                    int
	limit, spent, held, commit int64
	metered                    int64 // metered time-billed charges in the window: the burn that passed
	over                       int64 // spent + held + committed − limit
}

// scope names whose window it is: "atk-create" or "atk-create/key A".
func (w windowFigures) scope() string {
	if w.key == "" {
		return w.account
	}
	return w.account + "/" + w.key
}

func (w windowFigures) String() string {
	return fmt.Sprintf("%-18s %5dm  limit %s  spent %s  held %s  committed %s  metered burn %s  spent+held+committed-limit %s  overspend %s",
		w.scope(), w.minutes, usd(w.limit), usd(w.spent), usd(w.held), usd(w.commit), usd(w.metered), usd(w.over),
		usd(max(0, w.over-w.metered)))
}

// windows computes the guard-rail figures of every account's windows and
// then every key's own windows, the way DESIGN.md defines them, counting
// every ledger row dated after the window's start (also rows dated after
// "now"), with horizon H. A key's figures count what is attributed to it:
// ledger rows by key_id, its open holds, the meters of the instances it
// created (gp_admit's key rule).
func (s *dbState) windows(horizon time.Duration) []windowFigures {
	var out []windowFigures
	ids := make([]int64, 0, len(s.accounts))
	for id := range s.accounts {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		a := s.accounts[id]
		out = append(out, s.figures(a.name, "", a.limits, horizon,
			func(e ledgerRow) bool { return e.account == id },
			func(h holdRow) bool { return h.account == id },
			func(m meterRow) bool { return m.account == id })...)
	}
	for _, k := range s.sortedKeys() {
		if len(k.limits) == 0 {
			continue
		}
		acct := ""
		if a := s.accounts[k.account]; a != nil {
			acct = a.name
		}
		out = append(out, s.figures(acct, k.name, k.limits, horizon,
			func(e ledgerRow) bool { return e.keyID == k.id },
			func(h holdRow) bool { return h.keyID == k.id },
			func(m meterRow) bool {
				in := s.instances[m.instanceID]
				return m.account == k.account && in != nil && in.keyID == k.id
			})...)
	}
	return out
}

// figures computes one scope's windows from the ledger rows, holds and
// meters that belong to it.
func (s *dbState) figures(account, key string, limits []windowLimit, horizon time.Duration,
	row func(ledgerRow) bool, hold func(holdRow) bool, meter func(meterRow) bool) []windowFigures {
	var held, burn int64
	for _, h := range s.holds {
		if h.status == "open" && hold(h) {
			held += h.amount
		}
	}
	for _, m := range s.meters {
		if !m.stopped && meter(m) {
			burn += m.price
		}
	}
	var out []windowFigures
	for _, w := range limits {
		wus := int64(w.minutes) * 60 * 1_000_000
		f := windowFigures{account: account, key: key, minutes: w.minutes, limit: w.limit, held: held,
			commit: burn * min(int64(horizon/time.Microsecond), wus) / hourUS}
		for _, e := range s.ledger {
			if e.atUS > s.nowUS-wus && row(e) {
				f.spent += e.spend
				if e.typ == "charge" && strings.HasPrefix(e.key, "meter:") {
					f.metered += e.spend
				}
			}
		}
		f.over = f.spent + f.held + f.commit - f.limit
		out = append(out, f)
	}
	return out
}

// sortedKeys lists the keys by account and name.
func (s *dbState) sortedKeys() []*keyRow {
	ks := make([]*keyRow, 0, len(s.keys))
	for _, k := range s.keys {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].account != ks[j].account {
			return ks[i].account < ks[j].account
		}
		return ks[i].name < ks[j].name
	})
	return ks
}

// keyNamed is the account's key of that name, or nil.
func (s *dbState) keyNamed(account, name string) *keyRow {
	a := s.byName[account]
	for _, k := range s.keys {
		if a != nil && k.account == a.id && k.name == name {
			return k
		}
	}
	return nil
}

// violations collects broken invariants; safe for concurrent use.
type violations struct {
	mu   sync.Mutex
	list []string
}

func (v *violations) add(format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list = append(v.list, fmt.Sprintf(format, args...))
}

// checkWindows: no window, an account's or a key's own, has spent + held +
// committed past its limit by more than the metered burn of the run.
func (s *dbState) checkWindows(v *violations, horizon time.Duration) []windowFigures {
	ws := s.windows(horizon)
	for _, w := range ws {
		if w.over > w.metered {
			v.add("overspend: %s %dm window: spent %s + held %s + committed %s = %s > limit %s + metered burn %s (by %s)",
				w.scope(), w.minutes, usd(w.spent), usd(w.held), usd(w.commit), usd(w.spent+w.held+w.commit),
				usd(w.limit), usd(w.metered), usd(w.over-w.metered))
		}
	}
	return ws
}

// checkSettled: after the settle wait nothing is in flight.
func (s *dbState) checkSettled(v *violations) {
	for _, in := range s.instances {
		switch in.status {
		case "pending", "starting", "terminating":
			v.add("not settled: instance %s (%s) still %s", in.id, in.provider, in.status)
		}
	}
}

// checkHolds: every open hold has an owner — an instance still pending or
// starting, or a proxy lease younger than maxLeaseAge (0: no lease may be
// open; negative: leases are not judged, the expiry being unknown) — and
// each account's held_micros is the sum of its open holds.
func (s *dbState) checkHolds(v *violations, maxLeaseAge time.Duration) (openLeases int) {
	sums := map[int64]int64{}
	for _, h := range s.holds {
		if h.status != "open" {
			continue
		}
		sums[h.account] += h.amount
		age := time.Duration(s.nowUS-h.createdUS) * time.Microsecond
		if strings.HasPrefix(h.ref, "lease:") {
			openLeases++
			if maxLeaseAge < 0 {
				continue
			}
			if maxLeaseAge == 0 {
				v.add("open proxy lease after every replica stopped: hold %d %s %s (age %s)", h.id, h.ref, usd(h.amount), age.Round(time.Millisecond))
			} else if age > maxLeaseAge {
				v.add("expired proxy lease not released: hold %d %s %s, age %s > %s", h.id, h.ref, usd(h.amount),
					age.Round(time.Millisecond), maxLeaseAge)
			}
			continue
		}
		in := s.instances[h.ref]
		switch {
		case in == nil:
			v.add("open hold %d (%s, %s) owned by nothing", h.id, h.ref, usd(h.amount))
		case in.status != "pending" && in.status != "starting":
			v.add("open hold %d (%s) of instance %s, which is %s", h.id, usd(h.amount), in.id, in.status)
		case in.holdID != h.id:
			v.add("open hold %d of instance %s, whose hold is %d", h.id, in.id, in.holdID)
		}
	}
	for id, a := range s.accounts {
		if a.held != sums[id] {
			v.add("account %s: held_micros %s, open holds sum to %s", a.name, usd(a.held), usd(sums[id]))
		}
	}
	return openLeases
}

// checkCreates: every create the client saw succeed has its row, and no
// Idempotency-Key made two.
func (s *dbState) checkCreates(v *violations, account string, results []createResult) {
	a := s.byName[account]
	if a == nil {
		v.add("account %s missing", account)
		return
	}
	perKey := map[string]int{}
	for _, in := range s.instances {
		if in.account == a.id && in.idemKey != "" {
			perKey[in.idemKey]++
		}
	}
	for k, n := range perKey {
		if n > 1 {
			v.add("Idempotency-Key %s made %d instances", k, n)
		}
	}
	for _, r := range results {
		if r.inst.ID == "" {
			continue
		}
		in := s.instances[r.inst.ID]
		switch {
		case in == nil:
			v.add("create %s answered %d with instance %s, which has no row", r.key, r.final.status, r.inst.ID)
		case in.account != a.id || in.idemKey != r.key:
			v.add("instance %s belongs to account %d key %q, not %s key %s", in.id, in.account, in.idemKey, account, r.key)
		}
	}
}
