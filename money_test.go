package gpuproxy_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
)

func TestParseUSD(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want gpuproxy.Micros
		err  error
	}{
		// Good: the grammar's forms, exact to the micro-dollar.
		{"0", 0, nil},
		{"5", 5_000_000, nil},
		{"0.25", 250_000, nil},
		{".5", 500_000, nil},
		{"5.", 5_000_000, nil},
		{"007", 7_000_000, nil},
		{"-3", -3_000_000, nil},
		{"-0", 0, nil},
		{"-0.000001", -1, nil},
		{"12.345678", 12_345_678, nil},
		{"0.000001", 1, nil},
		{"25.0", 25_000_000, nil},
		{"1.5000000000", 1_500_000, nil}, // trailing zeros change nothing
		{"1e2", 100_000_000, nil},
		{"1E2", 100_000_000, nil},
		{"1e+2", 100_000_000, nil},
		{"25e-1", 2_500_000, nil},
		{"1234567e-6", 1_234_567, nil},
		{"1.1234567e1", 11_234_567, nil},
		{"0.001e3", 1_000_000, nil},
		{"1e-6", 1, nil},
		{"0e999999999999999999999", 0, nil},
		{"0e-0007", 0, nil},
		{"0.0000000", 0, nil},
		{"-0.00000000e-99999999999999999999", 0, nil},
		{"1000000000", gpuproxy.MaxMicros, nil},
		{"-1000000000", -gpuproxy.MaxMicros, nil},
		{"999999999.999999", gpuproxy.MaxMicros - 1, nil},
		{"1e9", gpuproxy.MaxMicros, nil},
		{"0.000000000000000000001e21", 1_000_000, nil},

		// Bad: not the grammar.
		{"", 0, gpuproxy.ErrUSDSyntax},
		{"-", 0, gpuproxy.ErrUSDSyntax},
		{".", 0, gpuproxy.ErrUSDSyntax},
		{"+", 0, gpuproxy.ErrUSDSyntax},
		{"+5", 0, gpuproxy.ErrUSDSyntax},
		{"+-5", 0, gpuproxy.ErrUSDSyntax},
		{"--5", 0, gpuproxy.ErrUSDSyntax},
		{"-.", 0, gpuproxy.ErrUSDSyntax},
		{"1.2.3", 0, gpuproxy.ErrUSDSyntax},
		{"1e", 0, gpuproxy.ErrUSDSyntax},
		{"1e+", 0, gpuproxy.ErrUSDSyntax},
		{"e5", 0, gpuproxy.ErrUSDSyntax},
		{".e5", 0, gpuproxy.ErrUSDSyntax},
		{"1e2.5", 0, gpuproxy.ErrUSDSyntax},
		{"abc", 0, gpuproxy.ErrUSDSyntax},
		{" 5", 0, gpuproxy.ErrUSDSyntax},
		{"5 ", 0, gpuproxy.ErrUSDSyntax},
		{"5\n", 0, gpuproxy.ErrUSDSyntax},
		{"1,000", 0, gpuproxy.ErrUSDSyntax},
		{"1_000", 0, gpuproxy.ErrUSDSyntax},
		{"$5", 0, gpuproxy.ErrUSDSyntax},
		{"NaN", 0, gpuproxy.ErrUSDSyntax},
		{"Inf", 0, gpuproxy.ErrUSDSyntax},
		{"-Inf", 0, gpuproxy.ErrUSDSyntax},
		{"Infinity", 0, gpuproxy.ErrUSDSyntax},
		{"0x10", 0, gpuproxy.ErrUSDSyntax},
		{"0b1", 0, gpuproxy.ErrUSDSyntax},
		{`"5"`, 0, gpuproxy.ErrUSDSyntax},
		{"５", 0, gpuproxy.ErrUSDSyntax}, // a full-width digit

		// Bad: more than six decimal places, refused, never rounded.
		{"0.0000001", 0, gpuproxy.ErrUSDPlaces},
		{"1.1234567", 0, gpuproxy.ErrUSDPlaces},
		{"1.0000005", 0, gpuproxy.ErrUSDPlaces},
		{"-0.0000001", 0, gpuproxy.ErrUSDPlaces},
		{"1e-7", 0, gpuproxy.ErrUSDPlaces},
		{"1.5e-6", 0, gpuproxy.ErrUSDPlaces},
		{"1e-99999999999999999999", 0, gpuproxy.ErrUSDPlaces},

		// Bad: beyond ±$1 billion, whatever the path.
		{"999999999999", 0, gpuproxy.ErrUSDRange},
		{"1000000000.000001", 0, gpuproxy.ErrUSDRange},
		{"-1000000000.000001", 0, gpuproxy.ErrUSDRange},
		{"1e10", 0, gpuproxy.ErrUSDRange},
		{"1e300", 0, gpuproxy.ErrUSDRange},
		{"1e99999999999999999999", 0, gpuproxy.ErrUSDRange},
		{"99999999999999999999999999", 0, gpuproxy.ErrUSDRange},
		{"9223372036854775807", 0, gpuproxy.ErrUSDRange},
	} {
		got, err := gpuproxy.ParseUSD(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseUSDPlacesMessage(t *testing.T) {
	t.Parallel()
	_, err := gpuproxy.ParseUSD("1.1234567")
	if err == nil || !strings.Contains(err.Error(), "at most 6 decimal places") {
		t.Fatalf("error %v does not say at most 6 decimal places", err)
	}
}

// An amount out of range is refused with the range, not as "not a number".
func TestParseUSDRangeMessage(t *testing.T) {
	t.Parallel()
	_, err := gpuproxy.ParseUSD("1e300")
	if want := "must be between -$1,000,000,000 and $1,000,000,000"; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
}

func TestAmountRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lo, hi gpuproxy.Micros
		above  bool
		want   string
	}{
		{0, gpuproxy.MaxMicros, false, "must be between $0 and $1,000,000,000"},
		{0, gpuproxy.MaxMicros, true, "must be more than $0 and at most $1,000,000,000"},
		{-5 * gpuproxy.MicrosPerUSD, 1, false, "must be between -$5 and $0.000001"},
		{1_250_000, 999_500_000, false, "must be between $1.25 and $999.5"},
		{1234 * gpuproxy.MicrosPerUSD, 123456 * gpuproxy.MicrosPerUSD, false, "must be between $1,234 and $123,456"},
	} {
		if got := gpuproxy.AmountRange(tc.lo, tc.hi, tc.above); got != tc.want {
			t.Errorf("AmountRange(%d, %d, %v) = %q, want %q", tc.lo, tc.hi, tc.above, got, tc.want)
		}
	}
}

