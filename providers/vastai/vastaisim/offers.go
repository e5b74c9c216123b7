package vastaisim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
)

// Offer is one bundles row in vast.ai's wire format: gpu_ram and cpu_ram in
// MB, disk_space in GB, prices in USD per hour for the whole offer,
// storage_cost in USD per GB per month.
//
// DPHTotal, StorageTotalCost and Search are recomputed for each search from
// DPHBase, StorageCost and the query's allocated_storage. An offer with
// Rented set is not listed and cannot be rented.
type Offer struct {
	ID                int64       `json:"id"`
	AskContractID     int64       `json:"ask_contract_id"`
	BundleID          int64       `json:"bundle_id"`
	MachineID         int64       `json:"machine_id"`
	HostID            int64       `json:"host_id"`
	GPUName           string      `json:"gpu_name"`
	NumGPUs           int         `json:"num_gpus"`
	GPURAM            int         `json:"gpu_ram"`
	GPUTotalRAM       int         `json:"gpu_total_ram"`
	GPUFrac           float64     `json:"gpu_frac"`
	GPUArch           string      `json:"gpu_arch"`
	GPUMemBW          float64     `json:"gpu_mem_bw"`
	ComputeCap        int         `json:"compute_cap"`
	CUDAMaxGood       float64     `json:"cuda_max_good"`
	DriverVersion     string      `json:"driver_version"`
	CPUName           string      `json:"cpu_name"`
	CPUArch           string      `json:"cpu_arch"`
	CPUCores          int         `json:"cpu_cores"`
	CPUCoresEffective float64     `json:"cpu_cores_effective"`
	CPURAM            int         `json:"cpu_ram"`
	DiskSpace         float64     `json:"disk_space"`
	DiskBW            float64     `json:"disk_bw"`
	InetUp            float64     `json:"inet_up"`
	InetDown          float64     `json:"inet_down"`
	DPHBase           float64     `json:"dph_base"`
	DPHTotal          float64     `json:"dph_total"`
	StorageCost       float64     `json:"storage_cost"`
	StorageTotalCost  float64     `json:"storage_total_cost"`
	MinBid            float64     `json:"min_bid"`
	Reliability       float64     `json:"reliability"`
	Reliability2      float64     `json:"reliability2"`
	Verification      string      `json:"verification"`
	HostingType       int         `json:"hosting_type"`
	Geolocation       string      `json:"geolocation"`
	PublicIPAddr      string      `json:"public_ipaddr"`
	DirectPortCount   int         `json:"direct_port_count"`
	StaticIP          bool        `json:"static_ip"`
	Rentable          bool        `json:"rentable"`
	Rented            bool        `json:"rented"`
	IsBid             bool        `json:"is_bid"`
	External          bool        `json:"external"`
	Duration          float64     `json:"duration"`
	DLPerf            float64     `json:"dlperf"`
	TotalFlops        float64     `json:"total_flops"`
	DLPerfPerDPHTotal float64     `json:"dlperf_per_dphtotal"`
	Score             float64     `json:"score"`
	Search            OfferPrices `json:"search"`
}

// OfferPrices is the per-offer cost summary vast.ai adds to rows
// (search.totalHour equals dph_total).
type OfferPrices struct {
	GPUCostPerHour         float64 `json:"gpuCostPerHour"`
	DiskHour               float64 `json:"diskHour"`
	TotalHour              float64 `json:"totalHour"`
	DiscountTotalHour      float64 `json:"discountTotalHour"`
	DiscountedTotalPerHour float64 `json:"discountedTotalPerHour"`
}

// priced returns a copy of o priced for storageGB of allocated storage.
func (o Offer) priced(storageGB float64) Offer {
	base := o.DPHBase
	if base == 0 {
		base = o.DPHTotal
		o.DPHBase = base
	}
	o.StorageTotalCost = o.StorageCost * storageGB / 720 // $/GB/month → $/hr
	o.DPHTotal = base + o.StorageTotalCost
	o.Search = OfferPrices{GPUCostPerHour: base, DiskHour: o.StorageTotalCost, TotalHour: o.DPHTotal,
		DiscountedTotalPerHour: o.DPHTotal}
	if o.DPHTotal > 0 {
		o.DLPerfPerDPHTotal = o.DLPerf / o.DPHTotal
	}
	return o
}

