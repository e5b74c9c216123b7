// Package fleet is the instance lifecycle over every provider: offer search
// (concurrent fan-out, merged, cached briefly), creation behind guard-rail
// admission (the admission and our row in one transaction before any
// provider call), polling to running, confirmed destroys, metering and
// prepaid charges, and the reconciler that matches provider instances to our
// rows by tag. REST and MCP both call this one service.
package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/guardrails"
	"github.com/aiserve/gpuproxy/providers"
)

// Service is the fleet.
type Service struct {
	providers []providers.Provider
	byName    map[string]providers.Provider
	store     Store
	guard     *guardrails.Service
	opts      Options
	cache     *offerCache
	destroys  *destroyTimes
}

// New returns a Service over the given providers.
func New(store Store, guard *guardrails.Service, provs []providers.Provider, o Options) *Service {
	o = o.withDefaults()
	if o.Now == nil {
		o.Now = guard.Now
	}
	if o.OrphanPolicy == OrphanAdopt {
		o.Logger.Warn(`orphan_policy "adopt" is deprecated: it is "leave" (orphans are left running, unbilled, for an operator)`)
		o.OrphanPolicy = OrphanLeave
	}
	s := &Service{store: store, guard: guard, opts: o, byName: map[string]providers.Provider{},
		cache: &offerCache{ttl: o.OfferCacheTTL, m: map[string]cachedOffers{}}, destroys: newDestroyTimes()}
	for _, p := range provs {
		s.providers = append(s.providers, p)
		s.byName[p.Name()] = p
	}
	return s
}

// ProviderNames lists the configured providers.
func (s *Service) ProviderNames() []string {
	out := make([]string, len(s.providers))
	for i, p := range s.providers {
		out[i] = p.Name()
	}
	return out
}

// CreateRequest asks for a new instance.
type CreateRequest struct {
	Provider string
	OfferID  string
	Image    string
	Label    string
	// Hours is the prepaid duration, 1 to MaxHours: required by a prepaid
	// provider (io.net), which charges it up front; ignored by hourly ones.
	Hours int
	Env   map[string]string
	Ports []int
	// ImageLogin is a private image's registry login, "-u USER -p TOKEN
	// [REGISTRY]" (vast.ai's image_login; io.net takes the user and
	// token). A credential: passed to the provider, never stored, logged
	// or shown.
	ImageLogin string
	// Onstart is a shell script the instance runs when it starts
	// (vast.ai; io.net runs none and refuses it); Args the image's
	// entrypoint arguments. Both are passed to the provider as given.
	Onstart        string
	Args           []string
	IdempotencyKey string
	// KeyID is the API key creating the instance: the cost must fit its
	// own windows too, and the instance's spend counts against them.
	KeyID string
	// ConfirmToken is the token of an earlier confirmation_required answer
	// for the same create (REST, plain MCP, or an MCP elicitation's request
	// state once the person accepted), when the key asks for confirmation
	// above a cost.
	ConfirmToken string
	// Spec, when set instead of Provider and OfferID, rents the best live
	// offer matching it, failing over (see Spec).
	Spec *Spec
	// Lifetime asks for lifetime rules (see LifetimeRequest); unset
	// fields take the account's policy and the service's defaults.
	Lifetime LifetimeRequest
}

// MaxHours is the longest prepaid duration a create may ask for (30 days).
const MaxHours = 24 * 30

