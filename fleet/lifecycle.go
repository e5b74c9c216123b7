package fleet

import (
	"context"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// Instance lifecycle events (created, running, terminated with its final
// cost) are logged at info, one line each, for operators.

// logCreated logs an instance the provider has accepted (or the
// reconciler adopted).
func (s *Service) logCreated(inst gpuproxy.Instance) {
	s.opts.Logger.Info("instance created", "instance", inst.ID, "account_id", inst.AccountID,
		"provider", inst.Provider, "provider_instance_id", inst.ProviderInstanceID, "offer", inst.OfferID,
		"gpu", inst.GPUName, "num_gpus", inst.NumGPUs, "billing", inst.Billing,
		"price_per_hour", inst.PricePerHour.String(), "prepaid_total", inst.PrepaidTotal.String(), "hours", inst.Hours)
}

// logRunning logs an instance that has started running.
func (s *Service) logRunning(inst gpuproxy.Instance) {
	s.opts.Logger.Info("instance running", "instance", inst.ID, "account_id", inst.AccountID,
		"provider", inst.Provider, "gpu", inst.GPUName, "started_at", inst.StartedAt,
		"start_seconds", inst.StartedAt.Sub(inst.CreatedAt).Seconds())
}

// markTerminated is Store.MarkTerminated that logs the termination with
// the instance's final cost, once: not when the row was already
// terminated at another time (a repeated or raced call).
func (s *Service) markTerminated(ctx context.Context, id string, at time.Time, refund *billing.Entry, why string) (gpuproxy.Instance, error) {
	out, err := s.store.MarkTerminated(ctx, id, at, refund)
	if err != nil || out.Status != gpuproxy.Terminated || out.TerminatedAt.UnixMicro() != at.UnixMicro() {
		return out, err
	}
	cost, cerr := s.finalCost(ctx, out)
	attrs := []any{"instance", out.ID, "account_id", out.AccountID, "provider", out.Provider, "gpu", out.GPUName,
		"billing", out.Billing, "reason", why, "terminated_at", out.TerminatedAt,
		"final_cost", cost.String(), "final_cost_micros", int64(cost)}
	if !out.StartedAt.IsZero() {
		attrs = append(attrs, "run_seconds", out.TerminatedAt.Sub(out.StartedAt).Seconds())
	}
	if cerr != nil {
		attrs = append(attrs, "cost_err", cerr.Error())
	}
	s.opts.Logger.Info("instance terminated", attrs...)
	return out, nil
}

// FinalCost is what inst costs in all once its meter has charged up to
// its stop (see finalCost): for a terminated instance, its final cost even
// before the last metering lands in the ledger.
func (s *Service) FinalCost(ctx context.Context, inst gpuproxy.Instance) (gpuproxy.Micros, error) {
	return s.finalCost(ctx, inst)
}

// finalCost is what the instance costs in all once its meter has charged
// up to the stop: the ledger's entries for it (charges and adjustments
// less refunds) plus the metered time up to the stop not yet charged.
func (s *Service) finalCost(ctx context.Context, inst gpuproxy.Instance) (gpuproxy.Micros, error) {
	cost, err := s.store.CostToDate(ctx, inst.AccountID, inst.ID)
	if err != nil {
		return cost, err
	}
	m, err := s.store.Meter(ctx, inst.ID)
	switch {
	case gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND:
		return cost, nil // not time-billed, or never ran
	case err != nil:
		return cost, err
	}
	if !m.Stop.IsZero() {
		cost += max(billing.Cumulative(m, m.Stop)-m.Charged, 0)
	}
	return cost, nil
}
