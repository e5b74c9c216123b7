package alerts

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

// The kill switch, the lifetime rules and the guard rails report to the
// service through hooks that never block their callers: an event is
// queued, and a worker of Run builds and records it. A full queue drops
// the event with a log line (refusals are rate-limited anyway; a kill
// switch or lifetime action is also logged by the fleet).

type hookEvent struct {
	accountID int64
	key       string // the key whose own window it is about; empty: the account's
	instance  string // kill switch
	lifetime  *LifetimeNotice
	service   *ServiceNotice
	refusal   bool
	request   string // refusal: "create" or "proxy"
	snap      guardrails.Snapshot
	usage     guardrails.Usage
	cost      gpuproxy.Micros
	at        time.Time
}

type refusalKey struct {
	account int64
	key     string
	minutes int
}

// KillSwitch is fleet.Options.OnKillSwitch's hook: the kill switch
// destroyed instance of account, keeping keyID's own windows (empty: the
// account's). One event per instance.
func (s *Service) KillSwitch(accountID int64, instanceID, keyID string) {
	s.enqueue(hookEvent{accountID: accountID, key: keyID, instance: instanceID, at: s.opts.Now()})
}

// Lifetime is fleet.Options.OnLifetime's hook: a lifetime rule of an
// instance (of the instance's account) is about to act (instance.idle_warning,
// instance.expiring) or acted (instance.stopped, instance.destroyed). One
// event per warning and per action, across every replica (see
// LifetimeNotice.dedupKey); an account without alert settings gets none,
// and setting a webhook later does not send past ones.
func (s *Service) Lifetime(n LifetimeNotice) {
	if err := n.validate(); err != nil {
		s.log.Error("lifetime alert event dropped", "account_id", n.Instance.AccountID, "err", err)
		return
	}
	s.enqueue(hookEvent{accountID: n.Instance.AccountID, instance: n.Instance.ID, lifetime: &n, at: s.opts.Now()})
}

// Refused is guardrails.Options.OnRefusal's hook: a request of cost was
// refused against snap (proxy: a proxy call, which is judged by the one
// admission rule, or, when free, by whether the window is open; else a
// create). One event per account and window per
// Options.RefusalGap across every replica; this replica also drops the
// refusals within the gap without asking the database, so a stream of
// refused proxy calls costs no queries.
func (s *Service) Refused(accountID int64, snap guardrails.Snapshot, cost gpuproxy.Micros, proxy bool) {
	var u guardrails.Usage
	var key string
	found := false
	refuses := func(w guardrails.Usage) bool {
		if proxy && cost == 0 {
			return !w.Open()
		}
		return !w.Fits(cost)
	}
	for _, w := range snap.Windows {
		if refuses(w) {
			u, found = w, true
			break
		}
	}
	if !found && snap.Key != nil { // the account had room: the key's own window refused it
		for _, w := range snap.Key.Windows {
			if refuses(w) {
				u, key, found = w, snap.Key.KeyID, true
				break
			}
		}
	}
	if !found {
		return
	}
	now := s.opts.Now()
	k := refusalKey{accountID, key, u.Minutes}
	s.refMu.Lock()
	if last, ok := s.refusals[k]; ok && now.Sub(last) < s.opts.RefusalGap && now.Sub(last) >= 0 {
		s.refMu.Unlock()
		return
	}
	s.refusals[k] = now
	if len(s.refusals) > 100_000 { // forget old windows rather than grow without bound
		for k, t := range s.refusals {
			if now.Sub(t) >= s.opts.RefusalGap {
				delete(s.refusals, k)
			}
		}
	}
	s.refMu.Unlock()
	req := "create"
	if proxy {
		req = "proxy"
	}
	s.enqueue(hookEvent{accountID: accountID, key: key, refusal: true, request: req, snap: snap, usage: u, cost: cost, at: now})
}

func (s *Service) enqueue(h hookEvent) {
	select {
	case s.hooks <- h:
	default:
		s.log.Warn("budget alert queue full; event dropped", "account_id", h.accountID, "instance", h.instance,
			"refusal", h.refusal)
	}
}

func (s *Service) runHooks(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case h := <-s.hooks:
			if err := s.record(ctx, h); err != nil && ctx.Err() == nil {
				s.log.Error("recording budget alert event", "account_id", h.accountID, "err", err)
			}
		}
	}
}

// record builds and stores a hook's event.
func (s *Service) record(ctx context.Context, h hookEvent) error {
	name, err := s.accountName(ctx, h.accountID)
	if err != nil {
		return err
	}
	var ev gpuproxy.AlertEvent
	var key, mark string
	switch {
	case h.lifetime != nil:
		ev, err = LifetimeEvent(h.accountID, name, *h.lifetime, h.at)
		key = h.lifetime.dedupKey()
	case h.service != nil:
		ev, err = ServiceAlert(h.accountID, name, *h.service)
		key = h.service.dedupKey()
	case h.refusal:
		ev, err = RefusalEvent(h.accountID, name, h.key, h.request, h.usage, h.cost, s.opts.RefusalGap, h.at)
		mark = "refusal/" + strconv.Itoa(h.usage.Minutes)
		if h.key != "" {
			mark = "refusal/key/" + h.key + "/" + strconv.Itoa(h.usage.Minutes)
		}
		key = mark + "/" + strconv.FormatInt(h.at.UnixMicro(), 10)
	default:
		snap, serr := s.spending.KeySpending(ctx, h.accountID, h.key)
		if serr != nil {
			return serr
		}
		ws := snap.Windows
		if h.key != "" && snap.Key != nil {
			ws = snap.Key.Windows
		}
		ev, err = KillSwitchEvent(h.accountID, name, h.key, h.instance, fullest(ws), h.at)
		key = "kill_switch/" + h.instance
	}
	if err != nil {
		return err
	}
	ok, err := s.store.RecordAlertEvent(ctx, ev, key, mark, s.opts.RefusalGap)
	if err != nil {
		return fmt.Errorf("recording %s event: %w", ev.Kind, err)
	}
	if ok {
		s.log.Info("budget alert event recorded", "account_id", h.accountID, "event", ev.ID, "type", ev.Kind,
			"window_minutes", ev.WindowMinutes, "instance", ev.InstanceID)
		s.poke()
	}
	return nil
}

// fullest returns the window whose spent + held + committed is the
// largest fraction of its limit (the first of a zero limit with spend).
func fullest(windows []guardrails.Usage) guardrails.Usage {
	var best guardrails.Usage
	bestF := -1.0
	for _, u := range windows {
		used := u.Spent + u.Held + u.Committed
		f := 0.0
		switch {
		case u.Limit > 0:
			f = float64(used) / float64(u.Limit)
		case used > 0:
			f = 1e18
		}
		if f > bestF {
			best, bestF = u, f
		}
	}
	return best
}