// validate checks the request; prepaid tells whether its provider charges
// a duration up front, which then must be given.
func (r *CreateRequest) validate(known []string, prepaid bool) error {
	if r.Spec != nil {
		if r.Provider != "" || r.OfferID != "" {
			return gpuproxy.Invalid("spec", "give either spec or provider and offer_id, not both")
		}
		if r.Hours != 0 {
			return gpuproxy.Invalid("hours", "goes inside spec (spec.hours) when renting by spec")
		}
		if err := r.Spec.validate(known); err != nil {
			return err
		}
		return r.validateRest()
	}
	switch {
	case !contains(known, r.Provider):
		return gpuproxy.Invalid("provider", "must be one of %s", strings.Join(known, ", "))
	case r.OfferID == "" || len(r.OfferID) > 200:
		return gpuproxy.Invalid("offer_id", "is required (an offer id from the offer search), or give a spec to rent by spec")
	case prepaid && r.Hours == 0:
		return gpuproxy.Invalid("hours", "is required for %s, which charges the whole duration up front: "+
			"the number of hours to pay for, 1 to %d", r.Provider, MaxHours)
	case r.Hours < 0 || r.Hours > MaxHours:
		return gpuproxy.Invalid("hours", "must be between 1 and %d", MaxHours)
	}
	return r.validateRest()
}

// validateRest checks what both forms of a create share.
func (r *CreateRequest) validateRest() error {
	switch {
	case r.Image == "" || len(r.Image) > 500 || strings.ContainsAny(r.Image, " \n\t"):
		return gpuproxy.Invalid("image", "is required: a container image such as vllm/vllm-openai:latest")
	case len(r.Label) > 200:
		return gpuproxy.Invalid("label", "must be at most 200 characters")
	case len(r.Env) > 50:
		return gpuproxy.Invalid("env", "at most 50 variables")
	case len(r.Ports) > 10:
		return gpuproxy.Invalid("ports", "at most 10 ports")
	case len(r.IdempotencyKey) > 200:
		return gpuproxy.Invalid("idempotency_key", "must be at most 200 characters")
	}
	if err := r.validatePass(); err != nil {
		return err
	}
	for k, v := range r.Env {
		if k == "" || len(k) > 100 || strings.ContainsAny(k, "= \n") || len(v) > 4096 {
			return gpuproxy.Invalid("env", "variable %q: names are 1-100 characters without '=', values at most 4096", k)
		}
	}
	for _, p := range r.Ports {
		if p < 1 || p > 65535 {
			return gpuproxy.Invalid("ports", "port %d is out of range", p)
		}
	}
	return nil
}

// validatePass checks what the create passes through to the provider:
// each field by its rule (PassRules), the login's form, and onstart and
// args together within MaxStartScript. A refusal never quotes the login.
func (r *CreateRequest) validatePass() error {
	for _, err := range []error{PassRules.Rule("image_login").CheckString(r.ImageLogin),
		PassRules.Rule("onstart").CheckString(r.Onstart), PassRules.Rule("args").CheckList(r.Args)} {
		if err != nil {
			return err
		}
	}
	if r.ImageLogin != "" {
		if _, err := providers.ParseImageLogin(r.ImageLogin); err != nil {
			return gpuproxy.Invalid("image_login", "%v", err)
		}
	}
	if n := len(r.Onstart) + len(strings.Join(r.Args, " ")); n > MaxStartScript {
		return gpuproxy.Invalid("onstart", "onstart and args are %d characters together, over %d", n, MaxStartScript)
	}
	return nil
}

// callFingerprint is what tells one keyed create from another: the
// request's Fingerprint and, when given, its start script and arguments
// (the login is left out: a rotated token is the same create).
func (r *CreateRequest) callFingerprint() string {
	fp := r.Fingerprint()
	if r.Onstart == "" && len(r.Args) == 0 {
		return fp // as before pass-through: calls recorded then still match
	}
	b, _ := json.Marshal(struct {
		Fingerprint, Onstart string
		Args                 []string
	}{fp, r.Onstart, r.Args})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:16])
}

// passTo is the provider create's pass-through fields from r.
func (r *CreateRequest) passTo(p *providers.CreateRequest) {
	p.ImageLogin, p.Onstart, p.Args = r.ImageLogin, r.Onstart, r.Args
}

// Progress receives human-readable progress while an instance starts.
type Progress func(message string, done, total float64)

// NewInstanceID returns a fresh instance id; it doubles as the provider tag.
func NewInstanceID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "gpi_" + hex.EncodeToString(b)
}

