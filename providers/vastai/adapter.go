package vastai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy/providers"
)

// DefaultBaseURL is vast.ai's API host.
const DefaultBaseURL = "https://console.vast.ai"

// The defaults of Options not shared with providers.ClientOptions (whose
// Default* constants give Timeout, Retries, RetryWait and the breaker's).
const (
	// DefaultDiskGB is the disk size of a create that sets none: the CLI's
	// default.
	DefaultDiskGB = 10
	// MinDiskGB is vast.ai's minimum disk size; smaller requests are raised
	// to it.
	MinDiskGB = 8
	// DefaultRateLimitWait is how long List waits before asking again for a
	// page that stayed rate limited.
	DefaultRateLimitWait = time.Second
)

const (
	defaultSearchLimit = 100 // offers per search when the filter sets none
	maxSearchLimit     = 1000
	maxLabelLen        = 256  // on create
	maxStartScript     = 4096 // args + onstart together, on create
	listPageSize       = 25   // v1 list maximum
	maxListPages       = 10000
	rateLimitedPageTry = 3 // extra attempts for a rate-limited list page
)

// Options configure an Adapter. Zero values take the documented defaults.
type Options struct {
	// BaseURL is the API host. Default DefaultBaseURL.
	BaseURL string
	// APIKey is sent as "Authorization: Bearer <key>", never in a URL, and
	// scrubbed from every error message.
	APIKey string
	// Timeout bounds one HTTP attempt. Default providers.DefaultTimeout.
	Timeout time.Duration
	// Retries is how many times a safe call (search, get, list, destroy) is
	// retried on 429/502/503/504 and transport errors. Default
	// providers.DefaultRetries; negative disables retries. Create is never
	// retried.
	Retries int
	// RetryWait is the first backoff, growing ×1.5 per retry. Default
	// providers.DefaultRetryWait (the official CLI's policy).
	RetryWait time.Duration
	// BreakerFailures consecutive transport failures, timeouts or 5xx replies
	// open the circuit breaker. Default providers.DefaultBreakerFailures.
	BreakerFailures uint32
	// BreakerOpenFor is how long the breaker stays open before a trial
	// call. Default providers.DefaultBreakerOpenFor.
	BreakerOpenFor time.Duration
	// DiskGB is the disk size in GB for creates that set none, and the
	// allocated_storage priced into searched offers. Default DefaultDiskGB;
	// at least MinDiskGB.
	DiskGB int
	// RateLimitWait is how long List waits before asking again for a page
	// that stayed rate limited after the client's retries (vast.ai enforces
	// a minimum interval of about 1s between list calls). Default
	// DefaultRateLimitWait.
	RateLimitWait time.Duration
	// OnBreakerChange, when set, is called on breaker state changes with
	// the provider name and the old and new states.
	OnBreakerChange func(provider, from, to string)
}

// Adapter is the vast.ai implementation of providers.Provider. It is safe
// for concurrent use.
type Adapter struct {
	opts   Options
	client *providers.Client
}

var (
	_ providers.Provider      = (*Adapter)(nil)
	_ providers.Bidder        = (*Adapter)(nil)
	_ providers.CreateChecker = (*Adapter)(nil)
	_ providers.FullLister    = (*Adapter)(nil)
)

// withDefaults returns o with its zero fields (and a DiskGB below
// MinDiskGB) set to their defaults; the client's fields are
// providers.ClientOptions's.
func (o Options) withDefaults() Options {
	if o.BaseURL == "" {
		o.BaseURL = DefaultBaseURL
	}
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	if o.DiskGB <= 0 {
		o.DiskGB = DefaultDiskGB
	}
	o.DiskGB = max(o.DiskGB, MinDiskGB)
	if o.RateLimitWait <= 0 {
		o.RateLimitWait = DefaultRateLimitWait
	}
	return o
}

