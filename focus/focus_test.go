package focus_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/billing"
	"github.com/aiserve/gpuproxy/db"
	"github.com/aiserve/gpuproxy/db/dbtest"
	"github.com/aiserve/gpuproxy/focus"
	"github.com/aiserve/gpuproxy/guardrails"
)

// rule is one column's FOCUS 1.2 content constraints, as the
// specification's column pages state them (data type, whether nulls are
// allowed, allowed values).
type rule struct {
	typ      focus.Type
	nullable bool
	allowed  []string
}

// rules are the FOCUS 1.2 constraints of every exported column.
var rules = map[string]rule{
	"BilledCost":         {focus.Decimal, false, nil},
	"BillingAccountId":   {focus.String, false, nil},
	"BillingAccountName": {focus.String, true, nil},
	"BillingCurrency":    {focus.String, false, []string{"USD"}}, // ISO 4217 national currency
	"BillingPeriodEnd":   {focus.DateTime, false, nil},
	"BillingPeriodStart": {focus.DateTime, false, nil},
	"ChargeCategory":     {focus.String, false, []string{"Usage", "Purchase", "Tax", "Credit", "Adjustment"}},
	"ChargeClass":        {focus.String, true, []string{"Correction"}},
	"ChargeDescription":  {focus.String, true, nil},
	"ChargeFrequency":    {focus.String, false, []string{"One-Time", "Recurring", "Usage-Based"}},
	"ChargePeriodEnd":    {focus.DateTime, false, nil},
	"ChargePeriodStart":  {focus.DateTime, false, nil},
	"ConsumedQuantity":   {focus.Decimal, true, nil},
	"ConsumedUnit":       {focus.String, true, nil},
	"ContractedCost":     {focus.Decimal, false, nil},
	"EffectiveCost":      {focus.Decimal, false, nil},
	"InvoiceIssuerName":  {focus.String, false, nil},
	"ListCost":           {focus.Decimal, false, nil},
	"ListUnitPrice":      {focus.Decimal, true, nil},
	"PricingQuantity":    {focus.Decimal, true, nil},
	"PricingUnit":        {focus.String, true, nil},
	"ProviderName":       {focus.String, false, nil},
	"PublisherName":      {focus.String, false, nil},
	"RegionId":           {focus.String, true, nil},
	"RegionName":         {focus.String, true, nil},
	"ResourceId":         {focus.String, true, nil},
	"ResourceName":       {focus.String, true, nil},
	"ResourceType":       {focus.String, true, nil},
	"ServiceCategory": {focus.String, false, []string{"AI and Machine Learning", "Analytics", "Business Applications",
		"Compute", "Databases", "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things",
		"Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security", "Storage", "Web", "Other"}},
	"ServiceName":     {focus.String, false, nil},
	"SkuId":           {focus.String, true, nil},
	"SubAccountId":    {focus.String, true, nil},
	"SubAccountName":  {focus.String, true, nil},
	"Tags":            {focus.JSON, true, nil},
	"x_LedgerEntryId": {focus.String, false, nil},
	"x_LedgerType":    {focus.String, false, []string{"charge", "credit", "refund", "adjustment"}},
	"x_LedgerBasis":   {focus.String, false, []string{"metered", "prepaid", "provider", "manual"}},
}