type gpuSpec struct {
	name       string
	ramMB      int
	perGPU     float64 // $/hr compute per GPU
	computeCap int
	dlperf     float64 // per GPU
	tflops     float64 // per GPU
	memBW      float64
}

var gpuSpecs = map[string]gpuSpec{
	"RTX 3080":  {"RTX 3080", 10240, 0.09, 860, 18, 29.8, 760},
	"RTX 3090":  {"RTX 3090", 24576, 0.18, 860, 24, 35.6, 936},
	"RTX 4090":  {"RTX 4090", 24564, 0.35, 890, 48, 82.6, 1008},
	"RTX 5090":  {"RTX 5090", 32607, 0.62, 1200, 70, 104.8, 1792},
	"RTX A5000": {"RTX A5000", 24564, 0.22, 860, 20, 27.8, 768},
	"RTX A6000": {"RTX A6000", 49140, 0.45, 860, 30, 38.7, 768},
	"L4":        {"L4", 23034, 0.30, 890, 20, 30.3, 300},
	"L40S":      {"L40S", 46068, 0.85, 890, 55, 91.6, 864},
	"A100 PCIE": {"A100 PCIE", 40960, 0.75, 800, 60, 19.5, 1555},
	"A100 SXM4": {"A100 SXM4", 81920, 1.15, 800, 75, 19.5, 2039},
	"H100 PCIE": {"H100 PCIE", 81559, 1.85, 900, 110, 51.2, 2000},
	"H100 SXM":  {"H100 SXM", 81559, 2.20, 900, 140, 66.9, 3350},
	"H200":      {"H200", 143771, 3.05, 900, 150, 66.9, 4800},
}

