package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// ConfirmTTL is how long a confirm token stays valid.
const ConfirmTTL = 10 * time.Minute

// ConfirmStore keeps per-key confirmation thresholds and single-use
// confirm tokens (db.Store implements it).
type ConfirmStore interface {
	KeyConfirmAbove(ctx context.Context, keyID string) (gpuproxy.Micros, bool, error)
	CreateConfirmToken(ctx context.Context, hash, keyID string, accountID int64, subject string,
		cost gpuproxy.Micros, now, expires time.Time) error
	ConsumeConfirmToken(ctx context.Context, hash, keyID, subject string, cost gpuproxy.Micros, now time.Time) (bool, error)
}

// ConfirmPrompt is what a person is asked to confirm.
type ConfirmPrompt struct {
	Provider     string
	OfferID      string
	GPUName      string
	NumGPUs      int
	PricePerHour gpuproxy.Micros
	Hours        int             // prepaid hours (0: hourly)
	Cost         gpuproxy.Micros // the admitted cost: the first hour, or the prepaid total
	Threshold    gpuproxy.Micros // the key's confirm_above
	// Spec, for a rent by spec, says what was asked for (Provider and
	// OfferID are then empty, PricePerHour is the cap and Cost the most
	// it admits).
	Spec string
}

// Message is the question put to the person.
func (p ConfirmPrompt) Message() string {
	if p.Spec != "" {
		what := fmt.Sprintf("up to $%s (the cap over the admission horizon)", p.Cost)
		if p.Hours > 0 {
			what = fmt.Sprintf("up to $%s (the cap, or %d prepaid hours at the cap)", p.Cost, p.Hours)
		}
		return fmt.Sprintf("Rent by spec: %s? This admits %s, above this key's confirmation threshold of $%s.",
			p.Spec, what, p.Threshold)
	}
	what := fmt.Sprintf("the first hour, $%s", p.Cost)
	if p.Hours > 0 {
		what = fmt.Sprintf("the prepaid total for %d hours, $%s", p.Hours, p.Cost)
	}
	return fmt.Sprintf("Rent %d× %s on %s (offer %s) at $%s/hour? This admits %s, above this key's confirmation threshold of $%s.",
		p.NumGPUs, p.GPUName, p.Provider, p.OfferID, p.PricePerHour, what, p.Threshold)
}

// confirm requires a person's confirmation when the creating key asks for
// it above cost: a valid confirm token of an earlier answer lets the create
// proceed, else it fails with confirmation_required and a new token bound
// to the key, the offer and the cost (details carry the question, which MCP
// puts to the person by elicitation). A store failure refuses (fail
// closed).
func (s *Service) confirm(ctx context.Context, accountID int64, req CreateRequest, q providers.Quote, cost gpuproxy.Micros) error {
	p := ConfirmPrompt{Provider: req.Provider, OfferID: req.OfferID, GPUName: q.GPUName, NumGPUs: q.NumGPUs,
		PricePerHour: q.PricePerHour, Cost: cost}
	if q.Billing == providers.BillingPrepaid {
		p.Hours = req.Hours
	}
	subject := fmt.Sprintf("%s/%s/%d", req.Provider, req.OfferID, req.Hours)
	return s.askConfirm(ctx, accountID, req, subject, p, map[string]any{
		"provider": req.Provider, "offer_id": req.OfferID, "gpu_name": q.GPUName, "num_gpus": q.NumGPUs,
		"price_per_hour": q.PricePerHour, "hours": p.Hours})
}

// confirmSpec is confirm for a rent by spec: asked once, for the cap (the
// most any offer it may rent admits), with a token bound to the spec and
// the cap.
func (s *Service) confirmSpec(ctx context.Context, accountID int64, req CreateRequest, cost gpuproxy.Micros) error {
	sp := req.Spec
	p := ConfirmPrompt{Spec: sp.searched(s.specProviderNames(sp)), PricePerHour: sp.MaxPricePerHour, Cost: cost,
		Hours: sp.Hours, NumGPUs: sp.NumGPUs}
	return s.askConfirm(ctx, accountID, req, "spec/"+req.Fingerprint(), p, map[string]any{
		"spec": p.Spec, "max_price_per_hour": sp.MaxPricePerHour, "num_gpus": sp.NumGPUs, "hours": sp.Hours})
}

// askConfirm is confirm's common part: subject and cost bind the token.
func (s *Service) askConfirm(ctx context.Context, accountID int64, req CreateRequest, subject string, p ConfirmPrompt,
	details map[string]any) error {
	cs := s.opts.Confirm
	if cs == nil || req.KeyID == "" {
		return nil
	}
	above, ok, err := cs.KeyConfirmAbove(ctx, req.KeyID)
	if err != nil {
		return fmt.Errorf("reading the key's confirmation threshold: %w", err)
	}
	if !ok || p.Cost <= above {
		return nil
	}
	p.Threshold = above
	now := s.opts.Now()
	if req.ConfirmToken != "" {
		used, err := cs.ConsumeConfirmToken(ctx, tokenHash(req.ConfirmToken), req.KeyID, subject, p.Cost, now)
		if err != nil {
			return fmt.Errorf("checking the confirm token: %w", err)
		}
		if used {
			return nil
		}
		// Unknown, used, expired, or for another offer or cost (the price
		// moved): a new confirmation is needed.
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("making a confirm token: %w", err)
	}
	token := "gpc_" + base64.RawURLEncoding.EncodeToString(b)
	expires := now.Add(ConfirmTTL)
	if err := cs.CreateConfirmToken(ctx, tokenHash(token), req.KeyID, accountID, subject, p.Cost, now, expires); err != nil {
		return fmt.Errorf("storing the confirm token: %w", err)
	}
	msg := p.Message() + " A person must confirm: if they agree, repeat the same create with confirm_token within 10 minutes."
	if req.ConfirmToken != "" {
		msg = "The confirm token given is not valid for this create (used, expired, or the offer or its price changed). " + msg
	}
	details["confirm_token"], details["expires_at"], details["cost"] = token, expires.UTC(), p.Cost
	details["confirm_above"], details["question"] = above, p.Message()
	return &gpuproxy.Error{Code: gpuproxy.ECONFIRM, Message: msg, Details: details}
}

func tokenHash(t string) string {
	h := sha256.Sum256([]byte(t))
	return hex.EncodeToString(h[:])
}
