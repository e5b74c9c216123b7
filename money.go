package gpuproxy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Micros is an amount of money in micro-dollars (1 USD = 1,000,000 Micros).
// All sums and stored amounts use it; float64 appears only at the edges, when
// parsing user input or rendering JSON.
type Micros int64

// MicrosPerUSD is the number of micro-dollars in one US dollar.
const MicrosPerUSD = 1_000_000

// MaxMicros bounds any single amount accepted from a caller ($1 billion).
const MaxMicros Micros = 1_000_000_000 * MicrosPerUSD

// USD returns m as a float64 dollar value, for display only.
func (m Micros) USD() float64 { return float64(m) / MicrosPerUSD }

// String renders m as a dollar decimal with up to six places, e.g. "12.5".
func (m Micros) String() string {
	neg := m < 0
	u := uint64(m)
	if neg {
		u = uint64(-m)
	}
	whole, frac := u/MicrosPerUSD, u%MicrosPerUSD
	s := strconv.FormatUint(whole, 10)
	if frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}

// MarshalJSON renders m as a JSON number of dollars, exact to six places.
func (m Micros) MarshalJSON() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalJSON reads a JSON number of dollars; strings, booleans and null
// are refused.
func (m *Micros) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "" || !(s[0] == '-' || s[0] >= '0' && s[0] <= '9') {
		return fmt.Errorf("must be a number of US dollars")
	}
	v, err := ParseUSD(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ParseUSD parses a decimal dollar amount ("12", "0.25", "1e2") exactly when
// it has at most six decimal places, rounding half away from zero otherwise.
func ParseUSD(s string) (Micros, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty amount")
	}
	if !strings.ContainsAny(s, "eE") {
		neg := strings.HasPrefix(s, "-")
		t := strings.TrimLeft(s, "+-")
		whole, frac, _ := strings.Cut(t, ".")
		if whole == "" {
			whole = "0"
		}
		if isDigits(whole) && (frac == "" || isDigits(frac)) && len(whole) <= 12 {
			w, _ := strconv.ParseInt(whole, 10, 64)
			var f int64
			round := false
			if len(frac) > 6 {
				round = frac[6] >= '5'
				frac = frac[:6]
			}
			if frac != "" {
				f, _ = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
			}
			v := w*MicrosPerUSD + f
			if round {
				v++
			}
			if neg {
				v = -v
			}
			return Micros(v), nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number: %q", s)
	}
	return FromUSD(f)
}

// FromUSD converts a float dollar amount to Micros, rounding to the nearest
// micro-dollar. It refuses NaN, infinities and amounts beyond MaxMicros.
func FromUSD(f float64) (Micros, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("not a finite number")
	}
	v := math.Round(f * MicrosPerUSD)
	if math.Abs(v) > float64(MaxMicros) {
		return 0, fmt.Errorf("amount out of range")
	}
	return Micros(v), nil
}

// MulMillis returns the cost of running at price m per hour for ms
// milliseconds, rounded down to the micro-dollar. Whole hours are multiplied
// separately so long durations cannot overflow.
func (m Micros) MulMillis(ms int64) Micros {
	const hour = 3_600_000
	return m*Micros(ms/hour) + m*Micros(ms%hour)/hour
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
