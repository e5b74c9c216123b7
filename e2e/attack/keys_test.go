package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Per-key windows (issue 12): each account is attacked through several of
// its API keys, some with tight windows of their own nested inside the
// account's, some with none. A key's spend is what is attributed to it:
// ledger rows by key_id (an instance's charges are its creator key's, a
// proxy lease's its key's), its open holds and the burn of the instances it
// created.

// keyWindow is one of a key's own windows.
type keyWindow struct {
	minutes int
	usd     float64
}

// attackKey is one API key the attack spends through.
type attackKey struct {
	account string
	name    string      // unique in its account
	windows []keyWindow // its own windows at set-up; none: only its account's
	raise   float64     // USD added to its first window before every wave after the first, through the admin API
	share   int         // its share of its account's creates or proxy requests

	id, secret string // set up through the CLI
	out        tally  // outcomes; a spending refusal is labelled with the scope it names
	served     tally  // 2xx proxy replies by answering process

	mu        sync.Mutex
	admitted  float64  // USD its admitted creates asked for
	instances []string // the instances it created
}

// attackKeys are the keys of the attack. On atk-create, key A ($1 per 60
// min, raised by $0.25 a wave) and key B ($1.50 per 60 min and $1 per 24
// h: the longer window binds) stay under the account's $5 per 60 min, and
// the account's plain key competes with both for it; their windows are
// tight against a create's cost (up to $3), so while the account has
// room a key's own window refuses. On atk-proxy, key P ($0.30 per 60 min,
// raised by $0.05 a wave) sends half the proxy requests, under the
// account's limit. The account's window gains $0.20 a wave, for both
// keys: a raise of P's by as much left P a coin toss against the plain
// key for the account's new room, and at full size P's own window
// sometimes never refused (the account's, full of leases, was named
// first); at a quarter of it, P's own window binds in the later waves too.
// The plain key creates the proxy instance (its prepaid
// hour is above P's window); proxy calls are charged to the calling key,
// never the instance's creator. On atk-spec, key S ($0.25 per 60 min,
// raised by $0.10 a wave) sends two in three by-spec creates, under the
// account's window, with the plain key the third: its window is far below
// the spec's $2 cap, so it refuses an offer it cannot fit (after that one
// attempt) while the account has room.
func attackKeys() keySet {
	return keySet{
		{account: createAccount, name: "attack", share: 1},
		{account: createAccount, name: "attack A", windows: []keyWindow{{60, 1}}, raise: 0.25, share: 2},
		{account: createAccount, name: "attack B", windows: []keyWindow{{60, 1.5}, {1440, 1}}, share: 2},
		{account: proxyAccount, name: "attack", share: 1},
		{account: proxyAccount, name: "attack P", windows: []keyWindow{{60, 0.3}}, raise: 0.05, share: 1},
		{account: specAccount, name: "attack", share: 1},
		{account: specAccount, name: "attack S", windows: []keyWindow{{60, 0.25}}, raise: 0.1, share: 2},
	}
}

// without is the set less the account's keys.
func (ks keySet) without(account string) keySet {
	var out keySet
	for _, k := range ks {
		if k.account != account {
			out = append(out, k)
		}
	}
	return out
}

// keySet is every key of the attack.
type keySet []*attackKey

// plain is the account's key without windows of its own.
func (ks keySet) plain(account string) *attackKey {
	for _, k := range ks {
		if k.account == account && len(k.windows) == 0 {
			return k
		}
	}
	panic("no plain key of " + account)
}

// pick spreads an account's requests over its keys by share: request n
// goes to the key whose share n falls in.
func (ks keySet) pick(account string, n int) *attackKey {
	var mine []*attackKey
	total := 0
	for _, k := range ks {
		if k.account == account {
			mine = append(mine, k)
			total += k.share
		}
	}
	n %= total
	for _, k := range mine {
		if n < k.share {
			return k
		}
		n -= k.share
	}
	return mine[len(mine)-1]
}

// windowsAt is the key's windows in wave w: the first raised w times.
func (k *attackKey) windowsAt(wave int) []keyWindow { return raised(k.windows, k.raise, wave) }

// String renders the window as the CLI takes it: "60m=2", "24h=20".
func (w keyWindow) String() string {
	if w.minutes > 60 && w.minutes%60 == 0 {
		return fmt.Sprintf("%dh=%g", w.minutes/60, w.usd)
	}
	return fmt.Sprintf("%dm=%g", w.minutes, w.usd)
}

