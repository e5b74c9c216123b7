package alerts

import (
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"net/url"
	"strings"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/netpolicy"
)

// DefaultThresholds are 50%, 80% and 100% of each window's limit.
var DefaultThresholds = []gpuproxy.AlertThreshold{500_000, 800_000, 1_000_000}

// MaxThresholds is the most thresholds an account may set.
const MaxThresholds = 10

// maxThreshold is 10 (1000%) of a limit.
const maxThreshold = 10 * gpuproxy.AlertThresholdOne

// ParseThresholds validates fractions of a limit (0.8 is 80%): 1 to
// MaxThresholds of them, each in (0, 10] with at most 6 decimal places,
// ascending without repeats. Nil gives DefaultThresholds. Errors name the
// offending field ("thresholds[2]").
func ParseThresholds(fs []float64) ([]gpuproxy.AlertThreshold, error) {
	if fs == nil {
		return append([]gpuproxy.AlertThreshold(nil), DefaultThresholds...), nil
	}
	if len(fs) == 0 || len(fs) > MaxThresholds {
		return nil, gpuproxy.Invalid("thresholds", "must list 1 to %d fractions of the limit, e.g. [0.5, 0.8, 1]", MaxThresholds)
	}
	out := make([]gpuproxy.AlertThreshold, 0, len(fs))
	for i, f := range fs {
		field := fmt.Sprintf("thresholds[%d]", i)
		if math.IsNaN(f) || f <= 0 || f > maxThreshold.Fraction() {
			return nil, gpuproxy.Invalid(field, "must be greater than 0 and at most 10 (a fraction of the limit: 0.8 is 80%%)")
		}
		ppm := math.Round(f * 1e6)
		if math.Abs(f*1e6-ppm) > 1e-3 {
			return nil, gpuproxy.Invalid(field, "must have at most 6 decimal places")
		}
		t := gpuproxy.AlertThreshold(ppm)
		if i > 0 && t <= out[i-1] {
			return nil, gpuproxy.Invalid(field, "thresholds must be sorted ascending without repeats")
		}
		out = append(out, t)
	}
	return out, nil
}

// Reached reports whether level (spent + held + committed) is at or above
// threshold t of limit. Nothing spent reaches no threshold; any spend
// reaches every threshold of a zero limit. Exact: the products are
// compared in 128 bits.
func Reached(level, limit gpuproxy.Micros, t gpuproxy.AlertThreshold) bool {
	if level <= 0 {
		return false
	}
	if limit <= 0 {
		return true
	}
	// level × 10⁶ ≥ limit × t
	lh, ll := bits.Mul64(uint64(level), uint64(gpuproxy.AlertThresholdOne))
	rh, rl := bits.Mul64(uint64(limit), uint64(t))
	return lh > rh || lh == rh && ll >= rl
}

// maxURL bounds a webhook URL's length.
const maxURL = 2048

// ValidateWebhookURL checks a webhook URL: http or https, a host, no
// credentials, at most 2048 characters; a literal address (or localhost)
// must pass the address policy of allow. Names are checked when dialed.
// Errors name the field "webhook_url".
func ValidateWebhookURL(raw string, allow netpolicy.Allowlist) error {
	const field = "webhook_url"
	if raw == "" {
		return gpuproxy.Invalid(field, "is required")
	}
	if len(raw) > maxURL {
		return gpuproxy.Invalid(field, "must be at most %d characters", maxURL)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return gpuproxy.Invalid(field, "is not a valid URL")
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return gpuproxy.Invalid(field, "must be an http or https URL")
	}
	if u.Hostname() == "" {
		return gpuproxy.Invalid(field, "must name a host")
	}
	if u.User != nil {
		return gpuproxy.Invalid(field, "must not carry credentials (user:password@)")
	}
	if u.Fragment != "" {
		return gpuproxy.Invalid(field, "must not have a fragment (#…)")
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	var ip netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		ip = a
	} else if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		ip = netip.MustParseAddr("127.0.0.1")
	}
	if ip.IsValid() {
		if c := allow.Refuses(ip); c == "metadata" {
			return gpuproxy.Invalid(field, "%s is a metadata address, which webhooks never reach", u.Hostname())
		} else if c != "" {
			return gpuproxy.Invalid(field, "%s is a %s address; webhooks reach public addresses only, "+
				"and networks listed in proxy.allow_networks", u.Hostname(), c)
		}
	}
	return nil
}
