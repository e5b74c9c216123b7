package vastaisim

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// fieldAliases are the CLI's field aliases.
var fieldAliases = map[string]string{
	"dph": "dph_total", "cuda_vers": "cuda_max_good", "display_active": "gpu_display_active",
	"dlperf_usd": "dlperf_per_dphtotal", "flops_usd": "flops_per_dphtotal",
}

// reservedKeys are the top-level query keys that are not filters.
var reservedKeys = map[string]bool{
	"order": true, "limit": true, "type": true, "allocated_storage": true, "disable_bundling": true,
}

// kind is what a filterable field holds, which decides how a filter value
// sent as a JSON string is read.
type kind int

const (
	kindAny     kind = iota // no conversion (unknown, or compared as sent)
	kindNumber              // a number; numeric strings are converted
	kindBool                // a boolean; "true"/"false" strings are converted
	kindText                // a string
	kindVersion             // driver_version: "535.86.05" rows, 535086005 filters
)

// filter is one parsed {"field":{"op":value}} clause.
type filter struct {
	field, op string
	value     any
}

var validOps = map[string]bool{"eq": true, "neq": true, "gt": true, "gte": true, "lt": true, "lte": true,
	"in": true, "notin": true}

// filterError is a filter the server refuses, naming the field as sent.
type filterError struct{ msg string }

func (e *filterError) Error() string { return e.msg }

// parseFilters reads the flat filter object. known says which fields may be
// filtered; kindOf (nil: none known) how to read values sent as strings.
// The official client sends every value without a unit multiplier as a
// JSON string ({"num_gpus":{"eq":"1"}}, {"dph_total":{"lt":"2"}}), and
// vast.ai converts them: so does this.
func parseFilters(q map[string]any, known func(string) bool, kindOf func(string) kind) ([]filter, error) {
	var out []filter
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if reservedKeys[k] {
			continue
		}
		field := k
		if a, ok := fieldAliases[k]; ok {
			field = a
		}
		if !known(field) {
			return nil, &filterError{fmt.Sprintf("unknown filter field %q", k)}
		}
		ops, ok := q[k].(map[string]any)
		if !ok { // a bare value is read as eq
			ops = map[string]any{"eq": q[k]}
		}
		fk := kindAny
		if kindOf != nil {
			fk = kindOf(field)
		}
		opNames := make([]string, 0, len(ops))
		for op := range ops {
			opNames = append(opNames, op)
		}
		sort.Strings(opNames)
		for _, op := range opNames {
			v := ops[op]
			if !validOps[op] {
				return nil, &filterError{fmt.Sprintf("unknown operator %q on %q", op, k)}
			}
			list, isList := v.([]any)
			if (op == "in" || op == "notin") && !isList {
				return nil, &filterError{fmt.Sprintf("operator %q on %q needs a list", op, k)}
			}
			if field == "gpu_name" {
				v = normalizeNames(v)
			} else if isList {
				conv := make([]any, len(list))
				for i, x := range list {
					c, err := coerce(k, fk, x)
					if err != nil {
						return nil, err
					}
					conv[i] = c
				}
				v = conv
			} else {
				c, err := coerce(k, fk, v)
				if err != nil {
					return nil, err
				}
				v = c
			}
			out = append(out, filter{field, op, v})
		}
	}
	return out, nil
}

// coerce reads a filter value for a field of kind fk: numeric strings
// become numbers, "true"/"false" booleans. A string that cannot be read
// for a numeric or boolean field is refused, naming the field as sent.
func coerce(name string, fk kind, v any) (any, error) {
	s, isString := v.(string)
	if !isString || fk == kindAny || fk == kindText {
		return v, nil
	}
	t := strings.TrimSpace(s)
	if b, ok := parseBool(t); ok {
		return b, nil
	}
	if f, err := strconv.ParseFloat(t, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
		if fk == kindBool && f != 0 && f != 1 {
			return nil, &filterError{fmt.Sprintf("invalid value %q for %s: true or false expected", s, name)}
		}
		return f, nil
	}
	if fk == kindVersion {
		if n, ok := versionNumber(t); ok {
			return n, nil
		}
		return nil, &filterError{fmt.Sprintf("invalid value %q for %s: a driver version such as 535.86.05 expected", s, name)}
	}
	if fk == kindBool {
		return nil, &filterError{fmt.Sprintf("invalid value %q for %s: true or false expected", s, name)}
	}
	return nil, &filterError{fmt.Sprintf("invalid value %q for %s: a number expected", s, name)}
}

// parseBool reads the spellings of a boolean the CLI and people use.
func parseBool(s string) (bool, bool) {
	switch strings.ToLower(s) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// versionNumber turns a driver version into the CLI's number: each of up
// to three parts zero-padded to three digits (535.86.05 → 535086005,
// 550.120 → 550120000).
func versionNumber(s string) (float64, bool) {
	parts := strings.Split(s, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return 0, false
	}
	n := 0.0
	for i := range 3 {
		p := 0
		if i < len(parts) {
			v, err := strconv.Atoi(parts[i])
			if err != nil || v < 0 || v > 999 {
				return 0, false
			}
			p = v
		}
		n = n*1000 + float64(p)
	}
	return n, true
}

// normalizeNames turns CLI spelling (RTX_4090) into wire spelling.
func normalizeNames(v any) any {
	switch t := v.(type) {
	case string:
		return strings.ReplaceAll(t, "_", " ")
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = normalizeNames(x)
		}
		return out
	}
	return v
}