// IsOurTag reports whether a provider label carries one of our ids.
func IsOurTag(tag string) bool { return strings.HasPrefix(tag, "gpi_") && len(tag) == 24 }

// markStarting records the provider id; a prepaid instance is charged its
// quoted total now, settling its hold.
func (s *Service) markStarting(ctx context.Context, inst gpuproxy.Instance, providerID string) (gpuproxy.Instance, error) {
	var charge *billing.Entry
	if inst.Billing == string(providers.BillingPrepaid) {
		charge = &billing.Entry{AccountID: inst.AccountID, Type: billing.Charge, Amount: inst.PrepaidTotal,
			At: s.opts.Now(), Provider: inst.Provider, InstanceID: inst.ID, Basis: billing.Prepaid,
			IdempotencyKey: "prepaid:" + inst.ID,
			Description:    prepaidDescription(inst)}
	}
	out, err := s.store.MarkStarting(ctx, inst.ID, providerID, charge, s.opts.Now())
	if err == nil {
		s.logCreated(out)
	}
	return out, err
}

// prepaidDescription is a prepaid charge's ledger description: "io.net
// prepaid 2h of 1× NVIDIA A100-SXM4-80GB" ("… of 1 GPU" when the provider
// did not name it).
func prepaidDescription(inst gpuproxy.Instance) string {
	what := fmt.Sprintf("%d GPUs", inst.NumGPUs)
	switch {
	case inst.GPUName != "":
		what = fmt.Sprintf("%d× %s", max(inst.NumGPUs, 1), inst.GPUName)
	case inst.NumGPUs <= 1:
		what = "1 GPU"
	}
	return fmt.Sprintf("%s prepaid %dh of %s", inst.Provider, inst.Hours, what)
}

// WaitRunning polls an instance until it is running, failed or ctx ends,
// reporting progress.
func (s *Service) WaitRunning(ctx context.Context, accountID int64, id string, progress Progress) (gpuproxy.Instance, error) {
	t := time.NewTicker(s.opts.PollInterval / 4)
	defer t.Stop()
	start := s.opts.Now()
	for {
		inst, err := s.store.Instance(ctx, accountID, id)
		if err != nil {
			return inst, err
		}
		if inst.Status == gpuproxy.Starting {
			inst, _ = s.advance(ctx, inst)
		}
		switch inst.Status {
		case gpuproxy.Running, gpuproxy.Failed, gpuproxy.Terminated, gpuproxy.Terminating:
			return inst, nil
		}
		if progress != nil {
			el := s.opts.Now().Sub(start)
			progress(fmt.Sprintf("%s is %s (%.0fs)", inst.ID, inst.Status, el.Seconds()),
				min(el.Seconds(), 0.95*s.opts.StartTimeout.Seconds()), s.opts.StartTimeout.Seconds())
		}
		select {
		case <-ctx.Done():
			return inst, nil
		case <-t.C:
		}
	}
}

// look reads the poller's instance at its provider, at the service's
// clock's now: in l, the poll's complete listing of the provider, when
// given and the instance is in it, else with a Get (an instance missing
// from a listing was created since, or is gone, which the Get tells).
// done reports that the answer settles the row's fate for the caller,
// which returns out and err: no provider or provider id yet (nothing to
// read), a failed read, the instance gone at the provider, or our
// provider id now naming someone else's instance (ours is gone).
func (s *Service) look(ctx context.Context, inst gpuproxy.Instance, l *listing) (pi providers.Instance, now time.Time,
	out gpuproxy.Instance, done bool, err error) {
	p, ok := s.byName[inst.Provider]
	if !ok || inst.ProviderInstanceID == "" {
		return pi, now, inst, true, nil
	}
	listed := false
	if l != nil {
		pi, listed = l.byID[inst.ProviderInstanceID]
	}
	if !listed {
		pi, err = p.Get(ctx, inst.ProviderInstanceID)
	}
	now = s.opts.Now()
	switch {
	case providers.KindOf(err) == providers.KindGone:
		out, err = s.markTerminated(ctx, inst.ID, now, nil, "gone at the provider")
		return pi, now, out, true, err
	case err != nil:
		return pi, now, inst, true, err
	case otherTag(inst, pi):
		s.tagMismatch(p.Name(), inst, pi, "poll")
		out, err = s.markTerminated(ctx, inst.ID, now, nil, "provider id reused by another instance")
		return pi, now, out, true, err
	}
	return pi, now, inst, false, nil
}