// clientOptions are the providers.ClientOptions of o's client.
func (o Options) clientOptions() providers.ClientOptions {
	return providers.ClientOptions{
		Provider: providers.VastAI,
		BaseURL:  o.BaseURL,
		Headers: map[string]string{
			"Authorization": "Bearer " + o.APIKey,
			"Content-Type":  "application/json",
			"Accept":        "application/json",
		},
		Timeout:         o.Timeout,
		Retries:         o.Retries,
		RetryWait:       o.RetryWait,
		BreakerFailures: o.BreakerFailures,
		BreakerOpenFor:  o.BreakerOpenFor,
		OnStateChange:   o.OnBreakerChange,
	}
}

// Validate says which field of o is wrong ("vastai.Options.DiskGB: must be at
// least 8, got 5"); zero values are valid (they take the defaults). New
// does not call it: the composition root does, before building anything.
func (o Options) Validate() error {
	if err := o.clientOptions().ValidateAdapter("vastai"); err != nil {
		return err
	}
	if strings.ContainsFunc(o.APIKey, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		// The key itself is never printed.
		return errors.New("vastai.Options.APIKey: must not contain spaces or control characters (a trailing newline?)")
	}
	if o.DiskGB < 0 || (o.DiskGB > 0 && o.DiskGB < MinDiskGB) {
		return fmt.Errorf("vastai.Options.DiskGB: must be at least %d (vast.ai's minimum), got %d", MinDiskGB, o.DiskGB)
	}
	if o.RateLimitWait < 0 {
		return fmt.Errorf("vastai.Options.RateLimitWait: must not be negative, got %s", o.RateLimitWait)
	}
	return nil
}

// New returns an Adapter with defaults filled in (check o first with
// Validate).
func New(o Options) *Adapter {
	o = o.withDefaults()
	c := providers.NewClient(o.clientOptions())
	return &Adapter{opts: o, client: c}
}

// Name returns providers.VastAI.
func (a *Adapter) Name() string { return providers.VastAI }

// Billing returns providers.BillingHourly: vast.ai meters by the second
// while an instance exists.
func (a *Adapter) Billing() providers.Billing { return providers.BillingHourly }

// BreakerState reports the circuit breaker: "closed", "half-open", "open".
func (a *Adapter) BreakerState() string { return a.client.BreakerState() }

// do performs a safe (retryable) call and classifies the reply: it returns
// the body of a successful reply, or a classified error.
func (a *Adapter) do(ctx context.Context, op string, call providers.Call) (*providers.Response, reply, error) {
	call.Safe = true
	resp, err := a.client.Do(ctx, call)
	if err != nil {
		return nil, reply{}, a.wrapTransport(op, err)
	}
	r, isJSON := parseReply(resp.Body)
	if resp.Status < 200 || resp.Status > 299 || (isJSON && r.failed()) {
		return resp, r, a.apiError(classify(resp.Status, r), op, resp, r)
	}
	return resp, r, nil
}

// decode unmarshals a successful reply body; a body we cannot read is the
// provider's fault.
func (a *Adapter) decode(op string, resp *providers.Response, v any) error {
	if err := json.Unmarshal(resp.Body, v); err != nil {
		return a.errorf(providers.KindUnavailable, "%s: unreadable reply (HTTP %d): %v", op, resp.Status, err)
	}
	return nil
}

// searchQuery is the flat filter object with the official CLI's defaults:
// type "on-demand", or "bid" for interruptible offers.
func (a *Adapter) searchQuery(limit int, bid bool) map[string]any {
	typ := "on-demand"
	if bid {
		typ = "bid"
	}
	return map[string]any{
		"verified":          map[string]any{"eq": true},
		"external":          map[string]any{"eq": false},
		"rentable":          map[string]any{"eq": true},
		"rented":            map[string]any{"eq": false},
		"type":              typ,
		"allocated_storage": a.opts.DiskGB,
		"order":             [][]string{{"dph_total", "asc"}},
		"limit":             limit,
	}
}