// matches reports whether row satisfies every filter.
func matches(row map[string]any, fs []filter) bool {
	for _, f := range fs {
		if !f.match(row) {
			return false
		}
	}
	return true
}

// value reads a field, computing the filter-only names verified and
// datacenter from verification and hosting_type.
func value(row map[string]any, field string) any {
	switch field {
	case "verified":
		return row["verification"] == "verified"
	case "datacenter":
		return row["hosting_type"] == float64(1)
	}
	return row[field]
}

func (f filter) match(row map[string]any) bool {
	v := value(row, f.field)
	switch f.field {
	case "geolocation": // filters take country codes; rows say "Texas, US"
		if s, ok := v.(string); ok {
			if i := strings.LastIndex(s, ", "); i >= 0 {
				v = s[i+2:]
			}
		}
	case "driver_version": // rows say "535.86.05", filters 535086005
		if s, ok := v.(string); ok {
			if n, ok := versionNumber(s); ok {
				v = n
			}
		}
	}
	switch f.op {
	case "eq":
		return equal(v, f.value)
	case "neq":
		return !equal(v, f.value)
	case "in", "notin":
		found := false
		for _, x := range f.value.([]any) {
			found = found || equal(v, x)
		}
		return found == (f.op == "in")
	}
	c, ok := compare(v, f.value)
	if !ok {
		return false
	}
	switch f.op {
	case "gt":
		return c > 0
	case "gte":
		return c >= 0
	case "lt":
		return c < 0
	default: // lte
		return c <= 0
	}
}

// equal compares JSON values; null reads as false, booleans as 0/1.
func equal(a, b any) bool {
	if a == nil {
		a = false
	}
	if b == nil {
		b = false
	}
	if c, ok := compare(a, b); ok {
		return c == 0
	}
	return a == b
}

// compare orders two JSON values of the same kind. A number (or boolean)
// compared with a numeric string reads the string as a number, as vast.ai
// does for filters whose field kind parseFilters did not know.
func compare(a, b any) (int, bool) {
	num := func(x, other any) (float64, bool) {
		switch t := x.(type) {
		case float64:
			return t, true
		case bool:
			if t {
				return 1, true
			}
			return 0, true
		case string:
			if _, otherIsString := other.(string); otherIsString {
				return 0, false
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
			return f, err == nil
		}
		return 0, false
	}
	if x, ok := num(a, b); ok {
		if y, ok := num(b, a); ok {
			switch {
			case x < y:
				return -1, true
			case x > y:
				return 1, true
			}
			return 0, true
		}
	}
	if x, ok := a.(string); ok {
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), true
		}
	}
	return 0, false
}

// orderKey is one [field, "asc"|"desc"] pair.
type orderKey struct {
	field string
	desc  bool
}

// parseOrder reads [[field, dir], ...], tolerating one bare pair.
func parseOrder(v any) ([]orderKey, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("order must be a list of [field, direction] pairs")
	}
	if len(list) == 2 {
		if _, ok := list[0].(string); ok {
			list = []any{list}
		}
	}
	var out []orderKey
	for _, p := range list {
		pair, ok := p.([]any)
		if !ok || len(pair) == 0 {
			return nil, fmt.Errorf("order must be a list of [field, direction] pairs")
		}
		f, _ := pair[0].(string)
		if a, ok := fieldAliases[f]; ok {
			f = a
		}
		dir := "asc"
		if len(pair) > 1 {
			dir, _ = pair[1].(string)
		}
		out = append(out, orderKey{f, strings.EqualFold(dir, "desc")})
	}
	return out, nil
}

// sortRows orders rows by keys, missing values last.
func sortRows(rows []map[string]any, keys []orderKey) {
	sort.SliceStable(rows, func(i, j int) bool {
		for _, k := range keys {
			a, b := rows[i][k.field], rows[j][k.field]
			if a == nil || b == nil {
				if (a == nil) != (b == nil) {
					return b == nil
				}
				continue
			}
			c, ok := compare(a, b)
			if !ok || c == 0 {
				continue
			}
			return (c < 0) != k.desc
		}
		return false
	})
}

// toRow turns a value into a generic JSON object.
func toRow(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

// offerKinds are the kinds of the filterable offer fields: those of the
// Offer row, and the filter-only or unlisted fields the CLI knows.
var offerKinds = func() map[string]kind {
	m := map[string]kind{"verified": kindBool, "datacenter": kindBool, "flops_per_dphtotal": kindNumber,
		"cluster_id": kindNumber, "vms_enabled": kindBool, "has_avx": kindNumber, "pci_gen": kindNumber,
		"pcie_bw": kindNumber, "ubuntu_version": kindText, "bw_nvlink": kindNumber, "cpu_ghz": kindNumber,
		"gpu_display_active": kindBool, "gpu_max_power": kindNumber, "gpu_max_temp": kindNumber,
		"inet_down_cost": kindNumber, "inet_up_cost": kindNumber, "mobo_name": kindText}
	for k, v := range toRow(Offer{}) {
		switch v.(type) {
		case float64:
			m[k] = kindNumber
		case bool:
			m[k] = kindBool
		case string:
			m[k] = kindText
		default:
			m[k] = kindAny
		}
	}
	m["driver_version"] = kindVersion
	return m
}()

// offerKind is the kind of a filterable offer field.
func offerKind(field string) kind { return offerKinds[field] }

// isOfferField reports whether field may be filtered in a search.
func isOfferField(field string) bool {
	_, ok := offerKinds[field]
	return ok
}