// setUpKeys creates the keys through the CLI (`keys create --window`) and
// reads their ids back from the database. Without per-key windows in the
// schema (an older build) the keys are created without windows.
func setUpKeys(ctx context.Context, ks keySet, run func(args ...string) string, dbURL string, windows bool) error {
	for _, k := range ks {
		args := []string{"keys", "create", "--account", k.account, "--preset", "assistant", "--name", k.name}
		if windows {
			for _, w := range k.windows {
				args = append(args, "--window", w.String())
			}
		}
		k.secret = lastLine(run(args...))
	}
	st, err := readState(ctx, dbURL)
	if err != nil {
		return err
	}
	for _, k := range ks {
		row := st.keyNamed(k.account, k.name)
		if row == nil {
			return fmt.Errorf("key %q of %s not in api_keys after keys create", k.name, k.account)
		}
		k.id = row.id
		if windows && len(row.limits) != len(k.windows) {
			return fmt.Errorf("key %s (%s) has %d windows in api_key_limits, created with %v", k.name, k.id, len(row.limits), k.windows)
		}
	}
	return nil
}

// putLimits replaces an account's or a key's windows through the admin
// API, on any replica (the last one may be down).
func putLimits(ctx context.Context, a *api, replica int, path, adminKey string, ws []keyWindow) reply {
	body := make([]map[string]any, len(ws))
	for i, w := range ws {
		body[i] = map[string]any{"window_minutes": w.minutes, "limit": w.usd}
	}
	var r reply
	for try := range 6 {
		r = a.do(ctx, replica+try, http.MethodPut, path, adminKey, map[string]any{"windows": body}, nil)
		if !r.retryable() {
			break
		}
		// pace: a client's retry backoff.
		time.Sleep(300 * time.Millisecond)
	}
	return r
}

// record counts one reply of the key's, labelling a spending refusal with
// the scope its details name: the key's own window, the account's, or
// (wrongly) another key's. A refusal naming the account's window whose
// details mark one of the key's own windows as refusing too is labelled
// so: the refusal names the first window that does not fit, the
// account's before the key's.
func (k *attackKey) record(r reply) {
	label := outcome(r)
	if r.errorCode() == "spending_limit_exceeded" {
		switch scope, id, m := r.limitScope(); {
		case scope == "key" && id == k.id:
			label += fmt.Sprintf(" (key's own %dm window)", m)
		case scope == "key":
			label += " (NAMES KEY " + id + ")"
		case scope == "":
			label += " (no scope named)"
		case r.keyWindowRefuses(k.id):
			label += fmt.Sprintf(" (%s %dm window; the key's own refuses too)", scope, m)
		default:
			label += fmt.Sprintf(" (%s %dm window)", scope, m)
		}
	}
	k.out.add(label)
}

