package vastai

import (
	"bytes"
	"encoding/json"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/providers"
)

// number is a tolerant JSON number: it accepts a number, a numeric string, a
// boolean (1/0) or null. vast.ai rows mix these freely.
type number struct {
	v  float64
	ok bool
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *number) UnmarshalJSON(b []byte) error {
	*n = number{}
	s := string(bytes.TrimSpace(b))
	switch s {
	case "null", "":
		return nil
	case "true":
		*n = number{1, true}
		return nil
	case "false":
		*n = number{0, true}
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return nil
		}
		s = strings.TrimSpace(str)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return nil // unparseable values read as unknown, never fail a whole row
	}
	*n = number{f, true}
	return nil
}

// idValue is a tolerant JSON id: a number or a string, kept as a decimal
// string; "" when null or absent.
type idValue string

// UnmarshalJSON implements json.Unmarshaler.
func (id *idValue) UnmarshalJSON(b []byte) error {
	*id = ""
	s := string(bytes.TrimSpace(b))
	if s == "null" || s == "" {
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return nil
		}
		*id = idValue(strings.TrimSpace(str))
		return nil
	}
	if strings.ContainsAny(s, ".eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f != math.Trunc(f) {
			return nil
		}
		s = strconv.FormatFloat(f, 'f', 0, 64)
	}
	*id = idValue(s)
	return nil
}

// text is a tolerant JSON string: null and non-string values read as "".
type text string

// UnmarshalJSON implements json.Unmarshaler.
func (t *text) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*t = text(strings.TrimSpace(s))
	} else {
		*t = ""
	}
	return nil
}

// wireOffer is the subset of a bundles row the adapter reads.
type wireOffer struct {
	ID                idValue `json:"id"`
	AskContractID     idValue `json:"ask_contract_id"`
	GPUName           text    `json:"gpu_name"`
	NumGPUs           number  `json:"num_gpus"`
	GPURAM            number  `json:"gpu_ram"` // MB per GPU
	CPUCores          number  `json:"cpu_cores"`
	CPUCoresEffective number  `json:"cpu_cores_effective"`
	CPURAM            number  `json:"cpu_ram"` // MB
	DiskSpace         number  `json:"disk_space"`
	DPHTotal          number  `json:"dph_total"` // USD/hour, whole offer
	DPHBase           number  `json:"dph_base"`  // USD/hour, compute only
	StorageTotalCost  number  `json:"storage_total_cost"`
	MinBid            number  `json:"min_bid"` // USD/hour, compute only
	IsBid             number  `json:"is_bid"`
	MachineID         idValue `json:"machine_id"`
	Reliability       number  `json:"reliability"`
	Reliability2      number  `json:"reliability2"`
	Geolocation       text    `json:"geolocation"`
}

// offer normalizes a row; ok is false for rows without an id or a price.
func (w wireOffer) offer() (providers.Offer, bool) {
	id := string(w.ID)
	if id == "" {
		id = string(w.AskContractID)
	}
	if id == "" || !w.DPHTotal.ok || w.DPHTotal.v < 0 {
		return providers.Offer{}, false
	}
	price, err := gpuproxy.FromUSD(w.DPHTotal.v)
	if err != nil {
		return providers.Offer{}, false
	}
	rel := w.Reliability2
	if !rel.ok {
		rel = w.Reliability
	}
	cores := w.CPUCoresEffective
	if !cores.ok || cores.v <= 0 {
		cores = w.CPUCores
	}
	o := providers.Offer{
		Provider:      providers.VastAI,
		ID:            id,
		GPUName:       string(w.GPUName),
		NumGPUs:       int(w.NumGPUs.v),
		VRAMGB:        mbToGB(w.GPURAM.v),
		PricePerHour:  price,
		Location:      string(w.Geolocation),
		Reliability:   clamp01(rel.v),
		CPUCores:      cores.v,
		RAMGB:         mbToGB(w.CPURAM.v),
		DiskGB:        math.Round(w.DiskSpace.v*1000) / 1000,
		Billing:       providers.BillingHourly,
		Machine:       string(w.MachineID),
		Interruptible: w.IsBid.ok && w.IsBid.v != 0,
	}
	o.StoragePerHour = w.storagePerHour(price)
	if w.MinBid.ok && w.MinBid.v > 0 {
		o.MinBid, _ = gpuproxy.FromUSD(w.MinBid.v)
	}
	return o, true
}