// DefaultCatalog returns the simulator's default market: 34 offers from
// RTX 3080 to 8× H200, priced about $0.09 to $25 per hour, in realistic wire
// units. It includes an unverified offer and an unrentable one, which the
// CLI's default filters exclude.
func DefaultCatalog() []Offer {
	rows := []struct {
		gpu   string
		n     int
		geo   string
		rel   float64
		mult  float64 // price multiplier of this host
		dc    bool
		unver bool
		noRnt bool
	}{
		{"RTX 3080", 1, "Ontario, CA", 0.962, 1.0, false, false, false},
		{"RTX 3080", 2, "Bavaria, DE", 0.951, 0.95, false, false, false},
		{"RTX 3090", 1, "Texas, US", 0.981, 1.0, false, false, false},
		{"RTX 3090", 2, "Quebec, CA", 0.990, 1.05, false, false, false},
		{"RTX 3090", 4, "Poland, PL", 0.944, 0.9, false, false, false},
		{"RTX 4090", 1, "Guangxi, CN", 0.970, 1.0, false, false, false},
		{"RTX 4090", 1, "California, US", 0.993, 1.15, false, false, false},
		{"RTX 4090", 1, "Sweden, SE", 0.912, 0.80, false, true, false},
		{"RTX 4090", 2, "Nevada, US", 0.985, 1.05, false, false, false},
		{"RTX 4090", 4, "Netherlands, NL", 0.997, 1.1, true, false, false},
		{"RTX 4090", 8, "Utah, US", 0.989, 1.0, false, false, false},
		{"RTX 5090", 1, "Washington, US", 0.975, 1.0, false, false, false},
		{"RTX 5090", 2, "Taiwan, TW", 0.968, 0.95, false, false, true},
		{"RTX A5000", 1, "Ohio, US", 0.979, 1.0, false, false, false},
		{"RTX A6000", 1, "Virginia, US", 0.995, 1.0, true, false, false},
		{"RTX A6000", 2, "Finland, FI", 0.987, 0.95, true, false, false},
		{"RTX A6000", 4, "Oregon, US", 0.991, 1.05, true, false, false},
		{"L4", 1, "Iowa, US", 0.999, 1.0, true, false, false},
		{"L40S", 1, "Virginia, US", 0.996, 1.0, true, false, false},
		{"L40S", 4, "Frankfurt, DE", 0.994, 0.98, true, false, false},
		{"L40S", 8, "Texas, US", 0.992, 1.0, true, false, false},
		{"A100 PCIE", 1, "Illinois, US", 0.983, 1.0, false, false, false},
		{"A100 PCIE", 2, "Norway, NO", 0.988, 0.97, true, false, false},
		{"A100 SXM4", 1, "Utah, US", 0.995, 1.0, true, false, false},
		{"A100 SXM4", 4, "Iceland, IS", 0.998, 0.96, true, false, false},
		{"A100 SXM4", 8, "Texas, US", 0.997, 0.95, true, false, false},
		{"H100 PCIE", 1, "Quebec, CA", 0.993, 1.0, true, false, false},
		{"H100 PCIE", 2, "Georgia, US", 0.990, 1.0, true, false, false},
		{"H100 SXM", 1, "California, US", 0.999, 1.0, true, false, false},
		{"H100 SXM", 2, "Virginia, US", 0.998, 0.98, true, false, false},
		{"H100 SXM", 8, "Texas, US", 0.999, 0.95, true, false, false},
		{"H200", 1, "Oregon, US", 0.998, 1.0, true, false, false},
		{"H200", 4, "Stockholm, SE", 0.997, 0.98, true, false, false},
		{"H200", 8, "Texas, US", 0.999, 1.0, true, false, false},
	}
	out := make([]Offer, 0, len(rows))
	for i, r := range rows {
		g := gpuSpecs[r.gpu]
		id := int64(11684738 + i*7919)
		machineGPUs := 8
		if r.n > machineGPUs {
			machineGPUs = r.n
		}
		frac := float64(r.n) / float64(machineGPUs)
		cores := 64
		if r.dc {
			cores = 128
		}
		o := Offer{
			ID: id, AskContractID: id, BundleID: id + 3, MachineID: int64(22990 + i*37), HostID: int64(125418 + i*11),
			GPUName: g.name, NumGPUs: r.n, GPURAM: g.ramMB, GPUTotalRAM: g.ramMB * r.n, GPUFrac: frac,
			GPUArch: "nvidia", GPUMemBW: g.memBW, ComputeCap: g.computeCap, CUDAMaxGood: 12.4,
			DriverVersion: "550.120", CPUName: "AMD EPYC 7543 32-Core Processor", CPUArch: "amd64",
			CPUCores: cores, CPUCoresEffective: math.Round(float64(cores)*frac*10) / 10,
			CPURAM:    int(float64(515786) * frac),
			DiskSpace: math.Round((400+float64(i*37%900))*1000) / 1000, DiskBW: 2500,
			InetUp: 500 + float64(i*13%400), InetDown: 800 + float64(i*29%900),
			DPHBase:     math.Round(g.perGPU*float64(r.n)*r.mult*1e6) / 1e6,
			StorageCost: 0.15, MinBid: math.Round(g.perGPU*float64(r.n)*0.6*1e6) / 1e6,
			Reliability: r.rel, Reliability2: r.rel, Verification: "verified",
			Geolocation: r.geo, PublicIPAddr: fmt.Sprintf("203.0.113.%d", 10+i),
			DirectPortCount: 100, Rentable: !r.noRnt, Duration: 30 * 86400,
			DLPerf: g.dlperf * float64(r.n), TotalFlops: g.tflops * float64(r.n),
		}
		if r.dc {
			o.HostingType = 1
			o.StaticIP = true
		}
		if r.unver {
			o.Verification = "unverified"
		}
		o.Score = o.DLPerf * o.Reliability2
		out = append(out, o)
	}
	return out
}

