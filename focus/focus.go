package focus

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
)

// Type is a column's FOCUS data type.
type Type string

// FOCUS data types of the exported columns.
const (
	String   Type = "String"
	Decimal  Type = "Decimal"
	DateTime Type = "DateTime"
	JSON     Type = "JSON"
)

// Column is one column of the dataset.
type Column struct {
	Name string
	Type Type
}

// Columns are the exported columns in order: the FOCUS 1.2 columns
// (alphabetical), then the custom x_ columns.
var Columns = []Column{
	{"BilledCost", Decimal}, {"BillingAccountId", String}, {"BillingAccountName", String},
	{"BillingCurrency", String}, {"BillingPeriodEnd", DateTime}, {"BillingPeriodStart", DateTime},
	{"ChargeCategory", String}, {"ChargeClass", String}, {"ChargeDescription", String},
	{"ChargeFrequency", String}, {"ChargePeriodEnd", DateTime}, {"ChargePeriodStart", DateTime},
	{"ConsumedQuantity", Decimal}, {"ConsumedUnit", String}, {"ContractedCost", Decimal},
	{"EffectiveCost", Decimal}, {"InvoiceIssuerName", String}, {"ListCost", Decimal},
	{"ListUnitPrice", Decimal}, {"PricingQuantity", Decimal}, {"PricingUnit", String},
	{"ProviderName", String}, {"PublisherName", String}, {"RegionId", String}, {"RegionName", String},
	{"ResourceId", String}, {"ResourceName", String}, {"ResourceType", String},
	{"ServiceCategory", String}, {"ServiceName", String}, {"SkuId", String},
	{"SubAccountId", String}, {"SubAccountName", String}, {"Tags", JSON},
	{"x_LedgerEntryId", String}, {"x_LedgerType", String}, {"x_LedgerBasis", String},
}

// Row is one row: a value per column of Columns, by column name. A column
// missing from the map is null.
type Row map[string]string

// TimeLayout is how FOCUS date/times are written: UTC to the second.
const TimeLayout = "2006-01-02T15:04:05Z"

// Defaults of Options.
const (
	// DefaultIssuer names who issues the invoice when Options sets none.
	DefaultIssuer = "AIServe GPU Proxy"
)

// Values the mapping writes.
const (
	ServiceCategory = "AI and Machine Learning"
	// ServiceName of rows for instances (their time, rentals, refunds,
	// truth-ups), of proxy request charges, and of everything else (top-ups,
	// manual adjustments).
	ServiceGPUInstances = "GPU Instances"
	ServiceRequests     = "Inference Requests"
	ServiceAccount      = "GPU Proxy Account"
	// ResourceTypeInstance is the ResourceType of an instance.
	ResourceTypeInstance = "GPU Instance"
	// SkuRequests is the SkuId of a proxy request charge with no GPU.
	SkuRequests = "Inference Request"
)

// Resource is what an export knows of the instance an entry names.
type Resource struct {
	Instance     gpuproxy.Instance
	Service      string // the service it is a replica of ("" for none)
	ServiceModel string
}