// parseID checks that a vast.ai id is a positive decimal integer.
func (a *Adapter) parseID(what, s string) (int64, error) {
	id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || id <= 0 {
		return 0, a.errorf(providers.KindInvalid, "%s id %q is not a vast.ai id", what, s)
	}
	return id, nil
}

// createBody builds the PUT /asks/{id}/ body. Ports become "-p P:P" env
// keys; runtype "args" runs the image's own entrypoint (an inference server)
// instead of vast.ai's ssh/jupyter wrapper. cancel_unavail is always true:
// a machine that cannot run the instance now must fail the create (410
// no_such_ask, so the caller moves on to another offer) rather than leave a
// stopped instance that bills storage and never serves. vast.ai defaults
// to that for on-demand creates, but the official CLI sends false unless
// told, so the default is not relied upon.
func (a *Adapter) createBody(req providers.CreateRequest) (map[string]any, error) {
	if strings.TrimSpace(req.Image) == "" {
		return nil, a.fieldErr("image", "image is required")
	}
	if len(req.Tag) > maxLabelLen {
		return nil, a.errorf(providers.KindInvalid, "tag is longer than %d characters", maxLabelLen)
	}
	env := make(map[string]string, len(req.Env)+len(req.Ports))
	for k, v := range req.Env {
		// Keys starting with "-" are docker flags (-p, -v, -h) on vast.ai;
		// only ports are ours to set.
		if k == "" || strings.HasPrefix(k, "-") {
			return nil, a.fieldErr("env", "env name %q is not allowed", k)
		}
		env[k] = v
	}
	for _, p := range req.Ports {
		if p <= 0 || p > 65535 {
			return nil, a.fieldErr("ports", "port %d is out of range", p)
		}
		env[fmt.Sprintf("-p %d:%d", p, p)] = "1"
	}
	disk := req.DiskGB
	if disk <= 0 {
		disk = a.opts.DiskGB
	}
	body := map[string]any{
		"client_id":      "me",
		"image":          req.Image,
		"disk":           max(disk, MinDiskGB),
		"label":          req.Tag,
		"env":            env,
		"runtype":        "args",
		"cancel_unavail": true,
	}
	switch {
	case req.Bid < 0:
		return nil, a.errorf(providers.KindInvalid, "bid $%s/h is negative", req.Bid)
	case req.Bid > 0 && req.Bid > req.MaxBid:
		// The money is ours: never bid above what the caller accepts.
		return nil, a.errorf(providers.KindInvalid, "bid $%s/h is over the caller's cap of $%s/h", req.Bid, req.MaxBid)
	case req.Bid > 0:
		// A price makes the instance interruptible, billed at the bid.
		body["price"] = req.Bid.USD()
	}
	if req.ImageLogin != "" {
		if _, err := providers.ParseImageLogin(req.ImageLogin); err != nil {
			return nil, a.fieldErr("image_login", "%v", err)
		}
		body["image_login"] = req.ImageLogin
	}
	if req.Onstart != "" {
		body["onstart"] = req.Onstart
	}
	if len(req.Args) > 0 {
		body["args"] = req.Args
	}
	if n := len(req.Onstart) + len(strings.Join(req.Args, " ")); n > maxStartScript {
		return nil, a.fieldErr("onstart", "onstart and args are %d characters together, over vast.ai's %d",
			n, maxStartScript)
	}
	return body, nil
}

// CheckCreate checks what a create would send besides the offer (the
// body createBody builds): every field vast.ai takes is passed through,
// so only the form and size of each is checked.
func (a *Adapter) CheckCreate(req providers.CreateRequest) error {
	_, err := a.createBody(req)
	return err
}

// fieldErr is a KindInvalid refusal of the caller's field, before any
// call.
func (a *Adapter) fieldErr(field, format string, args ...any) *providers.Error {
	e := a.errorf(providers.KindInvalid, format, args...)
	e.Field = field
	return e
}

