package db

import (
	"context"
	"fmt"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// The kill switch's read side: read-only queries over accounts whose
// on_exceed is destroy. They run every second on the leader, so each one
// stays on an index (meters_due / meters_running, instances by status,
// the account's own instances) and never scans holds.

const destroyAccounts = "SELECT id FROM accounts WHERE on_exceed = 'destroy'"

// KillSwitchExposures returns the time-billed exposure of every account
// whose on_exceed is destroy and that has an unfinished meter or a live
// hourly instance. Meters are read first, then instances, then holds:
// a meter advanced or an instance started between the reads is counted
// twice at worst (in both forms), never missed, so the kill switch's
// projection errs early.
func (s *Store) KillSwitchExposures(ctx context.Context) ([]billing.Exposure, error) {
	byAcct := map[int64]*billing.Exposure{}
	var order []int64
	get := func(id int64) *billing.Exposure {
		x, ok := byAcct[id]
		if !ok {
			x = &billing.Exposure{AccountID: id}
			byAcct[id] = x
			order = append(order, id)
		}
		return x
	}
	r, err := s.pool().query(ctx, "SELECT "+meterCols+` FROM meters
		WHERE (stop_us IS NULL OR charged_until_us < stop_us) AND account_id IN (`+destroyAccounts+`)
		ORDER BY account_id, id`)
	ms, err := scanAll(r, err, func(r rows) (billing.Meter, error) { return scanMeter(r) })
	if err != nil {
		return nil, fmt.Errorf("listing kill switch meters: %w", err)
	}
	for _, m := range ms {
		x := get(m.AccountID)
		x.Meters = append(x.Meters, m)
	}
	r, err = s.pool().query(ctx, "SELECT "+instanceCols+` FROM instances
		WHERE status IN ('pending', 'starting', 'running', 'terminating') AND billing = 'hourly'
		AND account_id IN (`+destroyAccounts+`) ORDER BY account_id, created_us, id`)
	insts, err := scanAll(r, err, func(r rows) (gpuproxy.Instance, error) { return scanInstance(r) })
	if err != nil {
		return nil, fmt.Errorf("listing kill switch instances: %w", err)
	}
	for _, in := range insts {
		x := get(in.AccountID)
		x.Instances = append(x.Instances, in)
	}
	// Open holds that become spend without a meter (proxy leases, prepaid
	// creates): the account's held total less its hourly creates' holds.
	r, err = s.pool().query(ctx, `SELECT a.id, a.held_micros - COALESCE((SELECT sum(h.amount_micros)
		FROM instances i JOIN holds h ON h.id = i.hold_id
		WHERE i.account_id = a.id AND i.billing = 'hourly' AND h.status = 'open'
		AND i.status IN ('pending', 'starting', 'running', 'terminating')), 0)
		FROM accounts a WHERE a.on_exceed = 'destroy' AND a.held_micros > 0`)
	type held struct {
		acct int64
		sum  gpuproxy.Micros
	}
	hs, err := scanAll(r, err, func(r rows) (held, error) {
		var h held
		return h, r.Scan(&h.acct, &h.sum)
	})
	if err != nil {
		return nil, fmt.Errorf("summing kill switch holds: %w", err)
	}
	for _, h := range hs {
		if x, ok := byAcct[h.acct]; ok && h.sum > 0 {
			x.Holds = h.sum
		}
	}
	out := make([]billing.Exposure, 0, len(order))
	for _, id := range order {
		out = append(out, *byAcct[id])
	}
	return out, nil
}