// fieldAliases are the CLI's field aliases.
var fieldAliases = map[string]string{
	"dph": "dph_total", "cuda_vers": "cuda_max_good",
	"dlperf_usd": "dlperf_per_dphtotal", "flops_usd": "flops_per_dphtotal",
}

// reservedKeys are the top-level query keys that are not filters.
var reservedKeys = map[string]bool{
	"order": true, "limit": true, "type": true, "allocated_storage": true, "disable_bundling": true,
}

// filter is one parsed {"field":{"op":value}} clause.
type filter struct {
	field, op string
	value     any
}

var validOps = map[string]bool{"eq": true, "neq": true, "gt": true, "gte": true, "lt": true, "lte": true,
	"in": true, "notin": true}

// parseFilters reads the flat filter object; known is the set of fields
// that may be filtered.
func parseFilters(q map[string]any, known func(string) bool) ([]filter, error) {
	var out []filter
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if reservedKeys[k] {
			continue
		}
		field := k
		if a, ok := fieldAliases[k]; ok {
			field = a
		}
		if !known(field) {
			return nil, fmt.Errorf("unknown filter field %q", k)
		}
		ops, ok := q[k].(map[string]any)
		if !ok { // a bare value is read as eq
			ops = map[string]any{"eq": q[k]}
		}
		for op, v := range ops {
			if !validOps[op] {
				return nil, fmt.Errorf("unknown operator %q on %q", op, k)
			}
			if _, isList := v.([]any); (op == "in" || op == "notin") && !isList {
				return nil, fmt.Errorf("operator %q on %q needs a list", op, k)
			}
			if field == "gpu_name" {
				v = normalizeNames(v)
			}
			out = append(out, filter{field, op, v})
		}
	}
	return out, nil
}

// normalizeNames turns CLI spelling (RTX_4090) into wire spelling.
func normalizeNames(v any) any {
	switch t := v.(type) {
	case string:
		return strings.ReplaceAll(t, "_", " ")
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = normalizeNames(x)
		}
		return out
	}
	return v
}

// matches reports whether row satisfies every filter.
func matches(row map[string]any, fs []filter) bool {
	for _, f := range fs {
		if !f.match(row) {
			return false
		}
	}
	return true
}

// value reads a field, computing the filter-only names verified and
// datacenter from verification and hosting_type.
func value(row map[string]any, field string) any {
	switch field {
	case "verified":
		return row["verification"] == "verified"
	case "datacenter":
		return row["hosting_type"] == float64(1)
	}
	return row[field]
}

func (f filter) match(row map[string]any) bool {
	v := value(row, f.field)
	if f.field == "geolocation" { // filters take country codes; rows say "Texas, US"
		if s, ok := v.(string); ok {
			if i := strings.LastIndex(s, ", "); i >= 0 {
				v = s[i+2:]
			}
		}
	}
	switch f.op {
	case "eq":
		return equal(v, f.value)
	case "neq":
		return !equal(v, f.value)
	case "in", "notin":
		found := false
		for _, x := range f.value.([]any) {
			found = found || equal(v, x)
		}
		return found == (f.op == "in")
	}
	c, ok := compare(v, f.value)
	if !ok {
		return false
	}
	switch f.op {
	case "gt":
		return c > 0
	case "gte":
		return c >= 0
	case "lt":
		return c < 0
	default: // lte
		return c <= 0
	}
}

// equal compares JSON values; null reads as false, booleans as 0/1.
func equal(a, b any) bool {
	if a == nil {
		a = false
	}
	if b == nil {
		b = false
	}
	if c, ok := compare(a, b); ok {
		return c == 0
	}
	return a == b
}

// compare orders two JSON values of the same kind.
func compare(a, b any) (int, bool) {
	num := func(x any) (float64, bool) {
		switch t := x.(type) {
		case float64:
			return t, true
		case bool:
			if t {
				return 1, true
			}
			return 0, true
		}
		return 0, false
	}
	if x, ok := num(a); ok {
		if y, ok := num(b); ok {
			switch {
			case x < y:
				return -1, true
			case x > y:
				return 1, true
			}
			return 0, true
		}
	}
	if x, ok := a.(string); ok {
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), true
		}
	}
	return 0, false
}

