package main

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/guardrails"
)

// FuzzWindowSpec feeds window specs ("60m=50", "24h=1000", lists as in
// GPUPROXY_LIMITS) to parseWindowFlags and the config path. It never
// panics; what it accepts has a unit (a bare number is refused), validates, has limits that ParseUSD reads the
// same way, renders back to an equal spec, and loads identically through
// GPUPROXY_LIMITS (whose windows used to pass through a float).
func FuzzWindowSpec(f *testing.F) {
	for _, s := range []string{"60m=50", "24h=1000", "1440=1000", "7d=5", "60m=50,24h=1000", "1h30m=0.000001",
		"60m=1.1234567", "60m=1e2", "60m=-1", "0=5", "60m", "=5", "60m=5,1h=6", "61s=5", "+60=5",
		"60m=999999999.999999", "60m=1000000000.000001", " 60m=5 ", "60m= 5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ws, err := parseWindowFlags([]string{s})
		if err == nil {
			if len(ws) != 1 {
				t.Fatalf("%q: %d windows from one spec", s, len(ws))
			}
			if verr := guardrails.ValidateWindows(ws); verr != nil {
				t.Fatalf("%q accepted but does not validate: %v", s, verr)
			}
			if w, _, _ := strings.Cut(strings.TrimSpace(s), "="); strings.Trim(w, "0123456789") == "" {
				t.Fatalf("%q accepted a window without a unit", s)
			}
			_, lim, _ := strings.Cut(strings.TrimSpace(s), "=")
			if m, perr := gpuproxy.ParseUSD(lim); perr != nil || m != ws[0].Limit {
				t.Fatalf("%q: limit %d, ParseUSD(%q) = %d, %v", s, ws[0].Limit, lim, m, perr)
			}
			back, err := parseWindowFlags([]string{strconv.Itoa(ws[0].Minutes) + "m=" + ws[0].Limit.String()})
			if err != nil || !reflect.DeepEqual(back, ws) {
				t.Fatalf("%q: %v rendered back parses as %v, %v", s, ws, back, err)
			}
		}

		// The same text as GPUPROXY_LIMITS: a comma-separated list.
		if s == "" {
			return // an empty variable is unset
		}
		list, lerr := parseWindowFlags(strings.Split(s, ","))
		c, err := loadConfig("", func(k string) string {
			if k == "GPUPROXY_LIMITS" {
				return s
			}
			return ""
		})
		if (err == nil) != (lerr == nil) {
			t.Fatalf("GPUPROXY_LIMITS=%q: config %v, parseWindowFlags %v", s, err, lerr)
		}
		if err != nil {
			return
		}
		got, err := c.windows()
		if err != nil || !reflect.DeepEqual(got, list) {
			t.Fatalf("GPUPROXY_LIMITS=%q: windows %v, %v; parseWindowFlags %v", s, got, err, list)
		}
	})
}