// Map turns one ledger entry into its row. r is the instance the entry
// names (nil when it names none, or the instance is unknown); issuer is
// the InvoiceIssuerName.
func Map(e billing.Entry, r *Resource, issuer string) Row {
	row := Row{
		"BillingAccountId":  strconv.FormatInt(e.AccountID, 10),
		"BillingCurrency":   "USD",
		"InvoiceIssuerName": issuer,
		"ServiceCategory":   ServiceCategory,
		"x_LedgerEntryId":   strconv.FormatInt(e.ID, 10),
		"x_LedgerType":      string(e.Type),
		"x_LedgerBasis":     string(e.Basis),
	}
	set := func(col, v string) {
		if v != "" {
			row[col] = v
		}
	}
	set("BillingAccountName", e.Account)
	set("ChargeDescription", e.Description)
	bs, be := billingPeriod(e.At)
	row["BillingPeriodStart"], row["BillingPeriodEnd"] = bs.Format(TimeLayout), be.Format(TimeLayout)
	billed := e.Signed()
	cost := usd(billed)
	row["BilledCost"], row["EffectiveCost"] = cost, cost
	row["ListCost"], row["ContractedCost"] = cost, cost

	provider := providerName(e.Provider)
	if provider == "" && r != nil {
		provider = providerName(r.Instance.Provider)
	}
	if provider == "" {
		provider = issuer
	}
	row["ProviderName"], row["PublisherName"] = provider, provider
	if e.KeyID != "" {
		row["SubAccountId"] = e.KeyID
		row["SubAccountName"] = e.KeyID
		set("SubAccountName", e.KeyName)
	}

	gpu := e.GPUName
	var inst gpuproxy.Instance
	if r != nil {
		inst = r.Instance
		if inst.GPUName != "" {
			gpu = inst.GPUName
		}
	}
	tags := map[string]string{}
	if e.InstanceID != "" {
		row["ResourceId"], row["ResourceType"] = e.InstanceID, ResourceTypeInstance
		set("ResourceName", inst.Label)
		if inst.Label != "" {
			tags["label"] = inst.Label
		}
		if r != nil && r.Service != "" {
			tags["service"] = r.Service
			tags["model"] = r.ServiceModel
		}
	}
	if len(tags) > 0 {
		b, _ := json.Marshal(tags) // a map of strings always marshals
		row["Tags"] = string(b)
	}

	start, end := hourOf(e.At)
	lease := strings.HasPrefix(e.IdempotencyKey, "lease:")
	switch {
	case e.Type == billing.Credit:
		row["ChargeCategory"], row["ChargeFrequency"], row["ServiceName"] = "Credit", "One-Time", ServiceAccount
	case e.Type == billing.Adjustment:
		row["ChargeCategory"], row["ChargeFrequency"] = "Adjustment", "One-Time"
		row["ServiceName"] = ServiceAccount
		if e.InstanceID != "" {
			row["ServiceName"] = ServiceGPUInstances
			set("SkuId", gpu)
		}
	case e.Basis == billing.Prepaid: // an io.net rental, or its refund
		row["ChargeCategory"], row["ChargeFrequency"], row["ServiceName"] = "Purchase", "One-Time", ServiceGPUInstances
		row["SkuId"] = skuOf(gpu)
		q := int64(1)
		if e.Type == billing.Refund {
			q = -1
		}
		if e.Type == billing.Charge && inst.Hours > 0 && inst.PricePerHour*gpuproxy.Micros(inst.Hours) == e.Amount {
			// The rental's total is its price × hours: price it so.
			start = e.At
			end = start.Add(time.Duration(inst.Hours) * time.Hour)
			price(row, inst.PricePerHour, big.NewInt(int64(inst.Hours)), 0, "Hours")
		} else {
			price(row, abs(billed), big.NewInt(q), 0, "Units")
		}
	default: // Usage: metered instance time, proxy requests, their refunds
		row["ChargeCategory"], row["ChargeFrequency"], row["ServiceName"] = "Usage", "Usage-Based", ServiceGPUInstances
		if lease {
			row["ServiceName"] = ServiceRequests
		}
		row["SkuId"] = skuOf(gpu)
		if gpu == "" && (lease || e.InstanceID == "") {
			row["SkuId"] = SkuRequests
		}
		from, metered := billing.MeterChargeStart(e)
		stop := strings.HasPrefix(e.IdempotencyKey, "meter-stop:")
		switch {
		case metered && inst.PricePerHour > 0:
			start, end = from, e.At
			nh := nanoHours(end.Sub(start))
			price(row, inst.PricePerHour, nh, 9, "Hours")
			consume(row, nh, inst.NumGPUs)
		case stop && inst.PricePerHour > 0:
			// Metered time returned after a stop: the hours the refund is
			// worth at the instance's price.
			nh := new(big.Int).Mul(big.NewInt(int64(e.Amount)), big.NewInt(1e9))
			nh = divRound(nh, big.NewInt(int64(inst.PricePerHour)))
			start, end = e.At, e.At.Add(time.Duration(nh.Int64()*3600)) // 1 nano-hour = 3600 ns
			nh.Neg(nh)
			price(row, inst.PricePerHour, nh, 9, "Hours")
			consume(row, nh, inst.NumGPUs)
		default:
			q := int64(1)
			if e.Type == billing.Refund {
				q = -1
			}
			price(row, abs(billed), big.NewInt(q), 0, "Units")
			row["ConsumedQuantity"], row["ConsumedUnit"] = strconv.FormatInt(q, 10), "Units"
		}
	}
	if corrects(e) && r != nil && began(r.Instance).Before(bs) {
		row["ChargeClass"] = "Correction"
	}
	row["ChargePeriodStart"] = start.UTC().Truncate(time.Second).Format(TimeLayout)
	row["ChargePeriodEnd"] = ceilSecond(end).Format(TimeLayout)
	return row
}

// corrects reports whether e corrects earlier charges of its instance: a
// truth-up or other adjustment, or the refund of a prepaid rental.
func corrects(e billing.Entry) bool {
	return e.InstanceID != "" && (e.Type == billing.Adjustment || e.Type == billing.Refund && e.Basis == billing.Prepaid)
}

// began is when an instance's charges began: its start, else its creation.
func began(i gpuproxy.Instance) time.Time {
	if !i.StartedAt.IsZero() {
		return i.StartedAt
	}
	return i.CreatedAt
}

// price sets the pricing columns: unit price p (micro-dollars per unit),
// quantity q at scale decimals, ListCost = ContractedCost = p × q exactly.
func price(row Row, p gpuproxy.Micros, q *big.Int, scale int, unit string) {
	row["ListUnitPrice"] = usd(p)
	row["PricingQuantity"] = decimal(q, scale, 0)
	row["PricingUnit"] = unit
	c := new(big.Int).Mul(big.NewInt(int64(p)), q)
	row["ListCost"] = decimal(c, scale+6, 6)
	row["ContractedCost"] = row["ListCost"]
}

// consume sets the consumed GPU-hours: nh nano-hours × gpus (at least 1).
func consume(row Row, nh *big.Int, gpus int) {
	row["ConsumedQuantity"] = decimal(new(big.Int).Mul(nh, big.NewInt(int64(max(gpus, 1)))), 9, 0)
	row["ConsumedUnit"] = "GPU-Hours"
}