// Create rents an offer with PUT /api/v0/asks/{id}/, exactly once. A reply
// that still names new_contract after an error, a 5xx, a timeout or a
// dropped connection is KindAmbiguous (with ProviderID when known); a
// vanished offer is KindGone.
func (a *Adapter) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	in, err := a.create(ctx, req)
	var pe *providers.Error
	if req.ImageLogin != "" && errors.As(err, &pe) {
		// A reply that echoed the request must not carry the login out.
		pe.Message = scrubLogin(pe.Message, req.ImageLogin)
	}
	return in, err
}

// scrubLogin removes a registry login, and its secret alone, from s.
func scrubLogin(s, login string) string {
	s = strings.ReplaceAll(s, login, "[image_login redacted]")
	if l, err := providers.ParseImageLogin(login); err == nil && len(l.Secret) >= 4 {
		s = strings.ReplaceAll(s, l.Secret, "[redacted]")
	}
	return s
}

func (a *Adapter) create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	id, err := a.parseID("offer", req.OfferID)
	if err != nil {
		return providers.Instance{}, err
	}
	body, err := a.createBody(req)
	if err != nil {
		return providers.Instance{}, err
	}
	op := "creating instance from offer " + req.OfferID
	resp, err := a.client.Do(ctx, providers.Call{
		Method: http.MethodPut, Path: fmt.Sprintf("/api/v0/asks/%d/", id), Body: body, Safe: false,
	})
	if err != nil {
		return providers.Instance{}, a.wrapTransport(op, err)
	}
	r, isJSON := parseReply(resp.Body)
	ok2xx := resp.Status >= 200 && resp.Status < 300
	if ok2xx && isJSON && !r.failed() && r.NewContract != "" {
		return providers.Instance{
			ProviderID: string(r.NewContract),
			Tag:        req.Tag,
			Status:     providers.StatusStarting,
		}, nil
	}
	if r.NewContract != "" {
		// The rent failed yet an instance exists (e.g. created stopped):
		// the caller must adopt or destroy it.
		e := a.apiError(providers.KindAmbiguous, op, resp, r)
		e.ProviderID = string(r.NewContract)
		return providers.Instance{}, e
	}
	return providers.Instance{}, a.apiError(classifyCreate(resp.Status, r, isJSON), op, resp, r)
}

// Get returns one instance; KindGone when vast.ai answers {"instances":null}
// or 404.
func (a *Adapter) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	id, err := a.parseID("instance", providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	op := "getting instance " + providerID
	resp, _, err := a.do(ctx, op, providers.Call{
		Method: http.MethodGet, Path: fmt.Sprintf("/api/v0/instances/%d/", id),
		Query: url.Values{"owner": {"me"}},
	})
	if err != nil {
		return providers.Instance{}, goneIfNotFound(err)
	}
	var body struct {
		Instances json.RawMessage `json:"instances"`
	}
	if err := a.decode(op, resp, &body); err != nil {
		return providers.Instance{}, err
	}
	raw := strings.TrimSpace(string(body.Instances))
	if strings.HasPrefix(raw, "[") { // tolerate a one-element list
		var list []json.RawMessage
		if json.Unmarshal(body.Instances, &list) == nil && len(list) > 0 {
			raw = string(list[0])
		} else {
			raw = "null"
		}
	}
	if raw == "" || raw == "null" || raw == "{}" {
		return providers.Instance{}, a.errorf(providers.KindGone, "instance %s no longer exists", providerID)
	}
	var w wireInstance
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		return providers.Instance{}, a.errorf(providers.KindUnavailable, "%s: unreadable instance: %v", op, err)
	}
	in := w.instance()
	if in.ProviderID == "" {
		in.ProviderID = strconv.FormatInt(id, 10)
	}
	return in, nil
}

// goneIfNotFound turns a not-found instance into KindGone.
func goneIfNotFound(err error) error {
	var e *providers.Error
	if errors.As(err, &e) && e.Kind == providers.KindNotFound {
		e.Kind = providers.KindGone
	}
	return err
}

// listPage is one page of GET /api/v1/instances/.
type listPage struct {
	Instances []json.RawMessage `json:"instances"`
	NextToken idValue           `json:"next_token"`
}