func TestRoundUSD(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want gpuproxy.Micros
		err  error
	}{
		{"27.875342465753423", 27_875_342, nil},
		{"19.970000000000002", 19_970_000, nil},
		{"0.0000005", 1, nil},
		{"0.00000049999", 0, nil},
		{"-0.0000005", -1, nil},
		{"-0.0000004", 0, nil},
		{"1.2345675", 1_234_568, nil},
		{"1e-05", 10, nil},
		{"1e-7", 0, nil},
		{"5e-7", 1, nil},
		{"1e-99999999999999999999", 0, nil},
		{"999999999.9999994", gpuproxy.MaxMicros - 1, nil},
		{"999999999.9999995", gpuproxy.MaxMicros, nil},
		{"0.25", 250_000, nil},
		{"1000000000.0000005", 0, gpuproxy.ErrUSDRange},
		{"1e10", 0, gpuproxy.ErrUSDRange},
		{"", 0, gpuproxy.ErrUSDSyntax},
		{"NaN", 0, gpuproxy.ErrUSDSyntax},
		{" 1", 0, gpuproxy.ErrUSDSyntax},
	} {
		got, err := gpuproxy.RoundUSD(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("RoundUSD(%q) = %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestFromUSD(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   float64
		want gpuproxy.Micros
		err  error
	}{
		{0, 0, nil},
		{0.35, 350_000, nil},
		{1.0000005, 1_000_001, nil},
		{-2.5, -2_500_000, nil},
		{1e9, gpuproxy.MaxMicros, nil},
		{-1e9, -gpuproxy.MaxMicros, nil},
		{1e9 + 0.001, 0, gpuproxy.ErrUSDRange},
		{-1e9 - 0.001, 0, gpuproxy.ErrUSDRange},
		{1e300, 0, gpuproxy.ErrUSDRange},
		{math.MaxFloat64, 0, gpuproxy.ErrUSDRange},
		{math.NaN(), 0, gpuproxy.ErrUSDSyntax},
		{math.Inf(1), 0, gpuproxy.ErrUSDSyntax},
		{math.Inf(-1), 0, gpuproxy.ErrUSDSyntax},
	} {
		got, err := gpuproxy.FromUSD(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("FromUSD(%v) = %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestMicrosString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   gpuproxy.Micros
		want string
	}{
		{0, "0"},
		{1, "0.000001"},
		{-1, "-0.000001"},
		{12_500_000, "12.5"},
		{-3_000_000, "-3"},
		{gpuproxy.MaxMicros, "1000000000"},
		{math.MinInt64, "-9223372036854.775808"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("Micros(%d).String() = %q, want %q", int64(tc.in), got, tc.want)
		}
		if tc.in < -gpuproxy.MaxMicros {
			continue
		}
		if back, err := gpuproxy.ParseUSD(tc.want); err != nil || back != tc.in {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d", tc.want, back, err, int64(tc.in))
		}
	}
}

func TestMicrosJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want gpuproxy.Micros
		ok   bool
	}{
		{`25`, 25_000_000, true},
		{`25.0`, 25_000_000, true},
		{`1e2`, 100_000_000, true},
		{`-0.5`, -500_000, true},
		{`0.000001`, 1, true},
		{`1.1234567`, 0, false},
		{`1e300`, 0, false},
		{`"25"`, 0, false},
		{`true`, 0, false},
		{`null`, 0, false},
		{`{}`, 0, false},
		{`[1]`, 0, false},
	} {
		var m gpuproxy.Micros
		err := json.Unmarshal([]byte(tc.in), &m)
		if (err == nil) != tc.ok || m != tc.want {
			t.Errorf("Unmarshal(%s) = %d, %v; want %d, ok %v", tc.in, m, err, tc.want, tc.ok)
		}
	}
	b, err := json.Marshal(struct {
		A gpuproxy.Micros `json:"a"`
	}{-1_250_000})
	if err != nil || string(b) != `{"a":-1.25}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
}

func TestMulMillis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		price gpuproxy.Micros
		ms    int64
		want  gpuproxy.Micros
	}{
		{3_600_000, 3_600_000, 3_600_000},
		{3_600_000, 1, 1},
		{1_000_000, 1_800_000, 500_000},
		{1_000_000, 1, 0},
		{1000 * gpuproxy.MicrosPerUSD, 10 * 365 * 24 * 3_600_000, 1000 * gpuproxy.MicrosPerUSD * 10 * 365 * 24},
	} {
		if got := tc.price.MulMillis(tc.ms); got != tc.want {
			t.Errorf("%d.MulMillis(%d) = %d, want %d", tc.price, tc.ms, got, tc.want)
		}
	}
}

// InvalidUSD says why ParseUSD refused a field's text: the places rule,
// the field's own range, or what it must be — never "not a number" for a
// number that is only out of range.
func TestInvalidUSD(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"1.1234567", "invalid: max_price: must have at most 6 decimal places"},
		{"1e12", "invalid: max_price: must be between $0 and $1,000,000,000"},
		{"abc", "invalid: max_price: must be a number of USD per hour, e.g. 12.5"},
	} {
		_, err := gpuproxy.ParseUSD(tc.in)
		if err == nil {
			t.Fatalf("%q parsed", tc.in)
		}
		got := gpuproxy.InvalidUSD("max_price", err, 0, gpuproxy.MaxMicros, "a number of USD per hour")
		if !strings.HasPrefix(got.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, got, tc.want)
		}
	}
}
