package ionet

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy/providers"
)

// offerID is what an io.net offer id encodes: everything deploy needs
// besides the image.
type offerID struct {
	Hardware hardwareID
	Location int
	GPUs     int
}

// String renders "<hardware_id>:<location_id>:<gpus>".
func (o offerID) String() string {
	return fmt.Sprintf("%s:%d:%d", o.Hardware, o.Location, o.GPUs)
}

// parseOfferID parses "<hardware_id>:<location_id>:<gpus>". The hardware id
// is everything before the last two colons, so string ids may contain any
// character.
func parseOfferID(s string) (offerID, error) {
	bad := fmt.Errorf("offer id %q is not <hardware_id>:<location_id>:<gpus>", s)
	j := strings.LastIndexByte(s, ':')
	if j < 0 {
		return offerID{}, bad
	}
	i := strings.LastIndexByte(s[:j], ':')
	if i <= 0 {
		return offerID{}, bad
	}
	loc, err1 := strconv.Atoi(s[i+1 : j])
	gpus, err2 := strconv.Atoi(s[j+1:])
	if err1 != nil || err2 != nil || loc < 0 || gpus < 1 || gpus > 8 {
		return offerID{}, bad
	}
	return offerID{Hardware: hardwareID(s[:i]), Location: loc, GPUs: gpus}, nil
}

// badOfferID is the error for an offer id that is not one of ours: the
// caller's input (400 naming offer_id), not an offer gone, and never
// sent to io.net.
func badOfferID(err error) error {
	return &providers.Error{Provider: providers.IONet, Kind: providers.KindInvalid, Field: "offer_id",
		Message: err.Error() + ": use an offer id from the offer search", Err: err}
}

// gpuCounts are the container sizes offered per hardware, besides its
// maximum: io.net accepts 1..8 GPUs per container.
var gpuCounts = []int{1, 2, 4, 8}

// countsFor returns the GPU counts to offer for hardware allowing at most
// maxGPUs per container, at least minGPUs.
func countsFor(maxGPUs, minGPUs int) []int {
	maxGPUs = min(maxGPUs, 8)
	var out []int
	for _, n := range gpuCounts {
		if n <= maxGPUs && n >= minGPUs {
			out = append(out, n)
		}
	}
	if maxGPUs >= minGPUs && maxGPUs > 0 && (len(out) == 0 || out[len(out)-1] != maxGPUs) {
		out = append(out, maxGPUs)
	}
	return out
}

var vramInName = regexp.MustCompile(`(?i)\b(\d{1,3})\s*gi?b\b`)

// knownVRAM is GB per GPU for models whose name does not carry it. The CaaS
// hardware list has no VRAM field, so this is the adapter's only source.
// Longer keys are matched first.
var knownVRAM = []struct {
	model string
	gb    float64
}{
	{"rtx 6000 ada", 48}, {"rtx a6000", 48}, {"a6000", 48}, {"rtx a5000", 24},
	{"rtx a4000", 16}, {"rtx 5090", 32}, {"rtx 4090", 24}, {"rtx 4080", 16},
	{"rtx 3090", 24}, {"rtx 3080", 10}, {"l40s", 48}, {"l40", 48}, {"l4", 24},
	{"a40", 48}, {"a10g", 24}, {"a10", 24}, {"a100", 80}, {"h100 nvl", 94},
	{"h100", 80}, {"h200", 141}, {"gh200", 96}, {"b200", 192}, {"v100", 16},
	{"t4", 16}, {"mi300x", 192}, {"mi250", 128},
}

// vramGB returns GB per GPU for a hardware name, 0 when unknown: a size in
// the name ("A100-SXM4-40GB") wins over the model table.
func vramGB(name string) float64 {
	if m := vramInName.FindStringSubmatch(name); m != nil {
		if v, err := strconv.Atoi(m[1]); err == nil && v >= 4 {
			return float64(v)
		}
	}
	n := strings.ToLower(strings.NewReplacer("-", " ", "_", " ").Replace(name))
	for _, k := range knownVRAM {
		if containsWord(n, k.model) {
			return k.gb
		}
	}
	return 0
}

// containsWord reports whether key occurs in s bounded by non-alphanumerics,
// so "l4" does not match "l40s".
func containsWord(s, key string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], key)
		if j < 0 {
			return false
		}
		a, b := i+j, i+j+len(key)
		if (a == 0 || !isAlnum(s[a-1])) && (b == len(s) || !isAlnum(s[b])) {
			return true
		}
		i = a + 1
	}
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// mapStatus normalizes an io.net status. Values are compared
// case-insensitively with "_" and runs of spaces treated alike; unknown
// values count as starting (pending), as the notes advise.
func mapStatus(s string) providers.Status {
	s = strings.Join(strings.Fields(strings.ToLower(strings.ReplaceAll(s, "_", " "))), " ")
	switch s {
	case "running":
		return providers.StatusRunning
	case "failed":
		return providers.StatusFailed
	case "termination requested":
		return providers.StatusTerminating
	case "completed", "destroyed", "terminated":
		return providers.StatusTerminated
	default: // "deployment requested", "deploying", "unpaid", unknown
		return providers.StatusStarting
	}
}

// isDestroyed reports statuses after which the deployment no longer exists.
func isDestroyed(s string) bool {
	s = strings.ToLower(strings.TrimSpace(s))
	return s == "destroyed" || s == "terminated"
}