// storagePerHour is the disk's share of dph_total: storage_total_cost
// when the row has it, else dph_total − dph_base (never negative, never
// over the total).
func (w wireOffer) storagePerHour(total gpuproxy.Micros) gpuproxy.Micros {
	var st gpuproxy.Micros
	switch {
	case w.StorageTotalCost.ok:
		st, _ = gpuproxy.FromUSD(math.Max(w.StorageTotalCost.v, 0))
	case w.DPHBase.ok:
		base, _ := gpuproxy.FromUSD(math.Max(w.DPHBase.v, 0))
		st = total - base
	}
	return min(max(st, 0), total)
}

// mbToGB converts vast.ai MB to decimal GB (24564 → 24.564), as the CLI does.
func mbToGB(mb float64) float64 { return math.Round(mb) / 1000 }

// gbToMB converts decimal GB to vast.ai MB for filters (24 → 24000).
func gbToMB(gb float64) int64 { return int64(math.Round(gb * 1000)) }

func clamp01(f float64) float64 { return math.Max(0, math.Min(1, f)) }

// wireInstance is the subset of an instance object the adapter reads.
type wireInstance struct {
	ID             idValue         `json:"id"`
	ActualStatus   text            `json:"actual_status"`
	IntendedStatus text            `json:"intended_status"`
	CurState       text            `json:"cur_state"`
	Label          text            `json:"label"`
	GPUName        text            `json:"gpu_name"`
	NumGPUs        number          `json:"num_gpus"`
	DPHTotal       number          `json:"dph_total"`
	PublicIPAddr   text            `json:"public_ipaddr"`
	Ports          json.RawMessage `json:"ports"`
	ExtraEnv       json.RawMessage `json:"extra_env"`
	StartDate      number          `json:"start_date"` // unix seconds
	StatusMsg      text            `json:"status_msg"`
	IsBid          number          `json:"is_bid"`
}

// instance normalizes an instance object.
func (w wireInstance) instance() providers.Instance {
	in := providers.Instance{
		ProviderID: string(w.ID),
		Tag:        string(w.Label),
		Status:     mapStatus(string(w.ActualStatus), string(w.IntendedStatus), string(w.CurState)),
		GPUName:    string(w.GPUName),
		NumGPUs:    int(w.NumGPUs.v),
		StatusMsg:  string(w.StatusMsg),

		Interruptible: w.IsBid.ok && w.IsBid.v != 0,
	}
	if w.DPHTotal.ok {
		in.PricePerHour, _ = gpuproxy.FromUSD(w.DPHTotal.v)
	}
	in.StartedAt = unixTime(w.StartDate)
	if host := string(w.PublicIPAddr); host != "" {
		if port := pickPort(w.Ports, declaredPorts(w.ExtraEnv)); port != "" {
			in.Endpoint = "http://" + net.JoinHostPort(host, port)
		}
	}
	return in
}

// mapStatus maps actual_status (and intended_status, cur_state) to a
// normalized status.
//
// null, "", loading, created, scheduling and rebooting are on their way to
// running. frozen (the container paused with its memory kept) maps to
// running: vast.ai bills its GPU time as it does a running instance's,
// so it must never read as stopped (which bills storage only). exited,
// unknown and offline never reach running again (vast.ai docs), so they
// map to failed: the instance still bills until destroyed, and callers
// should destroy it. A released contract (cur_state unloaded)
// is terminated. stopped while intended_status is still running is
// preempted: someone outranked the instance (a higher bid, an on-demand
// rental), vast.ai paused it, and it resumes by itself. Unrecognized
// values are treated as starting so that polling continues rather than
// tearing down a healthy instance.
func mapStatus(actual, intended, curState string) providers.Status {
	if strings.EqualFold(curState, "unloaded") {
		return providers.StatusTerminated
	}
	switch strings.ToLower(actual) {
	case "running", "frozen":
		return providers.StatusRunning
	case "stopped", "inactive":
		if strings.EqualFold(intended, "running") {
			return providers.StatusPreempted
		}
		return providers.StatusStopped
	case "exited", "unknown", "offline":
		return providers.StatusFailed
	case "destroyed", "deleted":
		return providers.StatusTerminated
	default: // null, loading, created, scheduling, rebooting, ...
		return providers.StatusStarting
	}
}

// hostBinding is one Docker port binding; HostPort is a string on the wire.
type hostBinding struct {
	HostIP   text `json:"HostIp"`
	HostPort text `json:"HostPort"`
}

