package alerts

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/internal/netpolicy"
)

// Store is what alerts need from the database; db.Store implements it.
// Deduplication is the store's: see db.Store.ObserveAlertLevels,
// RecordAlertEvent and ClaimAlertDeliveries.
type Store interface {
	AccountByID(ctx context.Context, id int64) (gpuproxy.Account, error)
	SetAlertConfig(ctx context.Context, cfg gpuproxy.AlertConfig, rotate bool, now time.Time) (gpuproxy.AlertConfig, bool, error)
	AlertConfig(ctx context.Context, accountID int64) (gpuproxy.AlertConfig, error)
	AlertAccounts(ctx context.Context) ([]int64, error)
	ObserveAlertLevels(ctx context.Context, accountID int64, now time.Time,
		observe func(ctx context.Context, cfg gpuproxy.AlertConfig) ([]gpuproxy.AlertLevel, error)) ([]gpuproxy.AlertEvent, bool, error)
	RecordAlertEvent(ctx context.Context, ev gpuproxy.AlertEvent, dedupKey, mark string, gap time.Duration) (bool, error)
	ClaimAlertDeliveries(ctx context.Context, now, until time.Time, n int) ([]gpuproxy.AlertDelivery, error)
	FinishAlertDelivery(ctx context.Context, id int64, claim string, o gpuproxy.AlertOutcome) (bool, error)
	ListAlertDeliveries(ctx context.Context, accountID int64, status string, beforeID int64, limit int) ([]gpuproxy.AlertDelivery, error)
}

// Spending reads an account's windows (guardrails.Service).
type Spending interface {
	Spending(ctx context.Context, accountID int64) (guardrails.Snapshot, error)
	// KeyLimits lists the account's keys that have windows of their own,
	// and KeySpending reads one key's (Snapshot.Key).
	KeyLimits(ctx context.Context, accountID int64) (map[string][]guardrails.Window, error)
	KeySpending(ctx context.Context, accountID int64, keyID string) (guardrails.Snapshot, error)
}

// Service evaluates, records and delivers an installation's budget
// alerts. Its methods are safe for concurrent use.
type Service struct {
	store    Store
	spending Spending
	opts     Options
	allow    netpolicy.Allowlist
	sender   *sender
	log      *slog.Logger

	names sync.Map // account id → name (names never change)

	wake  chan struct{} // an event was recorded: send now
	hooks chan hookEvent

	refMu    sync.Mutex
	refusals map[refusalKey]time.Time // this replica's last refusal event per window
}

// New returns a Service over store, reading windows through spending.
// Call Run to evaluate and send.
func New(store Store, spending Spending, o Options) *Service {
	o = o.withDefaults()
	s := &Service{store: store, spending: spending, opts: o, allow: netpolicy.NewAllowlist(o.AllowNetworks),
		log: o.Logger, wake: make(chan struct{}, 1), hooks: make(chan hookEvent, 256),
		refusals: map[refusalKey]time.Time{}}
	s.sender = newSender(s)
	return s
}

// Set stores an account's webhook URL and thresholds (nil: the
// defaults). The account's signing secret is created on the first Set,
// and replaced when rotate is set; secret is returned only then (show it
// once), and is "" when the stored secret is kept.
func (s *Service) Set(ctx context.Context, accountID int64, webhookURL string, thresholds []float64, rotate bool) (cfg gpuproxy.AlertConfig, secret string, err error) {
	if err := ValidateWebhookURL(webhookURL, s.allow); err != nil {
		return cfg, "", err
	}
	ts, err := ParseThresholds(thresholds)
	if err != nil {
		return cfg, "", err
	}
	cfg, isNew, err := s.store.SetAlertConfig(ctx, gpuproxy.AlertConfig{AccountID: accountID, WebhookURL: webhookURL,
		Thresholds: ts, Secret: NewSecret()}, rotate, s.opts.Now())
	if err != nil {
		return gpuproxy.AlertConfig{}, "", err
	}
	if isNew {
		secret = cfg.Secret
	}
	cfg.Secret = ""
	s.log.Info("budget alerts set", "account_id", accountID, "webhook_host", hostOf(webhookURL),
		"thresholds", len(ts), "new_secret", isNew)
	return cfg, secret, nil
}

// Config returns an account's alert settings without the secret.
func (s *Service) Config(ctx context.Context, accountID int64) (gpuproxy.AlertConfig, error) {
	c, err := s.store.AlertConfig(ctx, accountID)
	c.Secret = ""
	return c, err
}

