// Package guardrails enforces rolling-window spending limits. It is the only
// place that decides whether a cost may be spent: it asks the store for an
// account's windows (spent, held, committed) and admits a cost atomically
// with a hold, so concurrent callers — in one process or many replicas on
// one Postgres — can never together pass a limit. Proxy calls are admitted
// against budget leases taken through the same admission (lease.go). It
// fails closed: when spend cannot be read, nothing is admitted.
package guardrails

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
)

// Store is what the guard rails need from the database. Admit must evaluate
// and insert the hold atomically, serialized per account.
type Store interface {
	Admit(ctx context.Context, req AdmitRequest) (AdmitResult, error)
	ReleaseHold(ctx context.Context, accountID, holdID int64, now time.Time) (bool, error)
	SetLimits(ctx context.Context, accountID int64, windows []Window, onExceed string) error
	// SetKeyLimits replaces an API key's own windows (none: the key has
	// only its account's), under the account's lock.
	SetKeyLimits(ctx context.Context, accountID int64, keyID string, windows []Window) error
	// KeyLimits returns the windows of each of the account's keys that has
	// any, by key id.
	KeyLimits(ctx context.Context, accountID int64) (map[string][]Window, error)
	// SettleLease closes a proxy lease's hold (whether or not it is still
	// open) and appends one charge per LeaseCharge, idempotently, in one
	// transaction serialized with admissions.
	SettleLease(ctx context.Context, accountID, holdID int64, charges []LeaseCharge, now time.Time) error
	// AmendLease corrects, once per call (by amend.Ref), a settled lease
	// whose call had no outcome at settlement and was charged at its
	// admitted cost: it refunds that cost (booked without an instance)
	// and charges what the call actually cost to its instance, in one
	// transaction.
	AmendLease(ctx context.Context, accountID, holdID int64, amend LeaseAmend, now time.Time) error
	// ExpireLeases charges in full (closing them) the open proxy lease
	// holds created before before; a later SettleLease of one refunds
	// that charge and charges its calls.
	ExpireLeases(ctx context.Context, before, now time.Time) (int, error)
	// CurrentLimits returns the own windows of those of accountIDs and
	// keyIDs that have any: the proxy gate polls it to see limits set on
	// other replicas (limitwatch.go).
	CurrentLimits(ctx context.Context, accountIDs []int64, keyIDs []string) (map[int64][]Window, map[string][]Window, error)
}

// DefaultWindows are the limits an account without its own gets:
// $50 per 60 minutes and $1000 per 1440 minutes.
var DefaultWindows = []Window{
	{Minutes: 60, Limit: 50 * gpuproxy.MicrosPerUSD},
	{Minutes: 1440, Limit: 1000 * gpuproxy.MicrosPerUSD},
}

// Options configure a Service. Zero values take the defaults
// (options.go); Validate says which field is wrong.
type Options struct {
	// Defaults apply to accounts without limits of their own
	// (default DefaultWindows).
	Defaults []Window
	// Horizon is how far ahead running instances are committed (default
	// DefaultHorizon).
	Horizon time.Duration
	// LeaseExpiry is the age after which the reconciler charges in full
	// an open proxy lease, which only a crashed or cut-off replica leaves
	// (default DefaultLeaseExpiry).
	LeaseExpiry time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives refusal alerts (default slog.Default()).
	Logger *slog.Logger
	// OnDecision, when set, observes every admission decision (metrics).
	OnDecision func(kind string, allowed bool)
	// OnStoreError, when set, observes store failures (metrics).
	OnStoreError func()
	// OnRefusal, when set, observes every refusal by a limit with the
	// snapshot it was decided on (budget alerts); proxy tells a proxy
	// call's rule from a create's. It is called on the request's path:
	// it must not block.
	OnRefusal func(accountID int64, snap Snapshot, cost gpuproxy.Micros, proxy bool)
}

// Service is the guard-rail API used by REST, MCP, instance creation and the
// proxy.
type Service struct {
	store Store
	opts  Options

	hooksMu sync.Mutex
	hooks   []func(accountID int64, keyID string) // told of limits set here (proxy gates)
}

// New returns a Service with defaults filled in.
func New(store Store, o Options) *Service {
	return &Service{store: store, opts: o.withDefaults()}
}

// Horizon returns the admission horizon H.
func (s *Service) Horizon() time.Duration { return s.opts.Horizon }

// Spending returns the account's current windows.
func (s *Service) Spending(ctx context.Context, accountID int64) (Snapshot, error) {
	return s.KeySpending(ctx, accountID, "")
}

// KeySpending returns the account's current windows and, when keyID has
// windows of its own, the key's (Snapshot.Key).
func (s *Service) KeySpending(ctx context.Context, accountID int64, keyID string) (Snapshot, error) {
	res, err := s.admit(ctx, accountID, keyID, 0, false, "")
	return res.Snapshot, err
}

// Decision is the answer to a check: would Cost be admitted now.
type Decision struct {
	Snapshot
	Cost    gpuproxy.Micros
	Allowed bool
}

