package vastaisim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
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

	// arrived marks an offer the market added (a refilled floor, an
	// arriving host): offer churn neither takes nor counts it.
	arrived bool
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

// asBid returns o, priced for storageGB, as a bid row: its GPU price is
// the current minimum bid.
func (o Offer) asBid(storageGB float64) Offer {
	o.DPHBase = o.MinBid
	o = o.priced(storageGB)
	o.IsBid = true
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
	// bidShare is min_bid over the on-demand price: vast.ai says
	// interruptible is "often 50%+ cheaper" ("saves 50-80%"); one public
	// example is an RTX 4090 at about $0.24/h on demand, min_bid $0.12/h.
	bidShare float64
}

var gpuSpecs = map[string]gpuSpec{
	"RTX 3080":  {"RTX 3080", 10240, 0.09, 860, 18, 29.8, 760, 0.45},
	"RTX 3090":  {"RTX 3090", 24576, 0.18, 860, 24, 35.6, 936, 0.45},
	"RTX 4090":  {"RTX 4090", 24564, 0.35, 890, 48, 82.6, 1008, 0.5},
	"RTX 5090":  {"RTX 5090", 32607, 0.62, 1200, 70, 104.8, 1792, 0.5},
	"RTX A5000": {"RTX A5000", 24564, 0.22, 860, 20, 27.8, 768, 0.45},
	"RTX A6000": {"RTX A6000", 49140, 0.45, 860, 30, 38.7, 768, 0.4},
	"L4":        {"L4", 23034, 0.30, 890, 20, 30.3, 300, 0.5},
	"L40S":      {"L40S", 46068, 0.85, 890, 55, 91.6, 864, 0.4},
	"A100 PCIE": {"A100 PCIE", 40960, 0.75, 800, 60, 19.5, 1555, 0.4},
	"A100 SXM4": {"A100 SXM4", 81920, 1.15, 800, 75, 19.5, 2039, 0.35},
	"H100 PCIE": {"H100 PCIE", 81559, 1.85, 900, 110, 51.2, 2000, 0.4},
	"H100 SXM":  {"H100 SXM", 81559, 2.20, 900, 140, 66.9, 3350, 0.35},
	"H200":      {"H200", 143771, 3.05, 900, 150, 66.9, 4800, 0.4},
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
			StorageCost: 0.15, MinBid: math.Round(g.perGPU*float64(r.n)*r.mult*g.bidShare*1e6) / 1e6,
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

// Defaults of a search that sets no limit or allocated_storage.
const (
	defaultSearchLimit   = 64
	defaultSearchStorage = 5.0 // GB, the CLI's default
)

// searchOffers answers POST /api/v0/bundles/ (and the legacy GET ?q=).
// With Options.OfferChurn, some of the offers it returns are taken by
// someone else right after (see churn).
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
	s.search(w, q)
}

// searchAsks answers PUT /api/v0/search/asks/, the search `vastai search
// offers --new` sends: {"select_cols":["*"],"q":{...}} with q the bundles
// query. The simulator returns every column whatever select_cols says.
func (s *Server) searchAsks(w http.ResponseWriter, _ *http.Request, body []byte, _ int64) {
	var req struct {
		SelectCols []string       `json:"select_cols"`
		Q          map[string]any `json:"q"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "Invalid json body")
		return
	}
	if req.Q == nil {
		req.Q = map[string]any{}
	}
	s.search(w, req.Q)
}

// search answers a bundles query. With type "bid" (or "interruptible")
// the rows are interruptible prices: is_bid true, dph_base and the
// search.gpuCostPerHour the offer's min_bid, dph_total that plus storage,
// so filters and order on dph_total see what a bid costs.
func (s *Server) search(w http.ResponseWriter, q map[string]any) {
	fs, err := parseFilters(q, isOfferField, offerKind)
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
	bid := false
	switch t, _ := q["type"].(string); t {
	case "", "on-demand", "ondemand", "reserved":
	case "bid", "interruptible":
		bid = true
	default:
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("invalid type %q", t))
		return
	}
	limit := defaultSearchLimit
	if l, ok := numberOf(q["limit"]); ok && l > 0 {
		limit = int(l)
	}
	storage := defaultSearchStorage
	if st, ok := numberOf(q["allocated_storage"]); ok && st > 0 {
		storage = st
	}
	s.mu.Lock()
	now := s.now()
	s.settleChurn(now)
	rows := make([]map[string]any, 0, len(s.offers))
	for _, id := range s.offerIDs() {
		if !s.listed(id) {
			continue
		}
		o := s.offers[id].priced(storage)
		if bid {
			o = o.asBid(storage)
		}
		row := toRow(o)
		if matches(row, fs) {
			rows = append(rows, row)
		}
	}
	sortRows(rows, order)
	if len(rows) > limit {
		rows = rows[:limit]
	}
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = int64(row["id"].(float64))
	}
	s.churn(ids, now)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"offers": rows})
}

// numberOf reads a JSON number, or a numeric string as the CLI sends.
func numberOf(v any) (float64, bool) {
	switch t := v.(type) {
	case float64:
		return t, true
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
		return f, err == nil && !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	return 0, false
}
