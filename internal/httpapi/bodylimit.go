package httpapi

import (
	"strconv"
	"strings"
)

// BodyLimitMessage is the one message for a request body (or message)
// over a limit of n bytes, with the configured limit in a human size:
// "request body is larger than the limit of 1 MiB". Every transport's
// body-limit refusal prints it, so the figure is the one in force.
func BodyLimitMessage(n int64) string {
	return "request body is larger than the limit of " + HumanBytes(n)
}

// HumanBytes writes n bytes in binary units when that is exact with at
// most two decimals ("1 MiB", "512 KiB", "1.5 MiB"), otherwise in bytes
// ("100 bytes", "1048577 bytes"): a limit is never shown rounded.
func HumanBytes(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	if n < 1024 {
		if n == 1 {
			return "1 byte"
		}
		return strconv.FormatInt(n, 10) + " bytes"
	}
	div, i := int64(1024), 0
	for i < len(units)-1 && n >= div*1024 {
		div *= 1024
		i++
	}
	if n%div == 0 {
		return strconv.FormatInt(n/div, 10) + " " + units[i]
	}
	if (n%div)*100%div != 0 {
		return strconv.FormatInt(n, 10) + " bytes"
	}
	s := strconv.FormatFloat(float64(n)/float64(div), 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " " + units[i]
}
