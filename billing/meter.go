package billing

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
)

// MeterStore is what the metering engine needs from the database.
type MeterStore interface {
	DueMeters(ctx context.Context, limit int) ([]Meter, error)
	Meter(ctx context.Context, id string) (Meter, error)
	RecordMeterCharge(ctx context.Context, m Meter, until time.Time, charged gpuproxy.Micros, e Entry) error
	WithLeader(ctx context.Context, name string, fn func(ctx context.Context) error) (bool, error)
	// OldestRunningMeter returns the charged_until of the running (not
	// stopped) meter charged least far; ok is false when none runs.
	OldestRunningMeter(ctx context.Context) (chargedUntil time.Time, ok bool, err error)
}

// DefaultMeterInterval is the metering engine's default time between
// ticks.
const DefaultMeterInterval = time.Minute

// MeterOptions configure the engine. Zero values take the defaults;
// Validate says which field is wrong.
type MeterOptions struct {
	// Interval between ticks in Run (default DefaultMeterInterval).
	Interval time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// OnCharge, when set, observes each appended charge (metrics).
	OnCharge func(amount gpuproxy.Micros)
}

// Meterer appends charges for time-billed meters. Charges are cumulative —
// each tick charges price × (elapsed since start) minus what was already
// charged — so rounding never drifts; each carries an idempotency key unique
// per meter and period; one replica runs at a time (leader lock), and the
// store's compare-and-set on the meter is the backstop if two ever race.
type Meterer struct {
	store MeterStore
	opts  MeterOptions
}

// NewMeterer returns an engine with defaults filled in.
func NewMeterer(store MeterStore, o MeterOptions) *Meterer {
	return &Meterer{store: store, opts: o.withDefaults()}
}

// Validate reports the first field of o that NewMeterer cannot use, naming
// it and its configured value. Zero values take the defaults.
func (o MeterOptions) Validate() error {
	if o.Interval < 0 {
		return fmt.Errorf("billing.MeterOptions.Interval: must not be negative, got %s", o.Interval)
	}
	return nil
}

// withDefaults returns o with every zero field set to its default.
func (o MeterOptions) withDefaults() MeterOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultMeterInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Cumulative is what meter m charges in all from its start to t: price ×
// whole milliseconds elapsed, rounded down; nothing for t at or before the
// start. Every charge is a difference of two of these, so rounding never
// drifts, and a meter stopped at s owes exactly Cumulative(m, s).
func Cumulative(m Meter, t time.Time) gpuproxy.Micros {
	if !t.After(m.Start) {
		return 0
	}
	return m.PricePerHour.MulMillis(t.Sub(m.Start).Milliseconds())
}

// Due computes what meter m owes up to now, never past its stop: the new
// cumulative total and the period end. Pure; exported for tests and the
// instance service.
func Due(m Meter, now time.Time) (until time.Time, charged gpuproxy.Micros) {
	until = now
	if !m.Stop.IsZero() && m.Stop.Before(until) {
		until = m.Stop
	}
	if until.Before(m.ChargedUntil) {
		return m.ChargedUntil, m.Charged
	}
	return until, Cumulative(m, until)
}

// Tick charges every due meter once, if this replica is the leader. It
// returns the number of charges appended.
func (mt *Meterer) Tick(ctx context.Context) (int, error) {
	n := 0
	ran, err := mt.store.WithLeader(ctx, "metering", func(ctx context.Context) error {
		var err error
		n, err = mt.tick(ctx)
		return err
	})
	if err != nil || !ran {
		return 0, err
	}
	return n, nil
}

func (mt *Meterer) tick(ctx context.Context) (int, error) {
	now := mt.opts.Now()
	ms, err := mt.store.DueMeters(ctx, 10_000)
	if err != nil {
		return 0, fmt.Errorf("listing meters: %w", err)
	}
	n := 0
	for _, m := range ms {
		amount, err := mt.charge(ctx, m, now)
		if gpuproxy.ErrorCode(err) == gpuproxy.ECONFLICT {
			// Stopped or advanced since it was listed: read it again and
			// charge what is still due (up to the stop, if it stopped).
			mt.opts.Logger.Info("meter changed since listed; charging it afresh", "meter", m.ID, "err", err)
			if m, err = mt.store.Meter(ctx, m.ID); err == nil {
				amount, err = mt.charge(ctx, m, now)
			}
		}
		switch {
		case gpuproxy.ErrorCode(err) == gpuproxy.ECONFLICT:
			mt.opts.Logger.Info("meter advanced elsewhere; skipped", "meter", m.ID, "err", err)
			continue
		case err != nil:
			return n, fmt.Errorf("charging meter %s: %w", m.ID, err)
		}
		if amount != 0 {
			n++
			if mt.opts.OnCharge != nil {
				mt.opts.OnCharge(amount)
			}
		}
	}
	return n, nil
}

// charge records what meter m owes up to now (never past its stop) and
// returns the amount appended; nothing is due, nothing is written.
func (mt *Meterer) charge(ctx context.Context, m Meter, now time.Time) (gpuproxy.Micros, error) {
	until, charged := Due(m, now)
	if !until.After(m.ChargedUntil) {
		return 0, nil
	}
	amount := charged - m.Charged
	desc := fmt.Sprintf("%s at $%s/h, %s to %s", m.InstanceID, m.PricePerHour, m.ChargedUntil.Format(time.RFC3339), until.Format(time.RFC3339))
	if m.StopReason != "" && !m.Stop.IsZero() && !until.Before(m.Stop) {
		desc += " (final: ended by the " + m.StopReason + " rule)"
	}
	e := Entry{AccountID: m.AccountID, Type: Charge, Amount: amount, At: until, Provider: m.Provider,
		InstanceID: m.InstanceID, Basis: Metered,
		Description:    desc,
		IdempotencyKey: MeterChargeKey(m.ID, m.ChargedUntil)}
	if err := mt.store.RecordMeterCharge(ctx, m, until, charged, e); err != nil {
		return 0, err
	}
	return amount, nil
}

// MeterChargeKey is the idempotency key of meter id's charge for the
// period that starts at from: unique per meter and period.
func MeterChargeKey(id string, from time.Time) string {
	return fmt.Sprintf("meter:%s:%d", id, from.UnixMicro())
}

// MeterChargeStart returns the start of the period a metered charge
// covers (it ends at the entry's At), read from its MeterChargeKey; ok is
// false for any other entry.
func MeterChargeStart(e Entry) (from time.Time, ok bool) {
	rest, found := strings.CutPrefix(e.IdempotencyKey, "meter:")
	i := strings.LastIndexByte(rest, ':')
	if !found || e.Type != Charge || i < 0 {
		return time.Time{}, false
	}
	us, err := strconv.ParseInt(rest[i+1:], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMicro(us).UTC(), true
}

// Lag is how far metering runs behind: now minus the charged_until of the
// running meter charged least far (about one Interval when healthy); ok
// is false when no meter runs.
func (mt *Meterer) Lag(ctx context.Context) (lag time.Duration, ok bool, err error) {
	until, ok, err := mt.store.OldestRunningMeter(ctx)
	if err != nil || !ok {
		return 0, false, err
	}
	return max(mt.opts.Now().Sub(until), 0), true, nil
}

// Run ticks every Interval until ctx is done.
func (mt *Meterer) Run(ctx context.Context) {
	t := time.NewTicker(mt.opts.Interval)
	defer t.Stop()
	for {
		if _, err := mt.Tick(ctx); err != nil && ctx.Err() == nil {
			mt.opts.Logger.Error("metering tick failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