// NumericFormat: an integer or decimal, a "-" only for negatives, no
// "+", commas, units or symbols (we write no E notation).
var numeric = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// DateTimeFormat: UTC, extended ISO 8601, to the second, with Z.
var dateTime = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$`)

// UnitFormat's recommended shapes: "Hours", "GPU-Hours", "GB/Hour",
// "1000 Tokens".
var unitFormat = regexp.MustCompile(`^([0-9]+ )?[A-Z][A-Za-z]*(-[A-Z][a-z]+s|/[A-Z][a-z]+)?$`)

func rat(t *testing.T, s string) *big.Rat {
	t.Helper()
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("not a decimal: %q", s)
	}
	return r
}

// checkRows checks every row of a CSV export against the column rules
// and the rules between columns, and returns the rows by column name
// (nulls absent).
func checkRows(t *testing.T, csvText []byte) []map[string]string {
	t.Helper()
	recs, err := csv.NewReader(bytes.NewReader(csvText)).ReadAll()
	if err != nil {
		t.Fatalf("not CSV: %v\n%s", err, csvText)
	}
	if !slices.Equal(recs[0], focus.Header()) {
		t.Fatalf("header %q", recs[0])
	}
	for _, name := range recs[0] {
		if _, ok := rules[name]; !ok {
			t.Fatalf("column %s has no rule", name)
		}
	}
	var rows []map[string]string
	for n, rec := range recs[1:] {
		row := map[string]string{}
		for i, name := range recs[0] {
			if rec[i] != "" {
				row[name] = rec[i]
			}
		}
		rows = append(rows, row)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Errorf("row %d (entry %s, %s %s): "+format, append([]any{n + 1, row["x_LedgerEntryId"],
				row["x_LedgerType"], row["x_LedgerBasis"]}, args...)...)
		}
		for _, name := range recs[0] {
			r, v := rules[name], rec[i(recs[0], name)]
			if v == "" {
				if !r.nullable {
					fail("%s is null", name)
				}
				continue
			}
			if strings.TrimSpace(v) == "" {
				fail("%s is blank", name)
			}
			if r.allowed != nil && !slices.Contains(r.allowed, v) {
				fail("%s = %q, not one of %q", name, v, r.allowed)
			}
			switch r.typ {
			case focus.Decimal:
				if !numeric.MatchString(v) {
					fail("%s = %q is not NumericFormat", name, v)
				}
			case focus.DateTime:
				if !dateTime.MatchString(v) {
					fail("%s = %q is not DateTimeFormat", name, v)
				}
			case focus.JSON:
				var obj map[string]any
				if err := json.Unmarshal([]byte(v), &obj); err != nil {
					fail("%s = %q is not a JSON object: %v", name, v, err)
				}
				for k, x := range obj {
					switch x.(type) {
					case map[string]any, []any:
						fail("%s key %q holds an object or array", name, k)
					}
				}
			}
		}
		has := func(c string) bool { _, ok := row[c]; return ok }
		cat, correction := row["ChargeCategory"], row["ChargeClass"] == "Correction"
		// Pairs that are null together.
		for _, p := range [][2]string{{"ConsumedQuantity", "ConsumedUnit"}, {"PricingQuantity", "PricingUnit"},
			{"RegionId", "RegionName"}, {"ResourceId", "ResourceType"}, {"SubAccountId", "SubAccountName"}} {
			if has(p[0]) != has(p[1]) {
				fail("%s and %s must be null together", p[0], p[1])
			}
		}
		if has("ResourceName") && !has("ResourceId") {
			fail("ResourceName without ResourceId")
		}
		if has("ResourceName") && row["ResourceName"] == row["ResourceId"] {
			fail("ResourceName duplicates ResourceId")
		}
		for _, u := range []string{"ConsumedUnit", "PricingUnit"} {
			if has(u) && !unitFormat.MatchString(row[u]) {
				fail("%s = %q is not UnitFormat", u, row[u])
			}
		}
		// ConsumedQuantity: null unless Usage; not null for Usage unless a
		// correction.
		if cat != "Usage" && has("ConsumedQuantity") {
			fail("ConsumedQuantity on a %s row", cat)
		}
		if cat == "Usage" && !correction && !has("ConsumedQuantity") {
			fail("Usage row without ConsumedQuantity")
		}
		// Usage and Purchase rows that are not corrections are priced.
		if (cat == "Usage" || cat == "Purchase") && !correction {
			for _, c := range []string{"ListUnitPrice", "PricingQuantity", "PricingUnit", "SkuId"} {
				if !has(c) {
					fail("%s row without %s", cat, c)
				}
			}
		}
		if cat == "Purchase" && row["ChargeFrequency"] == "Usage-Based" {
			fail("Purchase row is Usage-Based")
		}
		if has("ListUnitPrice") && rat(t, row["ListUnitPrice"]).Sign() < 0 {
			fail("ListUnitPrice is negative")
		}
		// ListCost (and ContractedCost) is ListUnitPrice × PricingQuantity,
		// exactly, or else the BilledCost of a charge unrelated to others.
		for _, c := range []string{"ListCost", "ContractedCost"} {
			if has("ListUnitPrice") && has("PricingQuantity") {
				if !correction && new(big.Rat).Mul(rat(t, row["ListUnitPrice"]), rat(t, row["PricingQuantity"])).Cmp(rat(t, row[c])) != 0 {
					fail("%s %s ≠ ListUnitPrice %s × PricingQuantity %s", c, row[c], row["ListUnitPrice"], row["PricingQuantity"])
				}
			} else if row[c] != row["BilledCost"] {
				fail("%s %s ≠ BilledCost %s without a unit price", c, row[c], row["BilledCost"])
			}
		}
		// Nothing is amortized: EffectiveCost is BilledCost (for Credit
		// and Adjustment rows the specification requires it).
		if row["EffectiveCost"] != row["BilledCost"] {
			fail("EffectiveCost %s ≠ BilledCost %s", row["EffectiveCost"], row["BilledCost"])
		}
		// Periods: start before end, the billing period a month holding
		// the entry.
		for _, p := range [][2]string{{"BillingPeriodStart", "BillingPeriodEnd"}, {"ChargePeriodStart", "ChargePeriodEnd"}} {
			if dateTime.MatchString(row[p[0]]) && dateTime.MatchString(row[p[1]]) && row[p[0]] >= row[p[1]] {
				fail("%s %s is not before %s %s", p[0], row[p[0]], p[1], row[p[1]])
			}
		}
	}
	return rows
}

func i(header []string, name string) int { return slices.Index(header, name) }

// microsOf parses a BilledCost (six decimals) as micro-dollars, exactly.
func microsOf(t *testing.T, s string) gpuproxy.Micros {
	t.Helper()
	m, err := gpuproxy.ParseUSD(s)
	if err != nil || !strings.Contains(s, ".") || len(s)-strings.Index(s, ".") != 7 {
		t.Fatalf("BilledCost %q: not six decimals (%v)", s, err)
	}
	return m
}

// TestExportFollowsFOCUS exports every kind of ledger entry (a top-up,
// metered time, the time returned after a stop, proxy requests on a key,
// a prepaid rental and its refund in a later month, a provider truth-up,
// a manual adjustment) from both stores and checks every row against the
// FOCUS 1.2 column rules, the BilledCost total against the ledger's for
// the period to the micro-dollar, that no other account's entry is in it,
// and the rows' particular values.
func TestExportFollowsFOCUS(t *testing.T) {
	for _, k := range dbtest.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			testExport(t, dbtest.Open(t, k))
		})
	}
}

func testExport(t *testing.T, st *db.Store) {
	ctx := context.Background()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	acme, err := st.CreateAccount(ctx, "acme", now)
	if err != nil {
		t.Fatal(err)
	}
	beta, err := st.CreateAccount(ctx, "beta", now)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateKey(ctx, gpuproxy.APIKey{ID: "key_ci", AccountID: acme.ID, Name: "ci-bot", Hash: "h1",
		Scopes: []gpuproxy.Scope{gpuproxy.ScopeBillingRead}, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	admit := func(inst gpuproxy.Instance) {
		t.Helper()
		res, _, _, err := st.AdmitInstance(ctx, guardrails.AdmitRequest{AccountID: inst.AccountID, Cost: 1, Now: now,
			Horizon: time.Hour, Hold: true, Defaults: guardrails.DefaultWindows}, inst)
		if err != nil || !res.Admitted {
			t.Fatalf("admit %s: %+v %v", inst.ID, res, err)
		}
	}
	const usd = gpuproxy.MicrosPerUSD
	hourly := gpuproxy.Instance{ID: "gpi_focus00000000000001", AccountID: acme.ID, Provider: "vast.ai", OfferID: "o1",
		GPUName: "RTX 4090", NumGPUs: 2, PricePerHour: 622_083, Billing: "hourly", Label: "llama-bench",
		Status: gpuproxy.Pending, KeyID: "key_ci", CreatedAt: now.Add(-2 * time.Hour)}
	prepaid := gpuproxy.Instance{ID: "gpi_focus00000000000002", AccountID: acme.ID, Provider: "io.net", OfferID: "o2",
		GPUName: "H100 SXM", NumGPUs: 1, PricePerHour: 2 * usd, Billing: "prepaid", Hours: 3, PrepaidTotal: 6 * usd,
		Status: gpuproxy.Pending, CreatedAt: now.AddDate(0, -1, 0)}
	admit(hourly)
	admit(prepaid)
	if _, err := st.CreateService(ctx, gpuproxy.Service{ID: "svc_focus1", AccountID: acme.ID, Name: "llama",
		Model: "llama-70b", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddReplica(ctx, gpuproxy.Replica{ServiceID: "svc_focus1", InstanceID: hourly.ID, AccountID: acme.ID,
		CreatedAt: now}); err != nil {
		t.Fatal(err)
	}

	ledger := billing.NewLedger(st, func() time.Time { return now })
	from := now.Add(-90 * time.Minute)
	period := 20*time.Minute + 1500*time.Millisecond
	entries := []billing.Entry{
		{AccountID: acme.ID, Type: billing.Credit, Amount: 100 * usd, At: now.Add(-time.Hour), Basis: billing.Manual,
			Description: "PO 7"},
		{AccountID: acme.ID, Type: billing.Charge, Amount: 208_032, At: from.Add(period), Basis: billing.Metered,
			Provider: "vast.ai", InstanceID: hourly.ID, Description: "metered",
			IdempotencyKey: billing.MeterChargeKey("m1", from)},
		{AccountID: acme.ID, Type: billing.Refund, Amount: 10_368, At: from.Add(period), Basis: billing.Metered,
			Provider: "vast.ai", InstanceID: hourly.ID, IdempotencyKey: "meter-stop:m1", Description: "returned"},
		{AccountID: acme.ID, Type: billing.Charge, Amount: 1_234, At: now.Add(-30 * time.Minute), Basis: billing.Metered,
			InstanceID: hourly.ID, KeyID: "key_ci", ByCaller: true, IdempotencyKey: "lease:7:" + hourly.ID,
			Description: "proxy requests: 3"},
		{AccountID: acme.ID, Type: billing.Charge, Amount: 7, At: now.Add(-29 * time.Minute), Basis: billing.Metered,
			KeyID: "key_ci", ByCaller: true, IdempotencyKey: "lease:8:expired", Description: "proxy lease expired"},
		// The rental was charged last month (outside the export); its
		// refund and truth-up this month correct an invoiced period.
		{AccountID: acme.ID, Type: billing.Charge, Amount: 6 * usd, At: prepaid.CreatedAt, Basis: billing.Prepaid,
			Provider: "io.net", InstanceID: prepaid.ID, IdempotencyKey: "prepaid:" + prepaid.ID},
		{AccountID: acme.ID, Type: billing.Refund, Amount: 1_500_001, At: now.Add(-20 * time.Minute), Basis: billing.Prepaid,
			Provider: "io.net", InstanceID: prepaid.ID, IdempotencyKey: "refund:" + prepaid.ID},
		{AccountID: acme.ID, Type: billing.Adjustment, Amount: -3, At: now.Add(-10 * time.Minute), Basis: billing.Provider,
			Provider: "io.net", InstanceID: prepaid.ID, IdempotencyKey: "truthup:x"},
		// The hourly instance's truth-up corrects this month: no class.
		{AccountID: acme.ID, Type: billing.Adjustment, Amount: 5, At: now.Add(-9 * time.Minute), Basis: billing.Provider,
			Provider: "vast.ai", InstanceID: hourly.ID, IdempotencyKey: "truthup:y"},
		{AccountID: acme.ID, Type: billing.Adjustment, Amount: 250_000, At: now.Add(-8 * time.Minute), Basis: billing.Manual,
			Description: "goodwill"},
		{AccountID: beta.ID, Type: billing.Charge, Amount: 3 * usd, At: now.Add(-5 * time.Minute), Basis: billing.Metered},
		{AccountID: acme.ID, Type: billing.Charge, Amount: 9 * usd, At: now, Basis: billing.Metered}, // at to: outside
	}
	for _, e := range entries {
		if _, err := ledger.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	f := billing.Filter{AccountID: acme.ID, From: now.AddDate(0, 0, -1), To: now}
	var buf bytes.Buffer
	if err := focus.New(ledger, st, focus.Options{}).Export(ctx, f, focus.NewCSV(&buf)); err != nil {
		t.Fatal(err)
	}
	rows := checkRows(t, buf.Bytes())
	if len(rows) != 9 {
		t.Fatalf("%d rows, want acme's 9 of the day:\n%s", len(rows), buf.Bytes())
	}
	var sum gpuproxy.Micros
	by := map[string]map[string]string{} // by description or idempotency role
	for _, r := range rows {
		sum += microsOf(t, r["BilledCost"])
		if r["BillingAccountId"] != itoa(acme.ID) || r["BillingAccountName"] != "acme" {
			t.Errorf("another account's row: %v", r)
		}
		by[r["x_LedgerType"]+"/"+r["x_LedgerBasis"]+"/"+r["ChargeDescription"]+"/"+r["ResourceId"]] = r
	}
	tot, err := st.Totals(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if sum != tot.Amount() || tot.Count != int64(len(rows)) {
		t.Fatalf("BilledCost sums to %s over %d rows; the ledger's total is %s over %d", sum, len(rows), tot.Amount(), tot.Count)
	}

	want := []struct {
		key  string
		cols map[string]string
	}{
		{"credit/manual/PO 7/", map[string]string{"ChargeCategory": "Credit", "BilledCost": "-100.000000",
			"ChargeFrequency": "One-Time", "ResourceId": "", "SubAccountId": "", "Tags": ""}},
		{"charge/metered/metered/" + hourly.ID, map[string]string{"ChargeCategory": "Usage", "ChargeFrequency": "Usage-Based",
			"BilledCost": "0.208032", "ChargePeriodStart": "2026-03-10T10:30:00Z", "ChargePeriodEnd": "2026-03-10T10:50:02Z",
			// 20 min 1.5 s = 0.33375 h; × 2 GPUs.
			"PricingUnit": "Hours", "PricingQuantity": "0.33375", "ListUnitPrice": "0.622083",
			"ListCost": "0.20762020125", "ConsumedUnit": "GPU-Hours", "ConsumedQuantity": "0.6675",
			"SkuId": "RTX 4090", "ProviderName": "vast.ai", "ResourceName": "llama-bench", "ResourceType": "GPU Instance",
			"SubAccountId": "key_ci", "SubAccountName": "ci-bot", "ServiceName": "GPU Instances",
			"Tags": `{"label":"llama-bench","model":"llama-70b","service":"llama"}`, "ChargeClass": "",
			"BillingPeriodStart": "2026-03-01T00:00:00Z", "BillingPeriodEnd": "2026-04-01T00:00:00Z", "RegionId": ""}},
		{"refund/metered/returned/" + hourly.ID, map[string]string{"ChargeCategory": "Usage", "BilledCost": "-0.010368",
			// $0.010368 at $0.622083/h is 0.016666586 h.
			"PricingQuantity": "-0.016666586", "ConsumedQuantity": "-0.033333172", "ChargeClass": ""}},
		{"charge/metered/proxy requests: 3/" + hourly.ID, map[string]string{"ServiceName": "Inference Requests",
			"PricingUnit": "Units", "PricingQuantity": "1", "ListUnitPrice": "0.001234", "SkuId": "RTX 4090",
			"SubAccountName": "ci-bot", "ProviderName": "vast.ai"}},
		{"charge/metered/proxy lease expired/", map[string]string{"SkuId": "Inference Request", "ResourceId": "",
			"ProviderName": focus.DefaultIssuer, "BilledCost": "0.000007"}},
		{"refund/prepaid//" + prepaid.ID, map[string]string{"ChargeCategory": "Purchase", "ChargeClass": "Correction",
			"BilledCost": "-1.500001", "ChargeFrequency": "One-Time", "ProviderName": "io.net", "SkuId": "H100 SXM"}},
		{"adjustment/provider//" + prepaid.ID, map[string]string{"ChargeCategory": "Adjustment", "ChargeClass": "Correction",
			"BilledCost": "-0.000003", "ListUnitPrice": "", "PricingQuantity": ""}},
		{"adjustment/provider//" + hourly.ID, map[string]string{"ChargeCategory": "Adjustment", "ChargeClass": ""}},
		{"adjustment/manual/goodwill/", map[string]string{"ChargeCategory": "Adjustment", "BilledCost": "0.250000",
			"ServiceName": "GPU Proxy Account", "ResourceId": ""}},
	}
	for _, w := range want {
		r, ok := by[w.key]
		if !ok {
			t.Errorf("no row %s", w.key)
			continue
		}
		for c, v := range w.cols {
			if r[c] != v {
				t.Errorf("%s: %s = %q, want %q", w.key, c, r[c], v)
			}
		}
	}
}

func itoa(n int64) string { return big.NewInt(n).String() }
