package ionet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// DefaultBaseURL is io.net's IO Cloud API host.
const DefaultBaseURL = "https://api.io.solutions"

// The defaults of Options not shared with providers.ClientOptions (whose
// Default* constants give Timeout, Retries, RetryWait and the breaker's).
const (
	// DefaultHours is the prepaid duration of a quote or create that sets
	// none.
	DefaultHours = 1
	// MaxPageSize is io.net's largest deployment-list page, and the
	// default page size.
	MaxPageSize = 100
	// DefaultParallel bounds Search's concurrent availability look-ups.
	DefaultParallel = 4
)

// caas is the path prefix of the container API.
const caas = "/enterprise/v1/io-cloud/caas"

// Options configure an Adapter. Zero values take the documented defaults.
type Options struct {
	// BaseURL is the API host without path. Default DefaultBaseURL.
	BaseURL string
	// APIKey is sent as X-API-KEY; it never appears in URLs or errors.
	APIKey string
	// Timeout bounds one HTTP attempt. Default providers.DefaultTimeout.
	Timeout time.Duration
	// Retries is how often safe calls (reads, destroy) are retried on
	// 429/502/503/504 and transport errors. Default
	// providers.DefaultRetries; negative disables. Deploy is never retried.
	Retries int
	// RetryWait is the first backoff, growing ×1.5 per retry. Default
	// providers.DefaultRetryWait.
	RetryWait time.Duration
	// BreakerFailures is the number of consecutive transport failures,
	// timeouts or 5xx replies that open the circuit breaker. Default
	// providers.DefaultBreakerFailures.
	BreakerFailures uint32
	// BreakerOpenFor is how long the breaker stays open. Default
	// providers.DefaultBreakerOpenFor.
	BreakerOpenFor time.Duration
	// DefaultHours is the prepaid duration used when Quote or Create get
	// none (hours ≤ 0). Default DefaultHours.
	DefaultHours int
	// PageSize is the page size used to walk the deployment list, at most
	// MaxPageSize. Default MaxPageSize.
	PageSize int
	// Parallel bounds the concurrent availability look-ups of Search.
	// Default DefaultParallel.
	Parallel int
	// OnBreakerChange, when set, is called with the provider name and the
	// old and new breaker states ("closed", "half-open", "open").
	OnBreakerChange func(provider, from, to string)
}

// Adapter is the io.net provider. It is safe for concurrent use.
type Adapter struct {
	c        *providers.Client
	key      string
	hours    int
	pageSize int
	parallel int
	// names maps hardware ids to their display names ("NVIDIA
	// A100-SXM4-80GB"), learned from the hardware list: the price
	// endpoint and the deploy reply carry none.
	names sync.Map
}

var (
	_ providers.Provider      = (*Adapter)(nil)
	_ providers.CreateChecker = (*Adapter)(nil)
)

// withDefaults returns o with its zero fields (and a PageSize over
// MaxPageSize) set to their defaults; the client's fields are
// providers.ClientOptions's.
func (o Options) withDefaults() Options {
	if o.BaseURL == "" {
		o.BaseURL = DefaultBaseURL
	}
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	if o.DefaultHours <= 0 {
		o.DefaultHours = DefaultHours
	}
	if o.PageSize <= 0 || o.PageSize > MaxPageSize {
		o.PageSize = MaxPageSize
	}
	if o.Parallel <= 0 {
		o.Parallel = DefaultParallel
	}
	return o
}

// clientOptions are the providers.ClientOptions of o's client.
func (o Options) clientOptions() providers.ClientOptions {
	return providers.ClientOptions{
		Provider: providers.IONet,
		BaseURL:  o.BaseURL,
		Headers: map[string]string{
			"X-API-KEY":    o.APIKey,
			"Content-Type": "application/json",
			"Accept":       "application/json",
		},
		Timeout:         o.Timeout,
		Retries:         o.Retries,
		RetryWait:       o.RetryWait,
		BreakerFailures: o.BreakerFailures,
		BreakerOpenFor:  o.BreakerOpenFor,
		OnStateChange:   o.OnBreakerChange,
	}
}

