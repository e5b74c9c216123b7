package ionetsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
)

// This file reproduces FastAPI's reply shapes: {"detail": "<message>"} for
// HTTPException and Pydantic v2 validation lists for 422.

// detailItem is one Pydantic v2 validation error.
type detailItem struct {
	Type  string         `json:"type"`
	Loc   []any          `json:"loc"`
	Msg   string         `json:"msg"`
	Input any            `json:"input"`
	Ctx   map[string]any `json:"ctx,omitempty"`
}

// validator collects validation errors the way FastAPI reports them: all
// at once, in schema order.
type validator struct{ errs []detailItem }

func (v *validator) add(typ string, loc []any, msg string, input any, ctx map[string]any) {
	v.errs = append(v.errs, detailItem{Type: typ, Loc: append([]any(nil), loc...), Msg: msg, Input: input, Ctx: ctx})
}

func (v *validator) ok() bool { return len(v.errs) == 0 }

// writeJSON writes v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeDetail writes FastAPI's HTTPException body.
func writeDetail(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]any{"detail": fmt.Sprintf(format, args...)})
}

// write422 writes a validation error list.
func write422(w http.ResponseWriter, items []detailItem) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": items})
}

func loc(parts ...any) []any { return parts }

func with(base []any, part any) []any { return append(append([]any(nil), base...), part) }

// noMin is the lo of queryInt and bound for a parameter whose schema sets
// no minimum.
const noMin = math.MinInt

// uuidRE matches what Pydantic accepts as a UUID: hex digits, hyphens
// optional.
var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

// uuid reports whether s is a UUID, adding Pydantic's uuid_parsing error
// at l when it is not.
func (v *validator) uuid(l []any, s string) bool {
	if uuidRE.MatchString(s) {
		return true
	}
	v.add("uuid_parsing", l, "Input should be a valid UUID, invalid character: expected an optional prefix of `urn:uuid:` followed by [0-9a-fA-F-]", s, nil)
	return false
}

// queryUUID reads an optional UUID query parameter ("" when absent).
func (v *validator) queryUUID(q url.Values, name string) string {
	if !q.Has(name) {
		return ""
	}
	s := q.Get(name)
	if !v.uuid(loc("query", name), s) {
		return ""
	}
	return s
}

// queryInt reads an integer query parameter. lo/hi bound it (lo noMin or
// hi 0: no bound that side); def is used when it is absent and not
// required.
func (v *validator) queryInt(q url.Values, name string, required bool, def, lo, hi int) int {
	if !q.Has(name) {
		if required {
			v.add("missing", loc("query", name), "Field required", nil, nil)
		}
		return def
	}
	s := q.Get(name)
	n, err := strconv.Atoi(s)
	if err != nil {
		v.add("int_parsing", loc("query", name),
			"Input should be a valid integer, unable to parse string as an integer", s, nil)
		return def
	}
	v.bound(loc("query", name), n, s, lo, hi)
	return n
}

// bound checks lo ≤ n (≤ hi when hi > 0).
func (v *validator) bound(l []any, n int, input any, lo, hi int) {
	switch {
	case n < lo:
		v.add("greater_than_equal", l, fmt.Sprintf("Input should be greater than or equal to %d", lo), input, map[string]any{"ge": lo})
	case hi > 0 && n > hi:
		v.add("less_than_equal", l, fmt.Sprintf("Input should be less than or equal to %d", hi), input, map[string]any{"le": hi})
	}
}

// decodeBody parses a JSON body, reporting json_invalid like FastAPI.
func (v *validator) decodeBody(body []byte) (json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil || dec.More() {
		msg := "invalid JSON"
		if err != nil {
			msg = err.Error()
		}
		v.add("json_invalid", loc("body", dec.InputOffset()), "JSON decode error", map[string]any{}, map[string]any{"error": msg})
		return nil, false
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		v.add("missing", loc("body"), "Field required", nil, nil)
		return nil, false
	}
	return raw, true
}

// maxBody caps the request bodies the simulator reads: io.net's are a few
// kilobytes.
const maxBody = 1 << 20

// anyKey, as the only allowed key of validator.object, allows every member
// (a schema without additionalProperties: false).
const anyKey = "*"

