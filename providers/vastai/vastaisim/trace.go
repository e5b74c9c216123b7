package vastaisim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// TraceKind is what a trace event changes.
type TraceKind string

// Trace event kinds.
const (
	// TraceHazard sets the preemption rate per hour (Market.Hazard) of a
	// GPU model, or of every model when GPU is empty.
	TraceHazard TraceKind = "hazard"
	// TracePrice sets the level of on-demand prices of a model (or all) as
	// a multiple of their list prices; the walk goes on around it.
	TracePrice TraceKind = "price"
	// TraceBid sets the level of minimum bids likewise.
	TraceBid TraceKind = "bid"
	// TraceSupply sets how many single-GPU offers of a model (or of every
	// model) stay listed (Market.MinSingles).
	TraceSupply TraceKind = "supply"
	// TraceHosts sets how many hosts per hour leave and arrive
	// (Market.HostRate).
	TraceHosts TraceKind = "hosts"
	// TracePreempt rents, on demand, the machine of every one of our
	// interruptible instances of a model (or of all) for Value seconds (0:
	// Market.Hold): a preemption wave.
	TracePreempt TraceKind = "preempt"
)

// TraceEvent is one scheduled change of the market. In a trace file it is
// one JSON object per line, e.g.
//
//	{"at":"90s","kind":"preempt","gpu":"RTX 4090","value":120}
//
// with at a Go duration ("90s", "1h30m") or a number of seconds since the
// simulator started.
type TraceEvent struct {
	At    time.Duration
	Kind  TraceKind
	GPU   string // gpu_name as on the wire ("RTX 4090"); empty: every model
	Value float64
}

// UnmarshalJSON reads an event with at as a duration string or seconds.
func (e *TraceEvent) UnmarshalJSON(b []byte) error {
	var raw struct {
		At    json.RawMessage `json:"at"`
		Kind  TraceKind       `json:"kind"`
		GPU   string          `json:"gpu"`
		Value float64         `json:"value"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	var at time.Duration
	var str string
	var secs float64
	switch {
	case json.Unmarshal(raw.At, &str) == nil:
		d, err := time.ParseDuration(str)
		if err != nil {
			return fmt.Errorf("at: %w", err)
		}
		at = d
	case json.Unmarshal(raw.At, &secs) == nil:
		at = time.Duration(secs * float64(time.Second))
	default:
		return fmt.Errorf("at: a duration (\"90s\") or seconds expected")
	}
	*e = TraceEvent{At: at, Kind: raw.Kind, GPU: raw.GPU, Value: raw.Value}
	return nil
}

// MarshalJSON writes an event as a trace file line holds it.
func (e TraceEvent) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"at": e.At.String(), "kind": e.Kind, "gpu": e.GPU, "value": e.Value})
}

// validate checks an event's kind and value.
func (e TraceEvent) validate() error {
	if e.At < 0 {
		return fmt.Errorf("at must not be negative, got %v", e.At)
	}
	if math.IsNaN(e.Value) || math.IsInf(e.Value, 0) || e.Value < 0 {
		return fmt.Errorf("value must be a number of 0 or more, got %v", e.Value)
	}
	switch e.Kind {
	case TraceHazard, TraceHosts, TracePreempt:
	case TracePrice, TraceBid:
		if e.Value == 0 {
			return fmt.Errorf("a %s level must be above 0", e.Kind)
		}
	case TraceSupply:
		if e.Value != math.Trunc(e.Value) {
			return fmt.Errorf("supply must be a whole number of offers, got %v", e.Value)
		}
	default:
		return fmt.Errorf("kind must be hazard, price, bid, supply, hosts or preempt, got %q", e.Kind)
	}
	return nil
}

// ParseTrace reads a trace file: one JSON event per line; blank lines and
// lines starting with # are skipped. Errors name the line.
func ParseTrace(r io.Reader) ([]TraceEvent, error) {
	var out []TraceEvent
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var e TraceEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", n, err)
		}
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading trace: %w", err)
	}
	return out, nil
}

// applyTrace applies one event at time t; s.mu must be held.
func (s *Server) applyTrace(e TraceEvent, t time.Time) {
	ms := s.mkt
	switch e.Kind {
	case TraceHazard:
		ms.hazard[e.GPU] = e.Value
	case TracePrice, TraceBid:
		lv := ms.levelOf(e.GPU)
		if e.Kind == TracePrice {
			lv[0] = e.Value
		} else {
			lv[1] = e.Value
		}
		ms.level[e.GPU] = lv
	case TraceSupply:
		ms.floor[e.GPU] = int(e.Value)
	case TraceHosts:
		ms.m.HostRate = e.Value
	case TracePreempt:
		hold := time.Duration(e.Value * float64(time.Second))
		if hold <= 0 {
			hold = ms.m.Hold
		}
		for _, in := range s.sortedInstances() {
			if in.destroyed || !in.isBid || (e.GPU != "" && in.offer.GPUName != e.GPU) {
				continue
			}
			ms.claims[in.offer.MachineID] = claim{until: t.Add(hold), onDemand: true}
		}
	}
}
