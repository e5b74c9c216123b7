package gpuproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// FieldKind is the JSON type a field takes.
type FieldKind string

// Field kinds.
const (
	// FieldInteger is a JSON number written without a fraction or an
	// exponent ("2", never "2.0" or "2e0").
	FieldInteger FieldKind = "integer"
	// FieldNumber is any JSON number.
	FieldNumber FieldKind = "number"
	// FieldUSD is an amount of US dollars, a JSON number or a numeric
	// string, with at most six places (ParseUSD).
	FieldUSD FieldKind = "usd"
	// FieldDuration is a Go duration string ("30s", "8h", "1h30m"), or
	// "0".
	FieldDuration FieldKind = "duration"
	// FieldStrings is a string or an array of strings.
	FieldStrings FieldKind = "strings"
	// FieldString is one string of at most MaxLen characters ("" is
	// none).
	FieldString FieldKind = "string"
	// FieldList is an array of at most MaxItems strings, each at most
	// MaxLen characters.
	FieldList FieldKind = "list"
)

// FieldRule is one numeric, duration or list input field's rule: its
// JSON type, its range and whether an explicit zero is allowed. One table
// of these per request type lives beside the type it fills (fleet's
// create and spec, services' definition, the proxy's chat body), and
// every transport checks the JSON it receives against that table before
// anything is admitted: REST and MCP bodies, the MCP tools' schemas and
// the CLI's flags all come from it, so a field means the same everywhere.
type FieldRule struct {
	// Name is the field's dotted JSON path: "spec.num_gpus".
	Name string
	Kind FieldKind
	// Min and Max bound an integer, a number or a USD amount, inclusive.
	Min, Max float64
	// MinDuration and MaxDuration bound a duration, inclusive.
	MinDuration, MaxDuration time.Duration
	// Zero, when set, allows an explicit zero (0, "0", "0s") outside the
	// range and says what it means ("none", "any"). Unset: zero is
	// refused unless the range holds it (a count of 0 GPUs is no request
	// for the default), and a USD amount of zero is always refused (a
	// price cap of $0 is no cap).
	Zero string
	// MaxItems and MaxLen bound a FieldStrings list and each of its
	// strings (1 to MaxLen characters, not blank).
	MaxItems, MaxLen int
	// Unit follows a number in messages ("GB", "USD per hour").
	Unit string
	// Secret marks a credential (a registry login): a refusal says how
	// long the value was, never the value.
	Secret bool
}

// Range says what the field accepts: "an integer from 1 to 64", "a
// duration such as \"30s\" or \"8h\", from 10s to 720h, or \"0\" for
// none".
func (r FieldRule) Range() string {
	var s string
	switch r.Kind {
	case FieldInteger:
		s = fmt.Sprintf("an integer from %s to %s", fmtBound(r.Min), fmtBound(r.Max))
	case FieldNumber:
		s = fmt.Sprintf("a number from %s to %s", fmtBound(r.Min), fmtBound(r.Max))
	case FieldUSD:
		lo, hi := usdBound(r.Min), usdBound(r.Max)
		if lo == 0 && r.Zero == "" {
			s = "an amount of USD more than $0 and at most " + hi.Dollars()
		} else {
			s = "an amount of USD from " + lo.Dollars() + " to " + hi.Dollars()
		}
	case FieldDuration:
		s = fmt.Sprintf("a duration such as \"30s\" or \"8h\", from %s to %s", FormatDuration(r.MinDuration),
			FormatDuration(r.MaxDuration))
		if r.Zero != "" {
			return s + `, or "0" for ` + r.Zero
		}
		return s
	case FieldStrings:
		return fmt.Sprintf("a string or an array of at most %d strings, each 1-%d characters", r.MaxItems, r.MaxLen)
	case FieldString:
		return fmt.Sprintf("a string of at most %d characters", r.MaxLen)
	case FieldList:
		return fmt.Sprintf("an array of at most %d strings, each at most %d characters", r.MaxItems, r.MaxLen)
	}
	if r.Unit != "" && r.Kind != FieldUSD {
		s += " " + r.Unit
	}
	if r.Zero != "" && r.Min > 0 {
		s += ", or 0 for " + r.Zero
	}
	return s
}

// invalid is the field's refusal: what it accepts, and what came.
func (r FieldRule) invalid(got string) error {
	if r.Secret {
		got = fmt.Sprintf("a value of %d characters (not shown: it is a credential)", len(got))
	}
	if len(got) > 60 {
		got = got[:57] + "..."
	}
	e := Invalid(r.Name, "must be %s, got %s", r.Range(), got)
	e.Details["range"] = r.Range()
	return e
}

// CheckJSON checks one JSON value of the field; null counts as absent.
func (r FieldRule) CheckJSON(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	got := string(raw)
	switch r.Kind {
	case FieldInteger:
		if !isJSONInteger(got) {
			return r.invalid(got)
		}
		n, err := strconv.ParseInt(got, 10, 64)
		if err != nil {
			return r.invalid(got) // out of int64: out of any range
		}
		return r.CheckInt(n)
	case FieldNumber:
		var n json.Number
		if json.Unmarshal(raw, &n) != nil || raw[0] == '"' {
			return r.invalid(got)
		}
		f, err := strconv.ParseFloat(n.String(), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return r.invalid(got)
		}
		return r.checkFloat(f, got)
	case FieldUSD:
		text := got
		if raw[0] == '"' {
			if json.Unmarshal(raw, &text) != nil {
				return r.invalid(got)
			}
		}
		m, err := ParseUSD(strings.TrimSpace(text))
		switch {
		case errors.Is(err, ErrUSDPlaces):
			return Invalid(r.Name, "%v (%s), got %s", ErrUSDPlaces, r.Range(), got)
		case err != nil:
			return r.invalid(got)
		}
		return r.checkMicros(m, got)
	case FieldDuration:
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return r.invalid(got)
		}
		s = strings.TrimSpace(s)
		d, err := time.ParseDuration(s)
		if s == "0" {
			d, err = 0, nil
		}
		if err != nil {
			return r.invalid(got)
		}
		return r.checkDuration(d, got)
	case FieldString:
		var one string
		if raw[0] != '"' || json.Unmarshal(raw, &one) != nil {
			return r.invalid(got)
		}
		return r.checkString(one, got)
	case FieldList:
		var many []string
		if raw[0] != '[' || json.Unmarshal(raw, &many) != nil {
			return r.invalid(got)
		}
		return r.checkList(many, got)
	case FieldStrings:
		var one string
		if json.Unmarshal(raw, &one) == nil {
			return r.checkStrings([]string{one}, got)
		}
		var many []string
		if raw[0] != '[' || json.Unmarshal(raw, &many) != nil {
			return r.invalid(got)
		}
		return r.checkStrings(many, got)
	}
	return nil
}