// pickPort returns the host port of the inference service: 8000/tcp when
// mapped, else the first declared container port with a mapping, else the
// lowest mapped TCP port other than SSH. It returns "" when none is mapped
// (or ports has the int-array form some docs show).
func pickPort(raw json.RawMessage, declared []int) string {
	var ports map[string][]hostBinding
	if len(raw) == 0 || json.Unmarshal(raw, &ports) != nil {
		return ""
	}
	hostPort := func(key string) string {
		for _, b := range ports[key] {
			if p := string(b.HostPort); validPort(p) {
				return p
			}
		}
		return ""
	}
	if p := hostPort("8000/tcp"); p != "" {
		return p
	}
	for _, c := range declared {
		if p := hostPort(strconv.Itoa(c) + "/tcp"); p != "" {
			return p
		}
	}
	var keys []int
	for k := range ports {
		num, proto, _ := strings.Cut(k, "/")
		n, err := strconv.Atoi(num)
		if err != nil || (proto != "" && proto != "tcp") || n == 22 {
			continue
		}
		keys = append(keys, n)
	}
	sort.Ints(keys)
	for _, k := range keys {
		if p := hostPort(strconv.Itoa(k) + "/tcp"); p != "" {
			return p
		}
		if p := hostPort(strconv.Itoa(k)); p != "" {
			return p
		}
	}
	return ""
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536
}

// declaredPorts reads the container ports of "-p H:C" keys from extra_env,
// which is a list of [key, value] pairs (or, tolerated, an object).
func declaredPorts(raw json.RawMessage) []int {
	var keys []string
	var pairs [][]any
	var obj map[string]any
	switch {
	case len(raw) == 0:
		return nil
	case json.Unmarshal(raw, &pairs) == nil:
		for _, p := range pairs {
			if len(p) > 0 {
				if k, ok := p[0].(string); ok {
					keys = append(keys, k)
				}
			}
		}
	case json.Unmarshal(raw, &obj) == nil:
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
	}
	var out []int
	for _, k := range keys {
		f := strings.Fields(k)
		if len(f) != 2 || f[0] != "-p" {
			continue
		}
		m := f[1]
		if strings.HasSuffix(m, "/udp") {
			continue
		}
		m = strings.TrimSuffix(m, "/tcp")
		if i := strings.LastIndex(m, ":"); i >= 0 {
			m = m[i+1:]
		}
		if n, err := strconv.Atoi(m); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// knownGPUNames are vast.ai gpu_name values, used to expand a substring such
// as "4090" into an `in` filter the server understands (it only matches
// whole names).
var knownGPUNames = []string{
	"A10", "A10g", "A100 PCIE", "A100 SXM4", "A100X", "A40", "A800 PCIE",
	"B200", "GH200 SXM", "GTX 1080 Ti", "H100 NVL", "H100 PCIE", "H100 SXM",
	"H200", "H200 NVL", "L4", "L40", "L40S", "Q RTX 6000", "Q RTX 8000",
	"RTX 2080 Ti", "RTX 3060", "RTX 3070", "RTX 3080", "RTX 3080 Ti",
	"RTX 3090", "RTX 3090 Ti", "RTX 4060 Ti", "RTX 4070", "RTX 4070S",
	"RTX 4070 Ti", "RTX 4080", "RTX 4080S", "RTX 4090", "RTX 4090D",
	"RTX 5060 Ti", "RTX 5070", "RTX 5070 Ti", "RTX 5080", "RTX 5090",
	"RTX 4000Ada", "RTX 5000Ada", "RTX 6000Ada", "RTX A2000", "RTX A4000",
	"RTX A4500", "RTX A5000", "RTX A6000", "RTX PRO 6000 WS", "RTX PRO 6000 S",
	"Tesla P100", "Tesla T4", "Tesla V100", "MI300X",
}

// normalizeGPUName turns CLI spelling (RTX_4090) into wire spelling (RTX 4090).
func normalizeGPUName(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "_", " ")), " ")
}

// gpuNameCandidates lists the wire names matching the case-insensitive
// substring q, plus q itself so unknown exact names still match.
func gpuNameCandidates(q string) []string {
	norm := normalizeGPUName(q)
	low := strings.ToLower(norm)
	var out []string
	self := false
	for _, n := range knownGPUNames {
		if strings.Contains(strings.ToLower(n), low) {
			out = append(out, n)
			self = self || n == norm
		}
	}
	if !self {
		out = append(out, norm)
	}
	return out
}