// advance checks one starting instance at its provider and moves it on.
func (s *Service) advance(ctx context.Context, inst gpuproxy.Instance) (gpuproxy.Instance, error) {
	return s.advanceIn(ctx, inst, nil)
}

// advanceIn is advance reading the instance in l, the poll's listing of
// its provider, when given (see look).
func (s *Service) advanceIn(ctx context.Context, inst gpuproxy.Instance, l *listing) (gpuproxy.Instance, error) {
	pi, now, out, done, err := s.look(ctx, inst, l)
	if done {
		return out, err
	}
	switch {
	case pi.Status == providers.StatusRunning && pi.Endpoint != "":
		// GPU time bills from when the instance runs, not from when it was
		// rented: vast.ai bills only a loading instance's disk, and its
		// start_date is the rental's start, before the image pull and the
		// container's start. No provider says when it reached running, so
		// the meter starts at the poll that first sees it, at most one
		// PollInterval late; the reconciler's truth-up squares the rest
		// with the provider's bill.
		started := now
		var meter *billing.Meter
		if inst.Billing == string(providers.BillingHourly) {
			meter = &billing.Meter{ID: inst.ID, AccountID: inst.AccountID, Provider: inst.Provider,
				InstanceID: inst.ID, PricePerHour: inst.PricePerHour, Start: started}
		}
		out, err := s.store.MarkRunning(ctx, inst.ID, pi.Endpoint, started, meter)
		if err == nil && out.Status == gpuproxy.Running {
			s.logRunning(out)
		}
		return out, err
	case pi.Status == providers.StatusFailed || pi.Status == providers.StatusTerminated ||
		now.Sub(inst.CreatedAt) > s.opts.StartTimeout:
		// Never leave a broken rental running: destroy it, then stop tracking.
		if err := s.byName[inst.Provider].Destroy(ctx, inst.ProviderInstanceID); err != nil {
			return inst, err
		}
		return s.store.MarkFailed(ctx, inst.ID, "the instance did not start (provider status "+string(pi.Status)+")", now)
	}
	return inst, nil
}

// Destroy terminates one of the account's instances, by our id or the
// provider's. It is idempotent; the row becomes terminated only once the
// provider confirms the instance is gone.
func (s *Service) Destroy(ctx context.Context, accountID int64, id string) (gpuproxy.Instance, error) {
	inst, err := s.find(ctx, accountID, id)
	if err != nil {
		return inst, err
	}
	if inst.Status == gpuproxy.Terminated || inst.Status == gpuproxy.Failed {
		return inst, nil
	}
	return s.destroy(context.WithoutCancel(ctx), inst)
}

// destroy claims inst's destroy and, only if this caller claimed it, asks
// the provider to destroy; either way it confirms and closes the row once
// the instance is gone. A terminating row was claimed by another caller
// (an API destroy, a lifetime rule, the kill switch, on this replica or
// another): its destroy is left to it, and only confirmed here, until the
// claim is older than DestroyRetry (the claimant died, or its provider
// call failed), when one caller takes it over. Without the claim, the
// poller and a lifetime rule both read the instance as running and both
// sent a DELETE.
func (s *Service) destroy(ctx context.Context, inst gpuproxy.Instance) (gpuproxy.Instance, error) {
	now := s.opts.Now()
	inst, claimed, err := s.store.ClaimDestroy(ctx, inst.ID, now, now.Add(-s.opts.DestroyRetry))
	if err != nil || inst.Status == gpuproxy.Terminated || inst.Status == gpuproxy.Failed {
		return inst, err
	}
	return s.finishDestroy(ctx, inst, claimed)
}

