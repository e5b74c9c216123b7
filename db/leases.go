package db

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

// SettleLease closes a proxy budget lease: under the account lock, its
// hold is closed (settled, or released when nothing was charged) and one
// ledger charge per instance is appended, keyed by hold and instance so a
// retried settlement never charges twice. The charges are appended even
// when the hold is no longer open (the reconciler expired it while this
// replica was cut off): the calls were served, so the money was spent.
func (s *Store) SettleLease(ctx context.Context, accountID, holdID int64, charges []guardrails.LeaseCharge, now time.Time) error {
	return s.inTx(ctx, func(c conn) error {
		if err := s.lockAccount(ctx, c, accountID); err != nil {
			return err
		}
		status := "released"
		for _, ch := range charges {
			if ch.Amount > 0 {
				status = "settled"
			}
		}
		if _, err := closeHold(ctx, c, accountID, holdID, status, now); err != nil {
			return err
		}
		lease := strconv.FormatInt(holdID, 10)
		for _, ch := range charges {
			if ch.Amount <= 0 {
				continue
			}
			e := billing.Entry{AccountID: accountID, Type: billing.Charge, Amount: ch.Amount, At: now,
				InstanceID: ch.InstanceID, KeyID: ch.KeyID, ByCaller: true, Basis: billing.Metered,
				Description:    "proxy requests: " + strconv.FormatInt(ch.Requests, 10),
				IdempotencyKey: "lease:" + lease + ":" + ch.InstanceID}
			if ch.InstanceID == "" {
				e.Description += " (outcome unknown at settlement)"
			}
			if _, _, err := appendEntry(ctx, c, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// AmendLease refunds a call charged at its admitted cost when its lease
// was settled before it ended (booked without an instance, as the
// settlement's "outcome unknown" charge) and charges what it actually
// cost to its instance, idempotently by the call's ref, in one
// transaction serialized with admissions.
func (s *Store) AmendLease(ctx context.Context, accountID, holdID int64, a guardrails.LeaseAmend, now time.Time) error {
	return s.inTx(ctx, func(c conn) error {
		if err := s.lockAccount(ctx, c, accountID); err != nil {
			return err
		}
		key := "lease:" + strconv.FormatInt(holdID, 10) + ":amend:" + a.Ref
		if a.Admitted > 0 {
			e := billing.Entry{AccountID: accountID, Type: billing.Refund, Amount: a.Admitted, At: now, KeyID: a.KeyID,
				ByCaller: true, Basis: billing.Metered, Description: "proxy request " + a.Ref + ": admitted cost returned (it ended after its lease)",
				IdempotencyKey: key + ":refund"}
			if _, _, err := appendEntry(ctx, c, e); err != nil {
				return err
			}
		}
		if a.Amount > 0 {
			e := billing.Entry{AccountID: accountID, Type: billing.Charge, Amount: a.Amount, At: now,
				InstanceID: a.InstanceID, KeyID: a.KeyID, ByCaller: true, Basis: billing.Metered,
				Description: "proxy requests: 1 (settled at its end)", IdempotencyKey: key + ":charge"}
			if _, _, err := appendEntry(ctx, c, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// ExpireLeases releases every open proxy lease hold created before before
// (a replica that crashed, or lost the database for longer than the
// expiry, left it), each under its account's lock. It returns how many it
// released.
func (s *Store) ExpireLeases(ctx context.Context, before, now time.Time) (int, error) {
	r, err := s.pool().query(ctx, `SELECT id, account_id FROM holds
		WHERE status = 'open' AND ref LIKE 'lease:%' AND created_us < $1`, us(before))
	type hold struct{ id, acct int64 }
	hs, err := scanAll(r, err, func(r rows) (hold, error) {
		var h hold
		return h, r.Scan(&h.id, &h.acct)
	})
	if err != nil {
		return 0, fmt.Errorf("listing expired leases: %w", translate(err))
	}
	n := 0
	for _, h := range hs {
		ok, err := s.ReleaseHold(ctx, h.acct, h.id, now)
		if err != nil {
			return n, fmt.Errorf("releasing lease %d: %w", h.id, translate(err))
		}
		if ok {
			n++
		}
	}
	return n, nil
}
