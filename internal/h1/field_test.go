package h1

import (
	"bufio"
	"net/http"
	"net/textproto"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

func TestContentLength(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v  string
		n  int64
		ok bool
	}{
		{"0", 0, true},
		{"80", 80, true},
		{"007", 7, true},
		{"999999999999999999", 999999999999999999, true}, // MaxLengthDigits
		{"1000000000000000000", 0, false},                // 19 digits: net/http's, not ours
		{"99999999999999999999", 0, false},
		{"", 0, false},
		{"+1", 0, false},
		{"-1", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{"1, 1", 0, false},
		{"0x1", 0, false},
		{"1\x00", 0, false},
	} {
		n, ok := ContentLength(tc.v)
		if n != tc.n || ok != tc.ok {
			t.Errorf("ContentLength(%q) = %d, %v; want %d, %v", tc.v, n, ok, tc.n, tc.ok)
		}
	}
}

func TestNextLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s, line, rest string
		ok            bool
	}{
		{"a: b\r\nrest", "a: b", "rest", true},
		{"\r\n", "", "", true},
		{"\r\n\r\n", "", "\r\n", true},
		{"a\nb\r\nc", "a\nb", "c", true}, // a bare LF stays in the line, for its checks
		{"a: b", "", "", false},
		{"a: b\r", "", "", false},
		{"a\rb\r\n", "", "", false}, // a bare CR
		{"a\n", "", "", false},
		{"", "", "", false},
	} {
		line, rest, ok := NextLine(tc.s)
		if line != tc.line || rest != tc.rest || ok != tc.ok {
			t.Errorf("NextLine(%q) = %q, %q, %v; want %q, %q, %v", tc.s, line, rest, ok, tc.line, tc.rest, tc.ok)
		}
	}
}

// fieldCases are header lines and what HeaderField makes of them.
var fieldCases = []struct {
	line, key, value string
	ok               bool
}{
	{"Content-Type: application/json", "Content-Type", "application/json", true},
	{"content-type: application/json", "Content-Type", "application/json", true},
	{"x-stainless-os: Linux", "X-Stainless-Os", "Linux", true},
	{"X-Api-Key:k", "X-Api-Key", "k", true},
	{"X-A:\t a \t b\t ", "X-A", "a \t b", true},
	{"X-A:", "X-A", "", true},
	{"X-A:   ", "X-A", "", true},
	{"X-A: a:b::c", "X-A", "a:b::c", true},
	{"x_a.b~c|d!e: v", "X_a.b~c|d!e", "v", true},
	{"1x: v", "1x", "v", true},
	{"X-A: caf\xc3\xa9\xff", "X-A", "caf\xc3\xa9\xff", true},
	{"x-" + strings.Repeat("long-", 30) + "name: v", "X-" + strings.Repeat("Long-", 30) + "Name", "v", true},
	{"X-A : v", "", "", false},  // a blank before the colon
	{"X-A\t: v", "", "", false}, // a tab before it
	{" X-A: v", "", "", false},  // obs-fold
	{"\tv", "", "", false},      // obs-fold
	{": v", "", "", false},      // no name
	{"X-A v", "", "", false},    // no colon
	{"", "", "", false},
	{"X-\xc3\xa9: v", "", "", false}, // a name byte no token has
	{"X(A): v", "", "", false},
	{"X-A: a\x00b", "", "", false},
	{"X-A: a\rb", "", "", false},
	{"X-A: a\nb", "", "", false},
	{"X-A: a\x7f", "", "", false},
	{"X-A: a\x01", "", "", false},
}

func TestHeaderField(t *testing.T) {
	t.Parallel()
	for _, tc := range fieldCases {
		key, value, ok := HeaderField(tc.line)
		if key != tc.key || value != tc.value || ok != tc.ok {
			t.Errorf("HeaderField(%q) = %q, %q, %v; want %q, %q, %v", tc.line, key, value, ok, tc.key, tc.value, tc.ok)
		}
	}
}