// finishDestroy confirms a terminating instance's destroy and closes the
// row once the provider says it is gone; claimed (the caller holds the
// destroy's claim, see destroy) lets it ask the provider to destroy.
func (s *Service) finishDestroy(ctx context.Context, inst gpuproxy.Instance, claimed bool) (gpuproxy.Instance, error) {
	p, ok := s.byName[inst.Provider]
	if !ok {
		return inst, gpuproxy.Errorf(gpuproxy.EPROVIDER, "provider %s is not configured", inst.Provider)
	}
	if inst.ProviderInstanceID == "" {
		// Never reached the provider (or an ambiguous create): the reconciler
		// destroys any instance carrying our tag; nothing to charge here.
		return s.markTerminated(ctx, inst.ID, s.opts.Now(), nil, "destroyed before reaching the provider")
	}
	// Look before destroying: the instance under our stored id must be
	// ours. One with another tag is not (a provider that reused the id),
	// and destroying it would destroy another row's instance.
	pi, err := p.Get(ctx, inst.ProviderInstanceID)
	switch {
	case err == nil && otherTag(inst, pi):
		s.tagMismatch(p.Name(), inst, pi, "destroy")
		return s.markTerminated(ctx, inst.ID, s.opts.Now(), nil, "provider id reused by another instance")
	case err != nil && providers.KindOf(err) != providers.KindGone:
		return inst, providers.AsAppError(err)
	case err == nil && claimed && pi.Status != providers.StatusTerminated && pi.Status != providers.StatusTerminating:
		// (Terminating: our earlier destroy is under way; the poller
		// waits for its confirmation rather than asking again.)
		if err := p.Destroy(ctx, inst.ProviderInstanceID); err != nil {
			return inst, providers.AsAppError(err)
		}
		pi, err = p.Get(ctx, inst.ProviderInstanceID)
	}
	gone := providers.KindOf(err) == providers.KindGone || (err == nil && pi.Status == providers.StatusTerminated)
	if !gone {
		// Destroy accepted but not yet confirmed: stay terminating; the
		// poller confirms it.
		return inst, nil
	}
	at := s.opts.Now()
	if !pi.StoppedAt.IsZero() && pi.StoppedAt.Before(at) && pi.StoppedAt.After(inst.CreatedAt) {
		at = pi.StoppedAt
	}
	out, err := s.markTerminated(ctx, inst.ID, at, s.refundFor(inst, p, at), "destroyed")
	if err == nil {
		// Destroy timing: from terminating (UpdatedAt) to the termination
		// time the final charge runs to; the kill switch's margin.
		s.destroys.observe(inst.Provider, at.Sub(inst.UpdatedAt))
	}
	return out, err
}

// refundFor is the refund a prepaid provider gives for destroying early.
func (s *Service) refundFor(inst gpuproxy.Instance, p providers.Provider, at time.Time) *billing.Entry {
	r, ok := p.(providers.Refunder)
	if !ok || inst.Billing != string(providers.BillingPrepaid) || inst.PrepaidTotal == 0 {
		return nil
	}
	started := inst.StartedAt
	if started.IsZero() {
		started = inst.CreatedAt
	}
	amt := r.Refund(inst.PrepaidTotal, inst.Hours, started, at)
	if amt <= 0 {
		return nil
	}
	return &billing.Entry{AccountID: inst.AccountID, Type: billing.Refund, Amount: amt, At: at,
		Provider: inst.Provider, InstanceID: inst.ID, Basis: billing.Prepaid, IdempotencyKey: "refund:" + inst.ID,
		Description: fmt.Sprintf("%s unused prepaid time refunded on destroy", inst.Provider)}
}

