package gpuproxy

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Micros is an amount of money in micro-dollars (1 USD = 1,000,000 Micros).
// All sums and stored amounts use it; float64 appears only at the edges,
// when rendering for display or reading a provider that sends floats.
type Micros int64

// MicrosPerUSD is the number of micro-dollars in one US dollar.
const MicrosPerUSD = 1_000_000

// MaxMicros bounds any single amount accepted from a caller ($1 billion).
const MaxMicros Micros = 1_000_000_000 * MicrosPerUSD

// Errors of ParseUSD, RoundUSD and FromUSD. Their text reads as the end of
// a sentence naming the field, e.g. gpuproxy.Invalid("amount", "%v", err).
var (
	// ErrUSDSyntax: the text is not an amount in ParseUSD's grammar.
	ErrUSDSyntax = errors.New("must be a decimal number of US dollars, e.g. 12.5")
	// ErrUSDPlaces: the amount is not a whole number of micro-dollars.
	ErrUSDPlaces = errors.New("must have at most 6 decimal places (a micro-dollar)")
	// ErrUSDRange: the amount is beyond ±MaxMicros.
	ErrUSDRange = errors.New(AmountRange(-MaxMicros, MaxMicros, false))
)

// AmountRange is the end of a sentence naming a field that says the range
// an amount must be in: "must be between $0 and $1,000,000,000", or with
// above (lo itself refused) "must be more than $0 and at most
// $1,000,000,000". Callers refusing an amount out of range say this, never
// that it is not a number.
func AmountRange(lo, hi Micros, above bool) string {
	if above {
		return "must be more than " + lo.Dollars() + " and at most " + hi.Dollars()
	}
	return "must be between " + lo.Dollars() + " and " + hi.Dollars()
}

// InvalidUSD is the invalid-input error for field whose text ParseUSD
// refused with err: the places rule, the range [lo, hi] (AmountRange) when
// the number is out of range, or else that it must be what (e.g. "a
// number of US dollars").
func InvalidUSD(field string, err error, lo, hi Micros, what string) error {
	switch {
	case errors.Is(err, ErrUSDPlaces):
		return Invalid(field, "%v", ErrUSDPlaces)
	case errors.Is(err, ErrUSDRange):
		return Invalid(field, "%s", AmountRange(lo, hi, false))
	}
	return Invalid(field, "must be %s, e.g. 12.5", what)
}

