package mcp

import (
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"strings"
)

// The go-sdk's schema validator reports invalid arguments in its own
// terms ("validating \"arguments\": validating root: validating
// /properties/x: type: <invalid reflect.Value> has type \"null\", want
// \"number\""). A model reads these: plainArgError restates them as the
// argument, what was expected and what came.

const sdkArgPrefix = `validating "arguments": `

var (
	reArgPath    = regexp.MustCompile(`validating (/properties/[^:]+): `)
	reArgType    = regexp.MustCompile(`type: .* has type "([a-z]+)", want "?([a-z ,"\[\]]+?)"?$`)
	reArgMin     = regexp.MustCompile(`(exclusiveMinimum|minimum): .* is less than( or equal to)? ([-0-9.e+]+)$`)
	reArgMax     = regexp.MustCompile(`(exclusiveMaximum|maximum): .* is greater than( or equal to)? ([-0-9.e+]+)$`)
	reArgEnum    = regexp.MustCompile(`enum: .* does not equal any of: \[(.*)\]$`)
	reArgMissing = regexp.MustCompile(`required: missing properties: \[(.*)\]$`)
	reArgExtra   = regexp.MustCompile(`unexpected additional properties \[(.*)\]$`)
	// The SDK decodes the arguments into a map before validating them: a
	// number out of float64's range (1e400) fails there, its field
	// buried in a Go type's name.
	reArgUnmarshal = regexp.MustCompile(`unmarshaling arguments: json: cannot unmarshal "?([^"]*?)"? into Go struct field ` +
		`(?:map\[string\]interface \{\})*\.?([A-Za-z_0-9.]+) of type ([a-z0-9]+)`)
	reArgLen = regexp.MustCompile(`(maxLength|minLength|maxItems|minItems|maxProperties|minProperties): .*?([0-9]+)$`)
)

// plainArgError rewrites the go-sdk's message about invalid arguments
// (msg) for a reader; args are the call's arguments, to show what came.
// Messages that are not the validator's are returned unchanged.
func plainArgError(tool, msg string, args json.RawMessage) string {
	if !strings.HasPrefix(msg, sdkArgPrefix) {
		return msg
	}
	if m := reArgUnmarshal.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("invalid arguments for %s: argument %s must be a number in its range (see the tool's "+
			"input schema), got %s. Check the tool's input schema and call it again.", tool, m[2], m[1])
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(msg, sdkArgPrefix), "validating root: ")
	field, item := "", false
	if ms := reArgPath.FindAllStringSubmatch(rest, -1); len(ms) > 0 {
		field, item = argPath(ms[len(ms)-1][1])
		rest = rest[strings.LastIndex(rest, ms[len(ms)-1][0])+len(ms[len(ms)-1][0]):]
	}
	subject := "argument " + field
	if item {
		subject = "each item of argument " + field
	}
	got := ""
	if field != "" {
		got = ", got " + shownArg(args, field)
	}
	var out string
	var m []string
	switch {
	case reArgMissing.MatchString(rest):
		m = reArgMissing.FindStringSubmatch(rest)
		out = fmt.Sprintf("missing required argument%s %s", plural(m[1]), names(field, m[1]))
	case reArgExtra.MatchString(rest):
		m = reArgExtra.FindStringSubmatch(rest)
		out = fmt.Sprintf("unknown argument%s %s", plural(m[1]), names(field, m[1]))
	case reArgType.MatchString(rest):
		m = reArgType.FindStringSubmatch(rest)
		want := strings.NewReplacer(`"`, "", "[", "", "]", "", ",", " or").Replace(m[2])
		out = fmt.Sprintf("%s must be %s%s", subject, article(want), got)
	case reArgMin.MatchString(rest):
		m = reArgMin.FindStringSubmatch(rest)
		cmp := "at least"
		if m[1] == "exclusiveMinimum" {
			cmp = "greater than"
		}
		out = fmt.Sprintf("%s must be %s %s%s", subject, cmp, plainNumber(m[3]), got)
	case reArgMax.MatchString(rest):
		m = reArgMax.FindStringSubmatch(rest)
		cmp := "at most"
		if m[1] == "exclusiveMaximum" {
			cmp = "less than"
		}
		out = fmt.Sprintf("%s must be %s %s%s", subject, cmp, plainNumber(m[3]), got)
	case reArgEnum.MatchString(rest):
		m = reArgEnum.FindStringSubmatch(rest)
		out = fmt.Sprintf("%s must be one of %s%s", subject, strings.Join(strings.Fields(m[1]), ", "), got)
	case reArgLen.MatchString(rest):
		m = reArgLen.FindStringSubmatch(rest)
		what := map[string]string{"maxLength": "at most %s characters long", "minLength": "at least %s characters long",
			"maxItems": "a list of at most %s items", "minItems": "a list of at least %s items",
			"maxProperties": "an object of at most %s entries", "minProperties": "an object of at least %s entries"}[m[1]]
		out = fmt.Sprintf("%s must be "+what, subject, m[2])
	default:
		out = strings.ReplaceAll(rest, "<invalid reflect.Value>", "null")
		if field != "" {
			out = subject + ": " + out
		}
	}
	return fmt.Sprintf("invalid arguments for %s: %s. Check the tool's input schema and call it again.", tool, out)
}

// argPath names the argument a validator's schema path is about, as
// "spec.gpu" for "/properties/spec/properties/gpu", and reports whether it
// is about each item of it (an array's items, an object's values).
func argPath(path string) (field string, item bool) {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	var parts []string
	for i := 0; i < len(segs); i++ {
		switch segs[i] {
		case "properties":
			if i+1 < len(segs) {
				parts = append(parts, segs[i+1])
				i++
			}
		case "items", "additionalProperties":
			item = true
		}
	}
	return strings.Join(parts, "."), item
}

// shownArg renders the value the caller sent for field ("spec.gpu" is
// the gpu of the spec object), briefly.
func shownArg(args json.RawMessage, field string) string {
	v := args
	for _, name := range strings.Split(field, ".") {
		var m map[string]json.RawMessage
		if json.Unmarshal(v, &m) != nil {
			return "nothing"
		}
		var ok bool
		if v, ok = m[name]; !ok {
			return "nothing"
		}
	}
	s := string(v)
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// names renders the validator's quoted, space-separated list of names,
// each under its object's argument when it is nested ("spec.gpu").
func names(parent, list string) string {
	var out []string
	for _, f := range strings.Fields(list) {
		name := strings.Trim(f, `"`)
		if parent != "" {
			name = parent + "." + name
		}
		out = append(out, name)
	}
	return strings.Join(out, ", ")
}

func plural(list string) string {
	if len(strings.Fields(list)) > 1 {
		return "s"
	}
	return ""
}

// article prefixes a JSON type name ("number", "string or null") with a or
// an; the validator's "one of string, array" becomes "a string or an array".
func article(t string) string {
	if rest, ok := strings.CutPrefix(t, "one of "); ok {
		var out []string
		for _, one := range strings.Split(rest, " or ") {
			out = append(out, article(strings.TrimSpace(one)))
		}
		return strings.Join(out, " or ")
	}
	switch {
	case t == "null":
		return "null"
	case strings.HasPrefix(t, "a") || strings.HasPrefix(t, "i") || strings.HasPrefix(t, "o"):
		return "an " + t
	}
	return "a " + t
}

// plainNumber renders the validator's bound ("0.000000", "1e+09") plainly.
func plainNumber(s string) string {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return s
	}
	if r.IsInt() {
		return r.Num().String()
	}
	return strings.TrimRight(strings.TrimRight(r.FloatString(6), "0"), ".")
}