// Check reports whether cost would be admitted now, per window, without
// holding anything.
func (s *Service) Check(ctx context.Context, accountID int64, cost gpuproxy.Micros) (Decision, error) {
	return s.KeyCheck(ctx, accountID, "", cost)
}

// KeyCheck is Check for a cost keyID would cause: it must fit the key's
// own windows too.
func (s *Service) KeyCheck(ctx context.Context, accountID int64, keyID string, cost gpuproxy.Micros) (Decision, error) {
	if err := validCost(cost); err != nil {
		return Decision{}, err
	}
	res, err := s.admit(ctx, accountID, keyID, cost, false, "")
	if err != nil {
		return Decision{}, err
	}
	d := Decision{Snapshot: res.Snapshot, Cost: cost, Allowed: res.Admitted}
	s.observe("check", d.Allowed)
	return d, nil
}

// Refusal is the spending_limit_exceeded error a check's decision would
// meet on admission (naming the window and its numbers), or nil when it is
// allowed.
func (s *Service) Refusal(d Decision) error {
	if d.Allowed {
		return nil
	}
	return s.refusal(d.AccountID, d.Snapshot, d.Cost, false)
}

// Admit admits cost for the account atomically, returning the new hold's id,
// or a spending_limit_exceeded error naming the first window it would pass.
// The hold counts against every window until it is released or settled.
func (s *Service) Admit(ctx context.Context, accountID int64, cost gpuproxy.Micros, ref string) (int64, Snapshot, error) {
	if err := validCost(cost); err != nil {
		return 0, Snapshot{}, err
	}
	res, err := s.admit(ctx, accountID, "", cost, true, ref)
	if err != nil {
		return 0, res.Snapshot, err
	}
	s.observe("admit", res.Admitted)
	if !res.Admitted {
		err := s.refusal(accountID, res.Snapshot, cost, false)
		s.opts.Logger.Warn("spending limit refused admission", "account_id", accountID,
			"cost", cost.String(), "ref", ref, "details", gpuproxy.ErrorDetails(err))
		return 0, res.Snapshot, err
	}
	return res.HoldID, res.Snapshot, nil
}

// Release frees a hold that will not be charged (a failed create).
func (s *Service) Release(ctx context.Context, accountID, holdID int64) error {
	_, err := s.store.ReleaseHold(ctx, accountID, holdID, s.opts.Now())
	return s.storeErr(err)
}

// SetLimits replaces an account's windows and, if given, its on_exceed policy.
func (s *Service) SetLimits(ctx context.Context, accountID int64, windows []Window, onExceed string) error {
	if windows != nil {
		if err := ValidateWindows(windows); err != nil {
			return err
		}
	}
	if onExceed != "" && onExceed != gpuproxy.OnExceedBlock && onExceed != gpuproxy.OnExceedDestroy {
		return gpuproxy.Invalid("on_exceed", "must be block or destroy")
	}
	if err := s.storeErr(s.store.SetLimits(ctx, accountID, windows, onExceed)); err != nil {
		return err
	}
	s.limitsSet(accountID, "")
	return nil
}

// SetKeyLimits replaces an API key's own windows; an empty list removes
// them, leaving the key only its account's.
func (s *Service) SetKeyLimits(ctx context.Context, accountID int64, keyID string, windows []Window) error {
	if len(windows) > 0 {
		if err := ValidateWindows(windows); err != nil {
			return err
		}
	}
	if err := s.storeErr(s.store.SetKeyLimits(ctx, accountID, keyID, windows)); err != nil {
		return err
	}
	s.limitsSet(accountID, keyID)
	return nil
}

// onLimits registers f to be told of every limit set through s: a proxy
// gate over s drops its state for them at once.
func (s *Service) onLimits(f func(accountID int64, keyID string)) {
	s.hooksMu.Lock()
	defer s.hooksMu.Unlock()
	s.hooks = append(s.hooks, f)
}

// limitsSet tells the registered gates that limits changed.
func (s *Service) limitsSet(accountID int64, keyID string) {
	s.hooksMu.Lock()
	hooks := s.hooks
	s.hooksMu.Unlock()
	for _, f := range hooks {
		f(accountID, keyID)
	}
}

// KeyLimits returns the own windows of the account's keys that have any.
func (s *Service) KeyLimits(ctx context.Context, accountID int64) (map[string][]Window, error) {
	m, err := s.store.KeyLimits(ctx, accountID)
	return m, s.storeErr(err)
}

func (s *Service) admit(ctx context.Context, accountID int64, keyID string, cost gpuproxy.Micros, hold bool, ref string) (AdmitResult, error) {
	res, err := s.store.Admit(ctx, AdmitRequest{AccountID: accountID, Cost: cost, Now: s.opts.Now(),
		Horizon: s.opts.Horizon, Defaults: s.opts.Defaults, Hold: hold, Ref: ref, KeyID: keyID})
	return res, s.storeErr(err)
}