// object checks that raw is a JSON object without keys beyond allowed
// (additionalProperties: false) and returns its members.
func (v *validator) object(raw json.RawMessage, l []any, allowed ...string) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		v.add("model_attributes_type", l, "Input should be a valid dictionary or object to extract fields from", anyOf(raw), nil)
		return nil
	}
	if len(allowed) == 1 && allowed[0] == anyKey {
		return m
	}
	ok := map[string]bool{}
	for _, k := range allowed {
		ok[k] = true
	}
	var extra []string
	for k := range m {
		if !ok[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	for _, k := range extra {
		v.add("extra_forbidden", with(l, k), "Extra inputs are not permitted", anyOf(m[k]), nil)
	}
	return m
}

// anyOf decodes raw for the "input" member of an error.
func anyOf(raw json.RawMessage) any {
	var x any
	_ = json.Unmarshal(raw, &x)
	return x
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// intField reads an integer member (lax: integral floats and numeric strings
// pass, as in Pydantic's lax mode). present is false when absent or null.
func (v *validator) intField(m map[string]json.RawMessage, l []any, key string, required bool) (n int, present bool) {
	raw, has := m[key]
	if !has || isNull(raw) {
		if required && !has {
			v.add("missing", with(l, key), "Field required", nil, nil)
		} else if required {
			v.add("int_type", with(l, key), "Input should be a valid integer", nil, nil)
		}
		return 0, false
	}
	switch x := anyOf(raw).(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1e15 {
			return int(x), true
		}
		v.add("int_from_float", with(l, key), "Input should be a valid integer, got a number with a fractional part", x, nil)
	case string:
		if i, err := strconv.Atoi(x); err == nil {
			return i, true
		}
		v.add("int_parsing", with(l, key), "Input should be a valid integer, unable to parse string as an integer", x, nil)
	default:
		v.add("int_type", with(l, key), "Input should be a valid integer", x, nil)
	}
	return 0, false
}

// strField reads a string member.
func (v *validator) strField(m map[string]json.RawMessage, l []any, key string, required bool) (s string, present bool) {
	raw, has := m[key]
	if !has || isNull(raw) {
		if required && !has {
			v.add("missing", with(l, key), "Field required", nil, nil)
		} else if required {
			v.add("string_type", with(l, key), "Input should be a valid string", nil, nil)
		}
		return "", false
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		v.add("string_type", with(l, key), "Input should be a valid string", anyOf(raw), nil)
		return "", false
	}
	return s, true
}

// listField reads a nullable list member of strings or ints with item
// bounds (maxItems 0 = none).
func listField[T any](v *validator, m map[string]json.RawMessage, l []any, key string, minItems, maxItems int) (out []T, present bool) {
	raw, has := m[key]
	if !has || isNull(raw) {
		return nil, false
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		v.add("list_type", with(l, key), "Input should be a valid list", anyOf(raw), nil)
		return nil, false
	}
	bad := false
	for i, it := range items {
		var x T
		if err := json.Unmarshal(it, &x); err != nil {
			typ, msg := "string_type", "Input should be a valid string"
			if _, isInt := any(x).(int); isInt {
				typ, msg = "int_type", "Input should be a valid integer"
			}
			v.add(typ, with(with(l, key), i), msg, anyOf(it), nil)
			bad = true
			continue
		}
		out = append(out, x)
	}
	switch {
	case len(items) < minItems:
		v.add("too_short", with(l, key), fmt.Sprintf("List should have at least %d item after validation, not %d", minItems, len(items)),
			anyOf(raw), map[string]any{"field_type": "List", "min_length": minItems, "actual_length": len(items)})
		bad = true
	case maxItems > 0 && len(items) > maxItems:
		v.add("too_long", with(l, key), fmt.Sprintf("List should have at most %d item after validation, not %d", maxItems, len(items)),
			anyOf(raw), map[string]any{"field_type": "List", "max_length": maxItems, "actual_length": len(items)})
		bad = true
	}
	return out, !bad
}

// mapField reads an optional map of strings. nullable allows null for the
// whole map (absent then); nullValues allows null values (secret merges,
// where null deletes a key).
func (v *validator) mapField(m map[string]json.RawMessage, l []any, key string, nullable, nullValues bool) (map[string]*string, bool) {
	raw, has := m[key]
	if !has || (nullable && isNull(raw)) {
		return nil, false
	}
	var mm map[string]json.RawMessage
	if err := json.Unmarshal(raw, &mm); err != nil || mm == nil {
		v.add("dict_type", with(l, key), "Input should be a valid dictionary", anyOf(raw), nil)
		return nil, false
	}
	out := map[string]*string{}
	for k, r := range mm {
		if isNull(r) && nullValues {
			out[k] = nil
			continue
		}
		var s string
		if err := json.Unmarshal(r, &s); err != nil {
			v.add("string_type", with(with(l, key), k), "Input should be a valid string", anyOf(r), nil)
			continue
		}
		out[k] = &s
	}
	return out, true
}