// orderKey is one [field, "asc"|"desc"] pair.
type orderKey struct {
	field string
	desc  bool
}

// parseOrder reads [[field, dir], ...], tolerating one bare pair.
func parseOrder(v any) ([]orderKey, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("order must be a list of [field, direction] pairs")
	}
	if len(list) == 2 {
		if _, ok := list[0].(string); ok {
			list = []any{list}
		}
	}
	var out []orderKey
	for _, p := range list {
		pair, ok := p.([]any)
		if !ok || len(pair) == 0 {
			return nil, fmt.Errorf("order must be a list of [field, direction] pairs")
		}
		f, _ := pair[0].(string)
		if a, ok := fieldAliases[f]; ok {
			f = a
		}
		dir := "asc"
		if len(pair) > 1 {
			dir, _ = pair[1].(string)
		}
		out = append(out, orderKey{f, strings.EqualFold(dir, "desc")})
	}
	return out, nil
}

// sortRows orders rows by keys, missing values last.
func sortRows(rows []map[string]any, keys []orderKey) {
	sort.SliceStable(rows, func(i, j int) bool {
		for _, k := range keys {
			a, b := rows[i][k.field], rows[j][k.field]
			if a == nil || b == nil {
				if (a == nil) != (b == nil) {
					return b == nil
				}
				continue
			}
			c, ok := compare(a, b)
			if !ok || c == 0 {
				continue
			}
			return (c < 0) != k.desc
		}
		return false
	})
}

// toRow turns a value into a generic JSON object.
func toRow(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

// offerFields is the set of filterable offer fields.
var offerFields = func() map[string]bool {
	m := map[string]bool{"verified": true, "datacenter": true, "flops_per_dphtotal": true,
		"cluster_id": true, "vms_enabled": true, "has_avx": true, "pci_gen": true, "pcie_bw": true,
		"ubuntu_version": true, "verification": true, "bw_nvlink": true, "cpu_ghz": true,
		"gpu_display_active": true, "gpu_max_power": true, "gpu_max_temp": true,
		"inet_down_cost": true, "inet_up_cost": true, "mobo_name": true}
	for k := range toRow(Offer{}) {
		m[k] = true
	}
	return m
}()

// searchOffers answers POST /api/v0/bundles/ (and the legacy GET ?q=).
func (s *Server) searchOffers(w http.ResponseWriter, r *http.Request, body []byte) {
	var q map[string]any
	if r.Method == http.MethodGet {
		body = []byte(r.URL.Query().Get("q"))
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		q = map[string]any{}
	} else if err := json.Unmarshal(body, &q); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "Invalid json body")
		return
	}
	fs, err := parseFilters(q, func(f string) bool { return offerFields[f] })
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	order := []orderKey{{"score", true}}
	if v, ok := q["order"]; ok {
		if order, err = parseOrder(v); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
			return
		}
	}
	switch t, _ := q["type"].(string); t {
	case "", "on-demand", "ondemand", "bid", "reserved", "interruptible":
	default:
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("invalid type %q", t))
		return
	}
	limit := 64
	if l, ok := q["limit"].(float64); ok && l > 0 {
		limit = int(l)
	}
	storage := 5.0
	if st, ok := q["allocated_storage"].(float64); ok && st > 0 {
		storage = st
	}
	s.mu.Lock()
	rows := make([]map[string]any, 0, len(s.offers))
	for _, id := range s.offerIDs() {
		o := s.offers[id]
		if o.Rented {
			continue
		}
		row := toRow(o.priced(storage))
		if matches(row, fs) {
			rows = append(rows, row)
		}
	}
	s.mu.Unlock()
	sortRows(rows, order)
	if len(rows) > limit {
		rows = rows[:limit]
	}
	writeJSON(w, http.StatusOK, map[string]any{"offers": rows})
}
