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
	reArgLen     = regexp.MustCompile(`(maxLength|minLength|maxItems|minItems|maxProperties|minProperties): .*?([0-9]+)$`)
)

// plainArgError rewrites the go-sdk's message about invalid arguments
// (msg) for a reader; args are the call's arguments, to show what came.
// Messages that are not the validator's are returned unchanged.
func plainArgError(tool, msg string, args json.RawMessage) string {
	if !strings.HasPrefix(msg, sdkArgPrefix) {
		return msg
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(msg, sdkArgPrefix), "validating root: ")
	field, item := "", false
	if ms := reArgPath.FindAllStringSubmatch(rest, -1); len(ms) > 0 {
		parts := strings.Split(strings.TrimPrefix(ms[0][1], "/properties/"), "/")
		field = parts[0]
		item = len(ms) > 1 || strings.Contains(ms[len(ms)-1][1], "/items")
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
		out = fmt.Sprintf("missing required argument%s %s", plural(m[1]), names(m[1]))
	case reArgExtra.MatchString(rest):
		m = reArgExtra.FindStringSubmatch(rest)
		out = fmt.Sprintf("unknown argument%s %s", plural(m[1]), names(m[1]))
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

// shownArg renders the value the caller sent for field, briefly.
func shownArg(args json.RawMessage, field string) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(args, &m) != nil {
		return "nothing"
	}
	v, ok := m[field]
	if !ok {
		return "nothing"
	}
	s := string(v)
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// names renders the validator's quoted, space-separated list of names.
func names(list string) string {
	var out []string
	for _, f := range strings.Fields(list) {
		out = append(out, strings.Trim(f, `"`))
	}
	return strings.Join(out, ", ")
}

func plural(list string) string {
	if len(strings.Fields(list)) > 1 {
		return "s"
	}
	return ""
}

// article prefixes a JSON type name ("number", "string or null") with a or an.
func article(t string) string {
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