// Dollars renders m for people, with a dollar sign and thousands
// separators and every significant place: "$1,000,000,000", "-$5",
// "$0.000001", "$12.5".
func (m Micros) Dollars() string {
	s := m.String()
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	for i := range len(whole) {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(whole[i])
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	return sign + "$" + b.String()
}

// USD returns m as a float64 dollar value, for display only.
func (m Micros) USD() float64 { return float64(m) / MicrosPerUSD }

// String renders m as a dollar decimal with up to six places, e.g. "12.5".
func (m Micros) String() string {
	neg := m < 0
	u := uint64(m)
	if neg {
		u = -u
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

// UnmarshalJSON reads a JSON number of dollars under ParseUSD's rules
// (exponents such as 1e2 included, parsed exactly); strings, booleans and
// null are refused.
func (m *Micros) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || !(b[0] == '-' || b[0] >= '0' && b[0] <= '9') {
		return ErrUSDSyntax
	}
	v, err := ParseUSD(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ParseUSD parses a dollar amount exactly, with integer arithmetic only.
// The grammar is a JSON number made slightly friendlier for people:
//
//	amount   = [ "-" ] mantissa [ exponent ]
//	mantissa = digits [ "." [ digits ] ] | "." digits
//	exponent = ( "e" | "E" ) [ "+" | "-" ] digits
//
// so "5", "0.25", ".5", "5.", "-3", "1e2" and "25.0" are amounts and "",
// "-", ".", "+5", " 5", "1e", "NaN", "Inf" and "0x10" are not (ErrUSDSyntax).
// The value must be a whole number of micro-dollars — at most six decimal
// places once trailing zeros are dropped, so "1.5000000" is 1.5 but
// "1.1234567" is refused with ErrUSDPlaces, never rounded — and within
// ±MaxMicros (ErrUSDRange). Negative amounts parse, so that every Micros
// round-trips through String; callers that need a positive amount check
// the sign themselves.
func ParseUSD(s string) (Micros, error) { return parseUSD(s, false) }

// RoundUSD parses an amount in ParseUSD's grammar and range, rounding
// places past the sixth half away from zero instead of refusing them. It
// is for provider wire formats that carry binary floats as decimals (io.net
// sends prices such as 27.875342465753423); caller input uses ParseUSD.
func RoundUSD(s string) (Micros, error) { return parseUSD(s, true) }

// maxDigits is the number of decimal digits of MaxMicros.
const maxDigits = 16

func parseUSD(s string, round bool) (Micros, error) {
	neg, digits, exp, ok := scanDecimal(s)
	if !ok {
		return 0, ErrUSDSyntax
	}
	// The value is digits × 10^exp dollars, digits × 10^shift micro-dollars.
	shift := exp + 6
	up := false
	if shift < 0 {
		if !round {
			return 0, ErrUSDPlaces
		}
		drop := -shift
		switch {
		case drop > int64(len(digits)):
			digits = ""
		default:
			keep := int64(len(digits)) - drop
			up = digits[keep] >= '5'
			digits = digits[:keep]
		}
		shift = 0
	}
	if digits == "" && !up {
		return 0, nil
	}
	if int64(len(digits))+shift > maxDigits {
		return 0, ErrUSDRange
	}
	var n uint64
	for i := 0; i < len(digits); i++ {
		n = n*10 + uint64(digits[i]-'0')
	}
	for ; shift > 0; shift-- {
		n *= 10
	}
	if up {
		n++
	}
	if n > uint64(MaxMicros) {
		return 0, ErrUSDRange
	}
	if neg {
		return -Micros(n), nil
	}
	return Micros(n), nil
}

// scanDecimal splits s, in ParseUSD's grammar, into its sign, its
// significant digits (no leading or trailing zeros; "" for zero) and the
// power of ten they are scaled by. Exponents too large to matter saturate.
func scanDecimal(s string) (neg bool, digits string, exp int64, ok bool) {
	i := 0
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	whole := s[start:i]
	var frac string
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		frac = s[start:i]
	}
	if whole == "" && frac == "" {
		return false, "", 0, false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		start = i
		for i < len(s) && isDigit(s[i]) {
			if exp < 1<<40 {
				exp = exp*10 + int64(s[i]-'0')
			}
			i++
		}
		if i == start {
			return false, "", 0, false
		}
		if eneg {
			exp = -exp
		}
	}
	if i != len(s) {
		return false, "", 0, false
	}
	exp -= int64(len(frac))
	whole = strings.TrimLeft(whole, "0")
	if whole == "" {
		frac = strings.TrimLeft(frac, "0")
	}
	if t := strings.TrimRight(frac, "0"); len(t) < len(frac) {
		exp += int64(len(frac) - len(t))
		frac = t
	}
	if frac == "" {
		t := strings.TrimRight(whole, "0")
		exp += int64(len(whole) - len(t))
		whole = t
	}
	if whole == "" && frac == "" {
		return neg, "", 0, true // zero, whatever its exponent
	}
	return neg, whole + frac, exp, true
}

// FromUSD converts a float dollar amount to Micros, rounding to the nearest
// micro-dollar. It is for provider wire formats that carry floats (vast.ai);
// it refuses NaN and infinities (ErrUSDSyntax) and amounts beyond
// ±MaxMicros (ErrUSDRange).
func FromUSD(f float64) (Micros, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, ErrUSDSyntax
	}
	v := math.Round(f * MicrosPerUSD)
	if !(math.Abs(v) <= float64(MaxMicros)) {
		return 0, ErrUSDRange
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

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// TokenPrice charges proxied requests per token (chargeback): USD per
// million prompt (input) and completion (output) tokens. The zero value
// charges nothing.
type TokenPrice struct {
	InputPer1M  Micros
	OutputPer1M Micros
}

// On reports whether the price charges anything.
func (p TokenPrice) On() bool { return p.InputPer1M > 0 || p.OutputPer1M > 0 }

// maxPricedTokens bounds the tokens Cost multiplies (no int64 overflow at
// any price up to MaxMicros).
const maxPricedTokens = 1 << 30

// Cost is what prompt and completion tokens cost at p, each part rounded
// up to the micro-dollar.
func (p TokenPrice) Cost(prompt, completion int64) Micros {
	return perMillion(p.InputPer1M, prompt) + perMillion(p.OutputPer1M, completion)
}

func perMillion(price Micros, tokens int64) Micros {
	if price <= 0 || tokens <= 0 {
		return 0
	}
	tokens = min(tokens, maxPricedTokens)
	// price·tokens can pass int64: split price into millions and the rest.
	whole, rest := int64(price)/1_000_000, int64(price)%1_000_000
	c := whole*tokens + (rest*tokens+999_999)/1_000_000
	return Micros(min(c, int64(MaxMicros)))
}