// Deliveries lists an account's deliveries, newest first: status ""
// (all), pending, delivered or failed; beforeID pages (0: from the
// newest); limit 1 to 500 (0: 50).
func (s *Service) Deliveries(ctx context.Context, accountID int64, status string, beforeID int64, limit int) ([]gpuproxy.AlertDelivery, error) {
	switch status {
	case "", gpuproxy.AlertPending, gpuproxy.AlertDelivered, gpuproxy.AlertFailed:
	default:
		return nil, gpuproxy.Invalid("status", "must be pending, delivered or failed")
	}
	if limit == 0 {
		limit = 50
	}
	if limit < 1 || limit > 500 {
		return nil, gpuproxy.Invalid("limit", "must be between 1 and 500")
	}
	if beforeID < 0 {
		return nil, gpuproxy.Invalid("before", "must be a delivery id")
	}
	return s.store.ListAlertDeliveries(ctx, accountID, status, beforeID, limit)
}

// Run evaluates and sends until ctx ends, then waits for the attempts in
// flight (each bounded by Options.Timeout) so none is left claimed.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.runEvaluate(ctx) })
	wg.Go(func() { s.sender.run(ctx) })
	wg.Go(func() { s.runHooks(ctx) })
	wg.Wait()
}

func (s *Service) runEvaluate(ctx context.Context) {
	t := time.NewTicker(s.opts.EvalInterval)
	defer t.Stop()
	for {
		if _, err := s.Evaluate(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("evaluating budget alerts", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Evaluate observes every alerting account's windows once and records
// the crossings, returning the events it recorded (another replica may
// record some of the crossings instead: each is recorded once).
func (s *Service) Evaluate(ctx context.Context) ([]gpuproxy.AlertEvent, error) {
	ids, err := s.store.AlertAccounts(ctx)
	if err != nil {
		return nil, err
	}
	var out []gpuproxy.AlertEvent
	var firstErr error
	for _, id := range ids {
		evs, err := s.evaluateAccount(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			s.log.Warn("evaluating budget alerts of an account", "account_id", id, "err", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		out = append(out, evs...)
	}
	if len(out) > 0 {
		s.poke()
	}
	return out, firstErr
}

func (s *Service) evaluateAccount(ctx context.Context, id int64) ([]gpuproxy.AlertEvent, error) {
	evs, _, err := s.store.ObserveAlertLevels(ctx, id, s.opts.Now(),
		func(ctx context.Context, cfg gpuproxy.AlertConfig) ([]gpuproxy.AlertLevel, error) {
			// Read under the store's lock on the account's settings: see
			// db.Store.ObserveAlertLevels.
			snap, err := s.spending.Spending(ctx, id)
			if err != nil {
				return nil, err
			}
			name, err := s.accountName(ctx, id)
			if err != nil {
				return nil, err
			}
			var levels []gpuproxy.AlertLevel
			for _, u := range snap.Windows {
				used := u.Spent + u.Held + u.Committed
				for _, t := range cfg.Thresholds {
					l := gpuproxy.AlertLevel{WindowMinutes: u.Minutes, Threshold: t, Above: Reached(used, u.Limit, t)}
					if l.Above {
						ev, err := CrossingEvent(id, name, u, t, snap.At)
						if err != nil {
							return nil, err
						}
						l.Event = &ev
					}
					levels = append(levels, l)
				}
			}
			keyLevels, err := s.keyLevels(ctx, id, name, cfg)
			return append(levels, keyLevels...), err
		})
	for _, ev := range evs {
		s.log.Info("budget alert threshold crossed", "account_id", id, "event", ev.ID,
			"window_minutes", ev.WindowMinutes, "threshold", ev.Threshold.String())
	}
	return evs, err
}

// keyLevels are the levels of the account's keys' own windows, whose
// crossings are events of their own (with the key's id), at the account's
// thresholds.
func (s *Service) keyLevels(ctx context.Context, id int64, name string, cfg gpuproxy.AlertConfig) ([]gpuproxy.AlertLevel, error) {
	lims, err := s.spending.KeyLimits(ctx, id)
	if err != nil || len(lims) == 0 {
		return nil, err
	}
	keys := make([]string, 0, len(lims))
	for k := range lims {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var levels []gpuproxy.AlertLevel
	for _, k := range keys {
		snap, err := s.spending.KeySpending(ctx, id, k)
		if err != nil {
			return nil, err
		}
		if snap.Key == nil {
			continue // its windows were removed since
		}
		for _, u := range snap.Key.Windows {
			used := u.Spent + u.Held + u.Committed
			for _, t := range cfg.Thresholds {
				l := gpuproxy.AlertLevel{KeyID: k, WindowMinutes: u.Minutes, Threshold: t, Above: Reached(used, u.Limit, t)}
				if l.Above {
					ev, err := KeyCrossingEvent(id, name, k, u, t, snap.At)
					if err != nil {
						return nil, err
					}
					l.Event = &ev
				}
				levels = append(levels, l)
			}
		}
	}
	return levels, nil
}

func (s *Service) accountName(ctx context.Context, id int64) (string, error) {
	if v, ok := s.names.Load(id); ok {
		return v.(string), nil
	}
	a, err := s.store.AccountByID(ctx, id)
	if err != nil {
		return "", err
	}
	s.names.Store(id, a.Name)
	return a.Name, nil
}

// poke wakes the sender.
func (s *Service) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