// find looks an instance up by our id or the provider's id.
func (s *Service) find(ctx context.Context, accountID int64, id string) (gpuproxy.Instance, error) {
	if id == "" || len(id) > 200 {
		return gpuproxy.Instance{}, gpuproxy.Invalid("instance_id", "is required")
	}
	inst, err := s.store.Instance(ctx, accountID, id)
	if gpuproxy.ErrorCode(err) != gpuproxy.ENOTFOUND {
		return inst, err
	}
	for _, p := range s.providers {
		if inst, err := s.store.InstanceByProviderID(ctx, accountID, p.Name(), id); err == nil {
			return inst, nil
		}
	}
	return gpuproxy.Instance{}, gpuproxy.Errorf(gpuproxy.ENOTFOUND, "instance %q not found", id)
}

// View is an instance with its cost to date and, while it runs, when a
// lifetime rule acts on it next.
type View struct {
	gpuproxy.Instance
	CostToDate gpuproxy.Micros
	Schedule   Schedule
}

// Get returns one of the account's instances.
func (s *Service) Get(ctx context.Context, accountID int64, id string) (View, error) {
	inst, err := s.find(ctx, accountID, id)
	if err != nil {
		return View{}, err
	}
	c, err := s.store.CostToDate(ctx, accountID, inst.ID)
	if err != nil {
		return View{}, err
	}
	now := s.opts.Now()
	owed, err := s.costNow(ctx, inst, c, now)
	return View{Instance: inst, CostToDate: c, Schedule: s.schedule(inst, owed, now)}, err
}

// List returns the account's instances, optionally in one status. Without
// a status it lists what was rented (or may have been: a pending row): a
// create that failed before any provider rented it — each failed attempt
// of a rent by spec leaves one — is an attempt, shown on the instance its
// call rented (Attempts), not an instance; status "failed" lists them.
func (s *Service) List(ctx context.Context, accountID int64, status string) ([]View, error) {
	if status != "" && !validStatus(gpuproxy.InstanceStatus(status)) {
		return nil, gpuproxy.Invalid("status", "must be pending, starting, running, preempted, stopped, terminating, terminated or failed")
	}
	insts, err := s.store.Instances(ctx, accountID, gpuproxy.InstanceStatus(status))
	if err != nil {
		return nil, err
	}
	costs, err := s.store.CostsToDate(ctx, accountID)
	if err != nil {
		return nil, err
	}
	out := make([]View, 0, len(insts))
	now := s.opts.Now()
	for _, in := range insts {
		if status == "" && neverRented(in) {
			continue
		}
		out = append(out, View{Instance: in, CostToDate: costs[in.ID], Schedule: s.schedule(in, costs[in.ID], now)})
	}
	return out, nil
}

// neverRented tells a row whose create failed before any provider rented
// it: a failed attempt, not an instance.
func neverRented(in gpuproxy.Instance) bool {
	return in.Status == gpuproxy.Failed && in.ProviderInstanceID == ""
}

// RunningEndpoint returns the endpoint of one of the account's running
// instances (for the proxy).
func (s *Service) RunningEndpoint(ctx context.Context, accountID int64, id string) (string, error) {
	inst, err := s.store.Instance(ctx, accountID, id)
	if err != nil {
		return "", err
	}
	if inst.Status != gpuproxy.Running || inst.Endpoint == "" {
		return "", gpuproxy.Errorf(gpuproxy.ECONFLICT, "instance %s is %s, not running", id, inst.Status)
	}
	return inst.Endpoint, nil
}

// RunningEndpoints lists the endpoints of the account's running instances.
func (s *Service) RunningEndpoints(ctx context.Context, accountID int64) (map[string]string, error) {
	insts, err := s.store.Instances(ctx, accountID, gpuproxy.Running)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, in := range insts {
		if in.Endpoint != "" {
			out[in.ID] = in.Endpoint
		}
	}
	return out, nil
}

func validStatus(s gpuproxy.InstanceStatus) bool {
	switch s {
	case gpuproxy.Pending, gpuproxy.Starting, gpuproxy.Running, gpuproxy.Preempted, gpuproxy.Stopped, gpuproxy.Terminating,
		gpuproxy.Terminated, gpuproxy.Failed:
		return true
	}
	return false
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
func itoa(i int) string     { return strconv.Itoa(i) }