// keyWindowRefuses reports whether a spending refusal's details mark a
// window of key id's own as not fitting (would_exceed).
func (r reply) keyWindowRefuses(id string) bool {
	var e struct {
		Error struct {
			Details struct {
				KeyID      string `json:"key_id"`
				KeyWindows []struct {
					WouldExceed bool `json:"would_exceed"`
				} `json:"key_windows"`
			} `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(r.body, &e) != nil || e.Error.Details.KeyID != id {
		return false
	}
	for _, w := range e.Error.Details.KeyWindows {
		if w.WouldExceed {
			return true
		}
	}
	return false
}

func (k *attackKey) addCreate(res createResult) {
	k.record(res.final)
	if res.inst.ID == "" {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.admitted += res.cost
	k.instances = append(k.instances, res.inst.ID)
}

// keySpend is everything attributed to the key over the whole run.
func (s *dbState) keySpend(id string) int64 {
	var sum int64
	for _, e := range s.ledger {
		if e.keyID == id {
			sum += e.spend
		}
	}
	return sum
}

// keyProxy is where one windowed proxy key stands at the end.
type keyProxy struct {
	key                   *attackKey
	limit, prior, charged int64
	served, byKilled      int
}

// checkKeys checks what only the keys show: every instance is attributed
// to the key that created it; a refusal never names a window the caller
// does not have; every key's own windows actually bound (at least one 402
// naming the key's window, or naming the account's while its details mark
// the key's as not fitting either: the account's is named first, and
// under the herd the account's window is often full too when a key's
// refuses — key B, whose creates mostly meet offers gone, then had runs
// without a refusal naming its own), so the no-overspend check of its
// windows (checkWindows and the sampler) was a contest; and a windowed proxy key's
// calls fit its room and are charged to it, as the account's are.
func checkKeys(v *violations, s *dbState, ks keySet, priors map[string]int64, killed []string) []keyProxy {
	if !s.hasKeys {
		return nil
	}
	var out []keyProxy
	cost := int64(requestCost * 1e6)
	for _, k := range ks {
		k.mu.Lock()
		for _, id := range k.instances {
			if in := s.instances[id]; in != nil && in.keyID != k.id {
				v.add("instance %s was created by key %s (%s) but is attributed to key %q", id, k.id, k.name, in.keyID)
			}
		}
		k.mu.Unlock()
		k.out.mu.Lock()
		ownRefusals := 0
		for label, n := range k.out.m {
			switch {
			case strings.Contains(label, "(NAMES KEY "):
				v.add("%s/%s (%s): %d refusal(s) %s: another key's window", k.account, k.name, k.id, n, label)
			case strings.Contains(label, "(no scope named)"):
				v.add("%s/%s: %d spending refusal(s) name no scope (want \"key\" or \"account\")", k.account, k.name, n)
			case strings.Contains(label, "(key's own ") || strings.Contains(label, "the key's own refuses too"):
				ownRefusals += n
				if len(k.windows) == 0 {
					v.add("%s/%s has no windows of its own, yet %d refusal(s) name its own window", k.account, k.name, n)
				}
			}
		}
		k.out.mu.Unlock()
		if len(k.windows) > 0 && ownRefusals == 0 {
			v.add("%s/%s (%s): its own windows never bound (no 402 naming the key's window, nor marking it as refusing too): the attack did not test them",
				k.account, k.name, k.id)
		}
		if k.account != proxyAccount || len(k.windows) == 0 {
			continue
		}
		// The key's proxy calls, like the account's: what the processes
		// never killed served fits the key's room and is charged to it.
		row := s.keys[k.id]
		if row == nil || len(row.limits) == 0 {
			v.add("proxy key %s (%s) lost its windows", k.name, k.id)
			continue
		}
		kp := keyProxy{key: k, limit: row.limits[0].limit, prior: priors[k.id], served: k.out.served()}
		kp.charged = s.keySpend(k.id) - kp.prior
		for _, name := range killed {
			kp.byKilled += k.served.get(name)
		}
		room := kp.limit - kp.prior
		survivors := int64(kp.served - kp.byKilled)
		if survivors*cost > room {
			v.add("key overspend: %s/%s: %d proxy requests served by replica processes never killed, at $%g = %s > room %s (limit %s - prior %s)",
				k.account, k.name, survivors, requestCost, usd(survivors*cost), usd(room), usd(kp.limit), usd(kp.prior))
		}
		if kp.charged > room {
			v.add("key overspend: %s/%s: proxy charges %s > room %s", k.account, k.name, usd(kp.charged), usd(room))
		}
		if unknown := int64(k.served.get("")); kp.charged < (survivors-unknown)*cost {
			v.add("lost key proxy charges: %s/%s: %d requests served by replica processes never killed, charged to the key only %s (want at least %s)",
				k.account, k.name, survivors, usd(kp.charged), usd((survivors-unknown)*cost))
		}
		out = append(out, kp)
	}
	return out
}

// keysReport is the keys' part of the summary.
func keysReport(p func(string, ...any), ks keySet, hasKeys bool, proxies []keyProxy, waves int) {
	if !hasKeys {
		p("keys: this build has no per-key windows (no api_key_limits): keys attacked as plain keys, key windows not checked")
		return
	}
	p("keys (own windows nested in the account's; a 402 is labelled with the scope its details name):")
	for _, k := range ks {
		ws := "account's only"
		if len(k.windows) > 0 {
			ws = fmt.Sprint(k.windows)
			if k.raise > 0 {
				ws += fmt.Sprintf(" first raised by $%g a wave to %v", k.raise, k.windowsAt(waves - 1)[0])
			}
		}
		p("  %s/%s (%s): windows %s", k.account, k.name, k.id, ws)
		p("    outcomes: %s", k.out.String())
		k.mu.Lock()
		if k.account != proxyAccount {
			p("    admitted %d creates asking $%.6f", len(k.instances), k.admitted)
		}
		k.mu.Unlock()
		for _, kp := range proxies {
			if kp.key == k {
				room := kp.limit - kp.prior
				p("    proxy: room %s (limit %s - prior %s) = %d requests; served (2xx) %d, by SIGKILLed processes %d; charged to the key %s",
					usd(room), usd(kp.limit), usd(kp.prior), room/int64(requestCost*1e6), kp.served, kp.byKilled, usd(kp.charged))
			}
		}
	}
}