// List returns every instance of the account, following next_token through
// all pages of 25. Only a complete listing is returned: any page failing
// fails the call, since a partial list cannot prove an instance absent.
func (a *Adapter) List(ctx context.Context) ([]providers.Instance, error) {
	var out []providers.Instance
	seen := map[string]bool{}
	tokens := map[string]bool{}
	token := ""
	for page := 0; ; page++ {
		if page >= maxListPages {
			return nil, a.errorf(providers.KindUnavailable, "listing instances: more than %d pages", maxListPages)
		}
		p, err := a.listPage(ctx, token)
		if err != nil {
			return nil, err
		}
		for _, raw := range p.Instances {
			var w wireInstance
			if err := json.Unmarshal(raw, &w); err != nil {
				return nil, a.errorf(providers.KindUnavailable, "listing instances: unreadable instance: %v", err)
			}
			in := w.instance()
			if in.ProviderID == "" || seen[in.ProviderID] {
				continue
			}
			seen[in.ProviderID] = true
			out = append(out, in)
		}
		token = string(p.NextToken)
		if token == "" {
			return out, nil
		}
		if tokens[token] {
			return nil, a.errorf(providers.KindUnavailable, "listing instances: next_token repeats")
		}
		tokens[token] = true
	}
}

// ListsInFull marks List's instances as complete as Get's: the v1 list
// and the one-instance read answer the same instance object.
func (a *Adapter) ListsInFull() {}

// listPage fetches one page, waiting out a rate limit that outlasted the
// client's retries (the v1 list allows about one call per second).
func (a *Adapter) listPage(ctx context.Context, token string) (listPage, error) {
	q := url.Values{
		// Non-string values are JSON-encoded, as the official CLI does.
		"limit":    {strconv.Itoa(listPageSize)},
		"order_by": {`[{"col":"id","dir":"asc"}]`},
	}
	if token != "" {
		q.Set("after_token", token)
	}
	const op = "listing instances"
	for attempt := 0; ; attempt++ {
		resp, _, err := a.do(ctx, op, providers.Call{Method: http.MethodGet, Path: "/api/v1/instances/", Query: q})
		if err == nil {
			var p listPage
			return p, a.decode(op, resp, &p)
		}
		if providers.KindOf(err) != providers.KindRateLimited || attempt >= rateLimitedPageTry {
			return listPage{}, err
		}
		select {
		case <-ctx.Done():
			return listPage{}, a.wrapTransport(op, ctx.Err())
		case <-time.After(a.opts.RateLimitWait):
		}
	}
}

// Destroy removes an instance with DELETE /api/v0/instances/{id}/. An
// instance already gone (404, not_found, no_such_instance) counts as
// destroyed.
func (a *Adapter) Destroy(ctx context.Context, providerID string) error {
	id, err := a.parseID("instance", providerID)
	if err != nil {
		return err
	}
	_, _, err = a.do(ctx, "destroying instance "+providerID, providers.Call{
		Method: http.MethodDelete, Path: fmt.Sprintf("/api/v0/instances/%d/", id), Body: map[string]any{},
	})
	if providers.KindOf(err) == providers.KindNotFound {
		return nil
	}
	return err
}

// Stop stops an instance and keeps its disk (PUT /api/v0/instances/{id}/
// with {"state":"stopped"}, as the official client's `stop instance`):
// vast.ai then bills storage only. Stopping one already gone succeeds.
func (a *Adapter) Stop(ctx context.Context, providerID string) error {
	id, err := a.parseID("instance", providerID)
	if err != nil {
		return err
	}
	_, _, err = a.do(ctx, "stopping instance "+providerID, providers.Call{
		Method: http.MethodPut, Path: fmt.Sprintf("/api/v0/instances/%d/", id), Body: map[string]any{"state": "stopped"},
	})
	if providers.KindOf(err) == providers.KindNotFound || providers.KindOf(err) == providers.KindGone {
		return nil
	}
	return err
}