// TestCanonicalKey checks CanonicalKey against http.CanonicalHeaderKey on
// every common name, sent canonical, in lower case and in upper case, and
// on odd ones; and that the common names are canonical (else their
// lookup could never hit).
func TestCanonicalKey(t *testing.T) {
	t.Parallel()
	keys := []string{"a", "A", "x-a", "X-A", "-a", "a-", "a--b", "1x-2y", "x_a.b", "WWW-AUTHENTICATE",
		"x-" + strings.Repeat("long-", 30) + "name", strings.Repeat("k", maxCanonKey+1)}
	for k := range commonKeys {
		if k != http.CanonicalHeaderKey(k) {
			t.Errorf("common key %q is not canonical", k)
		}
		keys = append(keys, k, strings.ToLower(k), strings.ToUpper(k))
	}
	for _, k := range keys {
		got, ok := CanonicalKey(k)
		if want := http.CanonicalHeaderKey(k); got != want || !ok {
			t.Errorf("CanonicalKey(%q) = %q, %v; want %q, true", k, got, ok, want)
		}
	}
	for _, k := range []string{"", "X A", "X:A", "X\x00", "caf\xc3\xa9", "X(A)"} {
		if got, ok := CanonicalKey(k); ok {
			t.Errorf("CanonicalKey(%q) = %q, true; want false", k, got)
		}
	}
}

// TestCanonicalKeyAllocs pins what CanonicalKey costs: nothing for a
// canonical name or a common one in any case, one allocation for another.
func TestCanonicalKeyAllocs(t *testing.T) {
	for _, tc := range []struct {
		k      string
		allocs float64
	}{
		{"X-Unknown-Name", 0},
		{"content-type", 0},
		{"X-STAINLESS-RETRY-COUNT", 0},
		{"x-unknown-name", 1},
	} {
		if n := testing.AllocsPerRun(100, func() { _, _ = CanonicalKey(tc.k) }); n != tc.allocs {
			t.Errorf("CanonicalKey(%q): %.1f allocations, want %.0f", tc.k, n, tc.allocs)
		}
	}
}

// TestByteClasses checks the byte classes against httpguts, the rules
// net/http's server applies: every byte of a token and of a value.
func TestByteClasses(t *testing.T) {
	t.Parallel()
	for c := range 256 {
		s := string([]byte{byte(c)})
		if got, want := IsToken(s), httpguts.ValidHeaderFieldName(s); got != want {
			t.Errorf("byte %#x: IsToken %v, httpguts %v", c, got, want)
		}
		if got, want := ValidValue(s), httpguts.ValidHeaderFieldValue(s); got != want {
			t.Errorf("byte %#x: ValidValue %v, httpguts %v", c, got, want)
		}
	}
	if IsToken("") {
		t.Error(`IsToken("") is true`)
	}
	if !ValidValue("") {
		t.Error(`ValidValue("") is false`)
	}
}

// FuzzHeaderField differentially fuzzes HeaderField against net/textproto's
// ReadMIMEHeader (what http.ReadRequest and http.ReadResponse read fields
// with) on a one-line header: what HeaderField accepts, textproto accepts
// as the same key and value, and CanonicalKey agrees with
// http.CanonicalHeaderKey and httpguts on every name.
//
//	go test -run '^$' -fuzz '^FuzzHeaderField$' -fuzztime 30s ./internal/h1/
func FuzzHeaderField(f *testing.F) {
	for _, tc := range fieldCases {
		f.Add(tc.line)
	}
	f.Fuzz(func(t *testing.T, line string) {
		if name, _, found := strings.Cut(line, ":"); found {
			got, ok := CanonicalKey(name)
			if ok != httpguts.ValidHeaderFieldName(name) || ok && got != http.CanonicalHeaderKey(name) {
				t.Fatalf("CanonicalKey(%q) = %q, %v", name, got, ok)
			}
		}
		key, value, ok := HeaderField(line)
		if !ok {
			return
		}
		h, err := textproto.NewReader(bufio.NewReader(strings.NewReader(line + "\r\n\r\n"))).ReadMIMEHeader()
		if err != nil {
			t.Fatalf("HeaderField accepts %q, textproto refuses it: %v", line, err)
		}
		if vv := h[key]; len(h) != 1 || len(vv) != 1 || vv[0] != value {
			t.Fatalf("HeaderField(%q) = %q, %q; textproto reads %q", line, key, value, h)
		}
	})
}
