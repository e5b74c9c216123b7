package ionetsim

import (
	"encoding/json"
	"math"
	"net/http"

	"github.com/aiserve/gpuproxy"
)

// This file serves the catalog routes: hardware, availability and price.

// findHardware returns the catalog entry with id. The caller holds s.mu.
func (s *Server) findHardware(id int) *Hardware {
	for i := range s.hw {
		if s.hw[i].ID == id {
			return &s.hw[i]
		}
	}
	return nil
}

// stockOf returns h's stock at a location, nil when it has none there.
func stockOf(h *Hardware, location int) *Stock {
	for i := range h.Stock {
		if h.Stock[i].LocationID == location {
			return &h.Stock[i]
		}
	}
	return nil
}

// replicasOf is how many containers of qty GPUs fit in st.
func replicasOf(h *Hardware, st *Stock, qty int) int {
	if st == nil || qty < 1 || qty > h.MaxGPUsPerContainer {
		return 0
	}
	return st.FreeGPUs / qty
}

type hardwareJSON struct {
	HardwareID          int             `json:"hardware_id"`
	HardwareName        string          `json:"hardware_name"`
	BrandName           string          `json:"brand_name"`
	MaxGPUsPerContainer int             `json:"max_gpus_per_container"`
	Available           int             `json:"available"`
	Price               gpuproxy.Micros `json:"price"`
}

// hardware serves GET caas/hardware/max-gpus-per-container?node_pool_id=.
// available is the free GPUs over all locations; max_gpus_per_container is
// the largest container that fits somewhere right now. The simulator has
// no private node pools: a node_pool_id lists nothing.
func (s *Server) hardware(w http.ResponseWriter, r *http.Request) {
	var v validator
	pool := v.queryUUID(r.URL.Query(), "node_pool_id")
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	s.mu.Lock()
	s.advance()
	s.takePending() // a new search begins: earlier listings may be gone
	listed := s.hw
	if pool != "" {
		listed = nil
	}
	out := []hardwareJSON{}
	total := 0
	for i := range listed {
		h := &listed[i]
		free, most := 0, 0
		for _, st := range h.Stock {
			free += st.FreeGPUs
			most = max(most, st.FreeGPUs)
		}
		total += free
		out = append(out, hardwareJSON{HardwareID: h.ID, HardwareName: h.Name, BrandName: h.Brand,
			MaxGPUsPerContainer: min(h.MaxGPUsPerContainer, most), Available: free, Price: h.PricePerGPUHour})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{"hardware": out, "total": total}})
}

type locationJSON struct {
	ID                int    `json:"id"`
	ISO2              string `json:"iso2"`
	Name              string `json:"name"`
	AvailableReplicas int    `json:"available_replicas"`
}

// availableReplicas serves GET
// caas/available-replicas?hardware_id=&hardware_qty=&node_pool_id=; a node
// pool (the simulator has none) lists no location.
func (s *Server) availableReplicas(w http.ResponseWriter, r *http.Request) {
	var v validator
	q := r.URL.Query()
	id := v.queryInt(q, "hardware_id", true, 0, noMin, 0)
	qty := v.queryInt(q, "hardware_qty", true, 0, 1, 0)
	pool := v.queryUUID(q, "node_pool_id")
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	h := s.findHardware(id)
	if h == nil {
		writeDetail(w, http.StatusNotFound, "Hardware %d not found", id)
		return
	}
	out := []locationJSON{}
	if pool == "" {
		for i := range h.Stock {
			st := &h.Stock[i]
			out = append(out, locationJSON{ID: st.LocationID, ISO2: st.ISO2, Name: st.Name,
				AvailableReplicas: replicasOf(h, st, qty)})
		}
	}
	s.churnListed(id, qty, out)
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
}

type priceJSON struct {
	ReplicaCount                 int             `json:"replica_count"`
	GPUsPerContainer             int             `json:"gpus_per_container"`
	AvailableReplicaCount        []int           `json:"available_replica_count"`
	Discount                     int             `json:"discount"`
	IONetFee                     gpuproxy.Micros `json:"ionet_fee"`
	IONetFeePercent              float64         `json:"ionet_fee_percent"`
	CurrencyConversionFee        gpuproxy.Micros `json:"currency_conversion_fee"`
	CurrencyConversionFeePercent float64         `json:"currency_conversion_fee_percent"`
	TotalCostUSDC                gpuproxy.Micros `json:"total_cost_usdc"`
}

// cost is the prepaid price of a request: per-GPU-hour price × GPUs ×
// replicas × hours (fees are zero in the simulator).
func cost(h *Hardware, gpus, replicas, hours int) gpuproxy.Micros {
	return h.PricePerGPUHour * gpuproxy.Micros(gpus) * gpuproxy.Micros(replicas) * gpuproxy.Micros(hours)
}

// price serves GET caas/price. location_ids is a JSON array in a string.
func (s *Server) price(w http.ResponseWriter, r *http.Request) {
	var v validator
	q := r.URL.Query()
	if !q.Has("location_ids") {
		v.add("missing", loc("query", "location_ids"), "Field required", nil, nil)
	}
	// Unlike deploy, the price query bounds hours and GPUs only below.
	id := v.queryInt(q, "hardware_id", true, 0, noMin, 0)
	hours := v.queryInt(q, "duration_hours", true, 0, 1, 0)
	gpus := v.queryInt(q, "gpus_per_container", true, 0, 1, 0)
	replicas := v.queryInt(q, "replica_count", true, 0, 1, 0)
	if !v.ok() {
		write422(w, v.errs)
		return
	}
	var locs []int
	if err := json.Unmarshal([]byte(q.Get("location_ids")), &locs); err != nil || len(locs) == 0 {
		writeDetail(w, http.StatusBadRequest, "location_ids must be a JSON array of location ids, e.g. [1]")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	h := s.findHardware(id)
	if h == nil {
		writeDetail(w, http.StatusNotFound, "Hardware %d not found", id)
		return
	}
	if float64(h.PricePerGPUHour)*float64(gpus)*float64(replicas)*float64(hours) > math.MaxInt64/2 {
		writeDetail(w, http.StatusBadRequest, "The requested deployment is too large to price")
		return
	}
	avail := make([]int, len(locs))
	for i, l := range locs {
		avail[i] = replicasOf(h, stockOf(h, l), gpus)
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": priceJSON{
		ReplicaCount: replicas, GPUsPerContainer: gpus, AvailableReplicaCount: avail,
		IONetFeePercent: 0, CurrencyConversionFeePercent: 0,
		TotalCostUSDC: cost(h, gpus, replicas, hours),
	}})
}