// Validate says which field of o is wrong ("ionet.Options.PageSize: must be
// between 1 and 100, got 500"); zero values are valid (they take the
// defaults). New does not call it: the composition root does, before
// building anything.
func (o Options) Validate() error {
	if err := o.clientOptions().ValidateAdapter("ionet"); err != nil {
		return err
	}
	if strings.ContainsFunc(o.APIKey, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		// The key itself is never printed.
		return errors.New("ionet.Options.APIKey: must not contain spaces or control characters (a trailing newline?)")
	}
	if o.DefaultHours < 0 {
		return fmt.Errorf("ionet.Options.DefaultHours: must not be negative, got %d", o.DefaultHours)
	}
	if o.PageSize < 0 || o.PageSize > MaxPageSize {
		return fmt.Errorf("ionet.Options.PageSize: must be between 1 and %d, got %d", MaxPageSize, o.PageSize)
	}
	if o.Parallel < 0 {
		return fmt.Errorf("ionet.Options.Parallel: must not be negative, got %d", o.Parallel)
	}
	return nil
}

// New returns an Adapter with o's defaults filled in (check o first with
// Validate).
func New(o Options) *Adapter {
	o = o.withDefaults()
	c := providers.NewClient(o.clientOptions())
	return &Adapter{c: c, key: o.APIKey, hours: o.DefaultHours, pageSize: o.PageSize, parallel: o.Parallel}
}

// Name returns providers.IONet.
func (a *Adapter) Name() string { return providers.IONet }

// Billing returns providers.BillingPrepaid: io.net charges the whole
// duration up front.
func (a *Adapter) Billing() providers.Billing { return providers.BillingPrepaid }

// BreakerState reports the circuit breaker state.
func (a *Adapter) BreakerState() string { return a.c.BreakerState() }

// get performs a safe GET and decodes the {"data": ...} payload into out.
func (a *Adapter) get(ctx context.Context, o op, path string, q url.Values, out any) error {
	r, err := a.c.Do(ctx, providers.Call{Method: http.MethodGet, Path: path, Query: q, Safe: true})
	if err != nil {
		return a.wrapErr(o, err)
	}
	if r.Status/100 != 2 {
		return a.httpError(o, r)
	}
	env := envelope[any]{Data: out}
	if err := json.Unmarshal(r.Body, &env); err != nil {
		return a.decodeErr(o, err)
	}
	return nil
}

