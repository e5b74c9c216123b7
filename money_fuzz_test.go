package gpuproxy_test

import (
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
)

// FuzzParseUSD checks ParseUSD and RoundUSD against an exact reference
// (math/big.Rat): never a panic; an accepted amount round-trips through
// String, lies within ±MaxMicros and equals the text's exact value; a
// value that is not a whole number of micro-dollars is refused by ParseUSD
// and rounded half away from zero by RoundUSD.
func FuzzParseUSD(f *testing.F) {
	for _, s := range []string{"0", "5", "0.25", ".5", "5.", "-3", "-0", "12.345678", "1e2", "25.0", "1E+2",
		"1.5e-6", "1234567e-6", "1000000000", "-1000000000", "999999999.999999", "1000000000.000001",
		"999999999999", "0.0000001", "1.1234567", "1.5000000", "", "-", ".", "+", "+-5", "--5", "1.2.3",
		"1e", "abc", " 5", "5 ", "NaN", "Inf", "0x10", "1e99999999999999999999", "0e999999999", "27.875342465753423"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := gpuproxy.ParseUSD(s)
		r, rerr := gpuproxy.RoundUSD(s)
		ref, refOK := reference(s)

		if err == nil {
			if m < -gpuproxy.MaxMicros || m > gpuproxy.MaxMicros {
				t.Fatalf("ParseUSD(%q) = %d, beyond ±MaxMicros", s, m)
			}
			if back, berr := gpuproxy.ParseUSD(m.String()); berr != nil || back != m {
				t.Fatalf("ParseUSD(%q) = %d, but ParseUSD(%q) = %d, %v", s, m, m.String(), back, berr)
			}
			if rerr != nil || r != m {
				t.Fatalf("ParseUSD(%q) = %d but RoundUSD = %d, %v", s, m, r, rerr)
			}
		}
		if !refOK {
			if err == nil || rerr == nil {
				t.Fatalf("%q is not an amount, yet ParseUSD = %d, %v and RoundUSD = %d, %v", s, m, err, r, rerr)
			}
			if !errors.Is(err, gpuproxy.ErrUSDSyntax) || !errors.Is(rerr, gpuproxy.ErrUSDSyntax) {
				t.Fatalf("%q: errors %v, %v; want ErrUSDSyntax", s, err, rerr)
			}
			return
		}
		if ref == nil {
			return // an exponent too large to evaluate cheaply; the table test covers those
		}
		micros := new(big.Rat).Mul(ref, big.NewRat(gpuproxy.MicrosPerUSD, 1))
		limit := big.NewRat(int64(gpuproxy.MaxMicros), 1)
		if micros.IsInt() {
			in := new(big.Rat).Abs(micros).Cmp(limit) <= 0
			switch {
			case in && (err != nil || big.NewRat(int64(m), 1).Cmp(micros) != 0):
				t.Fatalf("ParseUSD(%q) = %d, %v; want %s", s, m, err, micros.RatString())
			case !in && !errors.Is(err, gpuproxy.ErrUSDRange):
				t.Fatalf("ParseUSD(%q) = %d, %v; want ErrUSDRange", s, m, err)
			}
			return
		}
		// More than six decimal places: refused, never rounded.
		if !errors.Is(err, gpuproxy.ErrUSDPlaces) {
			t.Fatalf("ParseUSD(%q) = %d, %v; want ErrUSDPlaces", s, m, err)
		}
		rounded := roundHalfAway(micros)
		if new(big.Int).Abs(rounded).Cmp(limit.Num()) > 0 {
			if !errors.Is(rerr, gpuproxy.ErrUSDRange) {
				t.Fatalf("RoundUSD(%q) = %d, %v; want ErrUSDRange", s, r, rerr)
			}
			return
		}
		if rerr != nil || big.NewInt(int64(r)).Cmp(rounded) != 0 {
			t.Fatalf("RoundUSD(%q) = %d, %v; want %s", s, r, rerr, rounded)
		}
	})
}

// reference reports whether s is in ParseUSD's grammar and, when its
// exponent is small enough to evaluate, its exact value. It is written
// independently of money.go: a grammar check on the characters, then
// math/big.
func reference(s string) (*big.Rat, bool) {
	body := strings.TrimPrefix(s, "-")
	mant, exp, hasExp := strings.Cut(strings.ToLower(body), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	digitsOnly := func(x string) bool { return strings.Trim(x, "0123456789") == "" }
	if strings.Count(mant, ".") > 1 || !digitsOnly(whole) || !digitsOnly(frac) || whole+frac == "" {
		return nil, false
	}
	if hasExp {
		e := strings.TrimLeft(exp, "+-")
		if len(exp)-len(e) > 1 || e == "" || !digitsOnly(e) {
			return nil, false
		}
		if len(strings.TrimLeft(e, "0")) > 4 {
			return nil, true // valid, too large to evaluate here
		}
	}
	v, ok := new(big.Rat).SetString(s)
	if !ok {
		panic("big.Rat refused " + s)
	}
	return v, true
}

// roundHalfAway rounds x to the nearest integer, halves away from zero.
func roundHalfAway(x *big.Rat) *big.Int {
	a := new(big.Rat).Abs(x)
	a.Add(a, big.NewRat(1, 2))
	n := new(big.Int).Quo(a.Num(), a.Denom())
	if x.Sign() < 0 {
		n.Neg(n)
	}
	return n
}