// CheckInt checks an integer value of the field.
func (r FieldRule) CheckInt(n int64) error {
	if n == 0 && r.Zero != "" {
		return nil
	}
	if float64(n) < r.Min || float64(n) > r.Max {
		return r.invalid(strconv.FormatInt(n, 10))
	}
	return nil
}

// CheckFloat checks a number value of the field.
func (r FieldRule) CheckFloat(f float64) error {
	return r.checkFloat(f, strconv.FormatFloat(f, 'g', -1, 64))
}

func (r FieldRule) checkFloat(f float64, got string) error {
	if f == 0 && r.Zero != "" {
		return nil
	}
	if math.IsNaN(f) || f < r.Min || f > r.Max {
		return r.invalid(got)
	}
	return nil
}

// CheckMicros checks a USD value of the field.
func (r FieldRule) CheckMicros(m Micros) error { return r.checkMicros(m, m.String()) }

func (r FieldRule) checkMicros(m Micros, got string) error {
	if m == 0 && r.Zero != "" {
		return nil
	}
	if m < usdBound(r.Min) || m > usdBound(r.Max) || m == 0 {
		return r.invalid(got)
	}
	return nil
}

func (r FieldRule) checkDuration(d time.Duration, got string) error {
	if d == 0 && r.Zero != "" {
		return nil
	}
	if d < r.MinDuration || d > r.MaxDuration {
		return r.invalid(got)
	}
	return nil
}

// CheckStrings checks a list value of the field.
func (r FieldRule) CheckStrings(l []string) error {
	b, _ := json.Marshal(l)
	return r.checkStrings(l, string(b))
}

func (r FieldRule) checkStrings(l []string, got string) error {
	if len(l) > r.MaxItems {
		return r.invalid(got)
	}
	for _, s := range l {
		if strings.TrimSpace(s) == "" || len(s) > r.MaxLen {
			return r.invalid(got)
		}
	}
	return nil
}

// CheckString checks a FieldString value of the field.
func (r FieldRule) CheckString(v string) error {
	b, _ := json.Marshal(v)
	return r.checkString(v, string(b))
}

func (r FieldRule) checkString(v, got string) error {
	if len(v) > r.MaxLen {
		return r.invalid(got)
	}
	return nil
}

// CheckList checks a FieldList value of the field.
func (r FieldRule) CheckList(l []string) error {
	b, _ := json.Marshal(l)
	return r.checkList(l, string(b))
}

func (r FieldRule) checkList(l []string, got string) error {
	if len(l) > r.MaxItems {
		return r.invalid(got)
	}
	for _, s := range l {
		if len(s) > r.MaxLen {
			return r.invalid(got)
		}
	}
	return nil
}

// FieldRules is a request type's table of field rules.
type FieldRules []FieldRule

// Rule returns the named field's rule; a name not in the table is a
// programming error.
func (rs FieldRules) Rule(name string) FieldRule {
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	panic("gpuproxy: no field rule " + name)
}

// Check checks every field of the table that the JSON object body holds,
// in the table's order, and returns the first refusal (an EINVALID error
// naming the field and its range). A body that is not a JSON object, or a
// path through a value that is not one, is left to the decoder to refuse.
func (rs FieldRules) Check(body []byte) error {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil
	}
	objs := map[string]map[string]json.RawMessage{"": top}
	for _, r := range rs {
		parent, name := "", r.Name
		if i := strings.LastIndexByte(r.Name, '.'); i >= 0 {
			parent, name = r.Name[:i], r.Name[i+1:]
		}
		obj, ok := objs[parent]
		if !ok {
			obj = lookupObject(top, parent)
			objs[parent] = obj
		}
		if v, ok := obj[name]; ok {
			if err := r.CheckJSON(v); err != nil {
				return err
			}
		}
	}
	return nil
}

// lookupObject is the object at a dotted path of top, nil when there is
// none.
func lookupObject(top map[string]json.RawMessage, path string) map[string]json.RawMessage {
	cur := top
	for _, seg := range strings.Split(path, ".") {
		var next map[string]json.RawMessage
		if json.Unmarshal(cur[seg], &next) != nil {
			return nil
		}
		cur = next
	}
	return cur
}

// isJSONInteger reports whether s is a JSON number without a fraction or
// an exponent.
func isJSONInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func fmtBound(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// usdBound is a rule's USD bound in micro-dollars.
func usdBound(f float64) Micros {
	if f >= float64(MaxMicros)/MicrosPerUSD {
		return MaxMicros
	}
	return Micros(math.Round(f * MicrosPerUSD))
}

// FormatDuration prints d as people write it: "5m", not "5m0s"; "720h".
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