// storeErr makes every unexpected store error an unavailable error: the
// caller is refused (fail closed), never waved through.
func (s *Service) storeErr(err error) error {
	if err == nil {
		return nil
	}
	switch gpuproxy.ErrorCode(err) {
	case gpuproxy.ENOTFOUND, gpuproxy.EINVALID, gpuproxy.ECONFLICT:
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if s.opts.OnStoreError != nil {
		s.opts.OnStoreError()
	}
	s.opts.Logger.Error("spend store unavailable; refusing (fail closed)", "err", err)
	return &gpuproxy.Error{Code: gpuproxy.EUNAVAILABLE,
		Message: "spending cannot be verified right now (database unavailable); nothing was admitted", Cause: err}
}

func (s *Service) observe(kind string, allowed bool) {
	if s.opts.OnDecision != nil {
		s.opts.OnDecision(kind, allowed)
	}
}

func validCost(c gpuproxy.Micros) error {
	if c < 0 || c > gpuproxy.MaxMicros {
		return gpuproxy.Invalid("estimated_cost", "%s", gpuproxy.AmountRange(0, gpuproxy.MaxMicros, false))
	}
	return nil
}

// refusal builds the refusal error and reports it to OnRefusal.
func (s *Service) refusal(accountID int64, snap Snapshot, cost gpuproxy.Micros, proxy bool) error {
	if s.opts.OnRefusal != nil {
		s.opts.OnRefusal(accountID, snap, cost, proxy)
	}
	return Refusal(snap, cost, proxy)
}

// Refusal builds the spending_limit_exceeded error for cost against snap:
// it names the first window that does not fit and lists every window.
// A window of the admitting key's own is named with scope "key" and the
// key's id; the account's with scope "account". Every cost is judged by
// the one rule (Usage.Fits); a free proxy call (proxy set, cost 0) by
// Usage.Open.
func Refusal(snap Snapshot, cost gpuproxy.Micros, proxy bool) error {
	var first *Usage
	scope := "account"
	list := func(us []Usage, sc string) []map[string]any {
		out := make([]map[string]any, 0, len(us))
		for i, u := range us {
			fits := u.Fits(cost)
			if proxy && cost == 0 {
				fits = u.Open()
			}
			if !fits && first == nil {
				first, scope = &us[i], sc
			}
			out = append(out, map[string]any{"window_minutes": u.Minutes, "limit": u.Limit,
				"spent": u.Spent, "held": u.Held, "committed": u.Committed, "remaining": u.Remaining(),
				"would_exceed": !fits})
		}
		return out
	}
	windows := list(snap.Windows, "account")
	var keyWindows []map[string]any
	if snap.Key != nil {
		keyWindows = list(snap.Key.Windows, "key")
	}
	if first == nil {
		first = &Usage{}
	}
	whose := "the"
	if scope == "key" {
		whose = fmt.Sprintf("API key %s's own", snap.Key.KeyID)
	}
	msg := fmt.Sprintf("spending limit exceeded: %s %d-minute window allows $%s; spent $%s, held $%s, committed $%s, "+
		"so this request's $%s does not fit (remaining $%s). Destroy idle instances, wait for the window to roll, "+
		"or ask an admin to raise the limit.", whose, first.Minutes, first.Limit, first.Spent, first.Held, first.Committed,
		cost, first.Remaining())
	details := map[string]any{
		"scope": scope, "window_minutes": first.Minutes, "limit": first.Limit, "spent": first.Spent, "held": first.Held,
		"committed": first.Committed, "cost": cost, "remaining": first.Remaining(), "windows": windows,
	}
	if snap.Key != nil {
		details["key_id"] = snap.Key.KeyID
		details["key_windows"] = keyWindows
	}
	return &gpuproxy.Error{Code: gpuproxy.ELIMIT, Message: msg, Details: details}
}

// Request builds the admission request for cost with this service's
// defaults, horizon and clock, for stores that admit inside a larger
// transaction (instance creation).
func (s *Service) Request(accountID int64, cost gpuproxy.Micros, ref string) AdmitRequest {
	return AdmitRequest{AccountID: accountID, Cost: cost, Now: s.opts.Now(), Horizon: s.opts.Horizon,
		Defaults: s.opts.Defaults, Hold: true, Ref: ref}
}

// Decide turns a store's admission result into nil or the refusal error,
// recording the decision; err is the store's error, mapped fail-closed.
func (s *Service) Decide(res AdmitResult, cost gpuproxy.Micros, err error) error {
	if err = s.storeErr(err); err != nil {
		return err
	}
	s.observe("admit", res.Admitted)
	if !res.Admitted {
		err := s.refusal(res.AccountID, res.Snapshot, cost, false)
		s.opts.Logger.Warn("spending limit refused admission", "account_id", res.AccountID,
			"cost", cost.String(), "details", gpuproxy.ErrorDetails(err))
		return err
	}
	return nil
}

// Now returns the service clock's time.
func (s *Service) Now() time.Time { return s.opts.Now() }
