package db

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
)

// SettleLease closes a proxy budget lease: under the account lock, its
// hold is closed (settled, or released when nothing was charged) and one
// ledger charge per instance and key charged is appended (on an account
// lease, attributed to the key that made the calls), keyed by hold,
// instance and calling key so a retried settlement never charges twice. When the reconciler expired the
// lease meanwhile (this replica was cut off for longer than the expiry),
// the lease was charged in full then (ExpireLeases); its charges are
// appended all the same — the calls were served — and that full charge is
// refunded, so the lease ends at what its calls cost, never above what
// was admitted.
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
		open, err := closeHold(ctx, c, accountID, holdID, status, now)
		if err != nil {
			return err
		}
		lease := strconv.FormatInt(holdID, 10)
		if !open {
			if err := refundExpiry(ctx, c, accountID, lease, now); err != nil {
				return err
			}
		}
		for _, ch := range charges {
			if ch.Amount <= 0 {
				continue
			}
			e := billing.Entry{AccountID: accountID, Type: billing.Charge, Amount: ch.Amount, At: now,
				InstanceID: ch.InstanceID, KeyID: ch.KeyID, ByCaller: true, Basis: billing.Metered,
				Description:    "proxy requests: " + strconv.FormatInt(ch.Requests, 10),
				IdempotencyKey: "lease:" + lease + ":" + ch.InstanceID}
			if ch.Caller {
				e.IdempotencyKey += ":key:" + ch.KeyID
			}
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
// settlement's "outcome unknown" charge, to the lease's key) and charges
// what it actually cost to its instance and the key that made it, idempotently by the call's ref, in one
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
				InstanceID: a.InstanceID, KeyID: cmp.Or(a.CallerKeyID, a.KeyID), ByCaller: true, Basis: billing.Metered,
				Description: "proxy requests: 1 (settled at its end)", IdempotencyKey: key + ":charge"}
			if _, _, err := appendEntry(ctx, c, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// ExpireLeases charges in full every open proxy lease hold created before
// before (a replica that crashed, or lost the database for longer than
// the expiry, left it), each under its account's lock: the hold is closed
// and its whole amount charged (to its key, without an instance). The
// lease's replica may still be serving calls under it and settle it later
// (SettleLease then refunds this charge and charges what the calls cost),
// so its amount must stay spent: released, it would be admitted again to
// others, and the late settlement would carry the window past its limit.
// It returns how many it charged.
func (s *Store) ExpireLeases(ctx context.Context, before, now time.Time) (int, error) {
	r, err := s.pool().query(ctx, `SELECT id, account_id, amount_micros, COALESCE(key_id, '') FROM holds
		WHERE status = 'open' AND ref LIKE 'lease:%' AND created_us < $1`, us(before))
	type hold struct {
		id, acct int64
		amount   int64
		key      string
	}
	hs, err := scanAll(r, err, func(r rows) (hold, error) {
		var h hold
		return h, r.Scan(&h.id, &h.acct, &h.amount, &h.key)
	})
	if err != nil {
		return 0, fmt.Errorf("listing expired leases: %w", translate(err))
	}
	n := 0
	for _, h := range hs {
		var charged bool
		err := s.inTx(ctx, func(c conn) error {
			if err := s.lockAccount(ctx, c, h.acct); err != nil {
				return err
			}
			var err error
			if charged, err = closeHold(ctx, c, h.acct, h.id, "settled", now); err != nil || !charged || h.amount <= 0 {
				return err
			}
			_, _, err = appendEntry(ctx, c, billing.Entry{AccountID: h.acct, Type: billing.Charge,
				Amount: gpuproxy.Micros(h.amount), At: now, KeyID: h.key, ByCaller: true, Basis: billing.Metered,
				Description: "proxy lease expired unsettled (its replica crashed or was cut off): charged in full " +
					"until the replica settles it", IdempotencyKey: expiryKey(strconv.FormatInt(h.id, 10))})
			return err
		})
		if err != nil {
			return n, fmt.Errorf("charging expired lease %d: %w", h.id, translate(err))
		}
		if charged {
			n++
		}
	}
	return n, nil
}

// expiryKey is the idempotency key of an expired lease's full charge.
func expiryKey(lease string) string { return "lease:" + lease + ":expired" }

// refundExpiry refunds an expired lease's full charge, once, if it has
// one: its replica settled it after all. The caller holds the account lock.
func refundExpiry(ctx context.Context, c conn, accountID int64, lease string, now time.Time) error {
	var amount int64
	var key string
	err := c.queryRow(ctx, "SELECT amount_micros, COALESCE(key_id, '') FROM ledger WHERE account_id = $1 AND idempotency_key = $2",
		accountID, expiryKey(lease)).Scan(&amount, &key)
	if err = translate(err); gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return nil
	} else if err != nil {
		return err
	}
	_, _, err = appendEntry(ctx, c, billing.Entry{AccountID: accountID, Type: billing.Refund, Amount: gpuproxy.Micros(amount),
		At: now, KeyID: key, ByCaller: true, Basis: billing.Metered,
		Description:    "proxy lease settled by its replica after it expired: its full charge returned",
		IdempotencyKey: expiryKey(lease) + ":refund"})
	return err
}