// Search lists io.net offers: every available (hardware, location, GPUs per
// container) triple matching f, cheapest first. PricePerHour is the
// hardware's per-GPU-hour price times the GPUs; hardware without a listed
// price is priced through the quote endpoint for one hour. VRAM comes from
// the hardware name (the API has no VRAM field).
func (a *Adapter) Search(ctx context.Context, f providers.SearchFilter) ([]providers.Offer, error) {
	var hw wireHardwareList
	if err := a.get(ctx, op{name: "listing hardware"}, caas+"/hardware/max-gpus-per-container", nil, &hw); err != nil {
		return nil, err
	}
	type job struct {
		hw   wireHardware
		gpus int
	}
	var jobs []job
	a.learnNames(hw.Hardware)
	for _, h := range hw.Hardware {
		if h.MaxGPUsPerContainer <= 0 || h.Available <= 0 {
			continue
		}
		if f.GPUName != "" && !strings.Contains(strings.ToLower(h.BrandName+" "+h.name()),
			strings.ToLower(f.GPUName)) {
			continue
		}
		if f.MinVRAMGB > 0 && vramGB(h.name()) < f.MinVRAMGB {
			continue
		}
		for _, n := range countsFor(h.MaxGPUsPerContainer, f.MinGPUs) {
			if h.Price.v > 0 && f.MaxPricePerHour > 0 && h.Price.v*gpuproxy.Micros(n) > f.MaxPricePerHour {
				continue
			}
			jobs = append(jobs, job{h, n})
		}
	}

	var (
		mu     sync.Mutex
		offers []providers.Offer
		first  error
		wg     sync.WaitGroup
		sem    = make(chan struct{}, a.parallel)
	)
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			got, err := a.offersFor(ctx, j.hw, j.gpus)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
				}
				return
			}
			offers = append(offers, got...)
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	out := offers[:0]
	for _, o := range offers {
		if f.MaxPricePerHour > 0 && o.PricePerHour > f.MaxPricePerHour {
			continue
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PricePerHour != out[j].PricePerHour {
			return out[i].PricePerHour < out[j].PricePerHour
		}
		return out[i].ID < out[j].ID
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// offersFor returns the offers of one hardware and container size: one per
// location with available replicas. Hardware that vanished meanwhile (404,
// 4xx) yields no offers rather than an error.
func (a *Adapter) offersFor(ctx context.Context, h wireHardware, gpus int) ([]providers.Offer, error) {
	q := url.Values{"hardware_id": {string(h.HardwareID)}, "hardware_qty": {strconv.Itoa(gpus)}}
	var locs []wireLocation
	if err := a.get(ctx, op{name: "checking availability"}, caas+"/available-replicas", q, &locs); err != nil {
		switch providers.KindOf(err) {
		case providers.KindNotFound, providers.KindGone, providers.KindInvalid:
			return nil, nil
		}
		return nil, err
	}
	var out []providers.Offer
	for _, l := range locs {
		if l.AvailableReplicas <= 0 {
			continue
		}
		id := offerID{Hardware: h.HardwareID, Location: l.ID, GPUs: gpus}
		var price gpuproxy.Micros
		if h.Price.v > 0 {
			price = h.Price.v * gpuproxy.Micros(gpus)
		} else {
			qt, err := a.quote(ctx, id, 1)
			if err != nil {
				if k := providers.KindOf(err); k == providers.KindGone || k == providers.KindNotFound {
					continue
				}
				return nil, err
			}
			price = qt.PricePerHour
		}
		out = append(out, providers.Offer{
			Provider:     providers.IONet,
			ID:           id.String(),
			GPUName:      h.displayName(),
			NumGPUs:      gpus,
			VRAMGB:       vramGB(h.name()),
			PricePerHour: price,
			Location:     l.label(),
			Billing:      providers.BillingPrepaid,
		})
	}
	return out, nil
}

// Quote prices an offer for hours (DefaultHours when ≤ 0) through io.net's
// price endpoint: Total is total_cost_usdc for one container of the offer's
// GPUs for the whole duration, PricePerHour is Total / hours. An offer whose
// location has no replica left is KindGone. GPUName is the hardware's name
// from the hardware list (the price reply has none), "" when the list
// cannot say.
func (a *Adapter) Quote(ctx context.Context, offer string, hours int) (providers.Quote, error) {
	id, err := parseOfferID(offer)
	if err != nil {
		return providers.Quote{}, badOfferID(err)
	}
	if hours <= 0 {
		hours = a.hours
	}
	q, err := a.quote(ctx, id, hours)
	if err == nil {
		q.GPUName = a.hardwareName(ctx, id.Hardware)
	}
	return q, err
}

// learnNames remembers the display names of listed hardware.
func (a *Adapter) learnNames(hw []wireHardware) {
	for _, h := range hw {
		a.names.Store(h.HardwareID, h.displayName())
	}
}

// hardwareName returns the display name of hardware id, reading the
// hardware list when it is not known yet. A failed read is not an error
// of the caller's: the name stays "" and the next call reads again.
func (a *Adapter) hardwareName(ctx context.Context, id hardwareID) string {
	if n, ok := a.names.Load(id); ok {
		return n.(string)
	}
	var hw wireHardwareList
	if err := a.get(ctx, op{name: "listing hardware"}, caas+"/hardware/max-gpus-per-container", nil, &hw); err != nil {
		return ""
	}
	a.learnNames(hw.Hardware)
	if n, ok := a.names.Load(id); ok {
		return n.(string)
	}
	return ""
}

func (a *Adapter) quote(ctx context.Context, id offerID, hours int) (providers.Quote, error) {
	o := op{name: "quoting " + id.String(), gone404: true}
	q := url.Values{
		"location_ids":       {fmt.Sprintf("[%d]", id.Location)},
		"hardware_id":        {string(id.Hardware)},
		"duration_hours":     {strconv.Itoa(hours)},
		"gpus_per_container": {strconv.Itoa(id.GPUs)},
		"replica_count":      {"1"},
	}
	var p wirePrice
	if err := a.get(ctx, o, caas+"/price", q, &p); err != nil {
		return providers.Quote{}, err
	}
	if !p.TotalCostUSDC.set {
		return providers.Quote{}, a.decodeErr(o, fmt.Errorf("no total_cost_usdc"))
	}
	if len(p.AvailableReplicaCount) > 0 && sumInts(p.AvailableReplicaCount) <= 0 {
		return providers.Quote{}, &providers.Error{Provider: providers.IONet, Kind: providers.KindGone,
			Status: http.StatusOK, Message: o.name + ": no replica available at that location any more"}
	}
	total := p.TotalCostUSDC.v
	return providers.Quote{
		OfferID:      id.String(),
		PricePerHour: (total + gpuproxy.Micros(hours)/2) / gpuproxy.Micros(hours),
		Hours:        hours,
		Total:        total,
		Billing:      providers.BillingPrepaid,
		NumGPUs:      id.GPUs,
	}, nil
}

func sumInts(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}