// nanoHours is d in hours to nine decimals (billionths of an hour),
// rounded half up.
func nanoHours(d time.Duration) *big.Int {
	// 1 ns = 1/3.6e12 h = 1e9/3.6e12 nano-hours = 1/3600 nano-hours.
	return divRound(big.NewInt(int64(d)), big.NewInt(3600))
}

// divRound is a / b rounded half away from zero (b > 0).
func divRound(a, b *big.Int) *big.Int {
	q, m := new(big.Int).QuoRem(a, b, new(big.Int))
	if new(big.Int).Mul(new(big.Int).Abs(m), big.NewInt(2)).Cmp(b) >= 0 {
		if a.Sign() < 0 {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	return q
}

// decimal renders v × 10^-scale exactly, trailing zeros trimmed down to
// min decimals.
func decimal(v *big.Int, scale, min int) string {
	neg := v.Sign() < 0
	s := new(big.Int).Abs(v).String()
	if scale > 0 {
		for len(s) <= scale {
			s = "0" + s
		}
		whole, frac := s[:len(s)-scale], s[len(s)-scale:]
		for len(frac) > min && frac[len(frac)-1] == '0' {
			frac = frac[:len(frac)-1]
		}
		s = whole
		if frac != "" {
			s += "." + frac
		}
	}
	if neg && strings.Trim(s, "0.") != "" {
		s = "-" + s
	}
	return s
}

// usd renders m as US dollars with exactly six decimals.
func usd(m gpuproxy.Micros) string { return decimal(big.NewInt(int64(m)), 6, 6) }

func abs(m gpuproxy.Micros) gpuproxy.Micros {
	if m < 0 {
		return -m
	}
	return m
}

// billingPeriod is the calendar month (UTC) of t: [start, end).
func billingPeriod(t time.Time) (time.Time, time.Time) {
	t = t.UTC()
	s := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return s, s.AddDate(0, 1, 0)
}

// hourOf is the hour (UTC) that t falls in: where a one-time charge is
// recorded.
func hourOf(t time.Time) (time.Time, time.Time) {
	s := t.UTC().Truncate(time.Hour)
	return s, s.Add(time.Hour)
}

func ceilSecond(t time.Time) time.Time {
	t = t.UTC()
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}

// skuOf is the SkuId of an instance's GPU model.
func skuOf(gpu string) string {
	if gpu == "" {
		return ResourceTypeInstance
	}
	return gpu
}

// providerName is how FOCUS rows name a provider: the API's names
// (vast.ai, io.net) as they are.
func providerName(p string) string { return p }

// Store is what an export reads besides the ledger: the instance an entry
// names (not found for another account's) and the service it is a
// replica of.
type Store interface {
	Instance(ctx context.Context, accountID int64, id string) (gpuproxy.Instance, error)
	ReplicaService(ctx context.Context, accountID int64, id string) (name, model string, err error)
}

// Options configure an Exporter. Zero values take the defaults.
type Options struct {
	// Issuer is the InvoiceIssuerName (default DefaultIssuer).
	Issuer string
}

// Exporter writes ledger entries as FOCUS rows.
type Exporter struct {
	ledger *billing.Ledger
	store  Store
	opts   Options
}

// New returns an Exporter over ledger and store.
func New(ledger *billing.Ledger, store Store, o Options) *Exporter {
	if o.Issuer == "" {
		o.Issuer = DefaultIssuer
	}
	return &Exporter{ledger: ledger, store: store, opts: o}
}

// Check refuses a filter the export cannot run (a key_id not of the
// account), before a response starts.
func (x *Exporter) Check(ctx context.Context, f billing.Filter) error {
	return x.ledger.CheckKey(ctx, f)
}

// Export writes one row per entry f matches (newest first) to w, reading
// the ledger in pages and each instance once.
func (x *Exporter) Export(ctx context.Context, f billing.Filter, w Writer) error {
	type ref struct {
		acct int64
		id   string
	}
	seen := map[ref]*Resource{}
	err := x.ledger.Each(ctx, f, func(e billing.Entry) error {
		var r *Resource
		if e.InstanceID != "" {
			k := ref{e.AccountID, e.InstanceID}
			var ok bool
			if r, ok = seen[k]; !ok {
				var err error
				if r, err = x.resource(ctx, e.AccountID, e.InstanceID); err != nil {
					return err
				}
				seen[k] = r
			}
		}
		return w.Write(Map(e, r, x.opts.Issuer))
	})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return err
}

func (x *Exporter) resource(ctx context.Context, acct int64, id string) (*Resource, error) {
	inst, err := x.store.Instance(ctx, acct, id)
	if gpuproxy.ErrorCode(err) == gpuproxy.ENOTFOUND {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading instance %s: %w", id, err)
	}
	r := &Resource{Instance: inst}
	if r.Service, r.ServiceModel, err = x.store.ReplicaService(ctx, acct, id); err != nil {
		return nil, err
	}
	return r, nil
}
