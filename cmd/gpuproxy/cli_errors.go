package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy"
)

// flagOf maps the fields the services name in their errors (the API's
// field paths) to the CLI's flags.
var flagOf = map[string]string{
	"windows":       "--window",
	"on_exceed":     "--on-exceed",
	"webhook_url":   "--webhook",
	"thresholds":    "--thresholds",
	"amount":        "--amount",
	"description":   "--description",
	"scopes":        "--scopes",
	"confirm_above": "--confirm-above",
	"status":        "--status",
	"limit":         "--limit",
}

// cliErr shows an application error's message, not its internals, naming
// the CLI's flag instead of the API's field ("--on-exceed", not
// "on_exceed").
func cliErr(err error) error { return argErr(err, nil, nil) }

// argErr is cliErr for a command that names some fields its own way
// (names: field → flag or argument, e.g. "name" → "NAME") and was given
// windows, the --window values in order, so that an error about the
// API's windows[i] names the i-th as typed: "--window 1h=6: duplicate
// window of 60 minutes".
func argErr(err error, names map[string]string, windows []string) error {
	if err == nil {
		return nil
	}
	code := gpuproxy.ErrorCode(err)
	if code == gpuproxy.EINTERNAL {
		msg := err.Error()
		// parseWindowFlags's own errors: `window "60=5": a unit is required`.
		if len(windows) > 0 && strings.HasPrefix(msg, `window "`) {
			return errors.New("--" + msg)
		}
		return err
	}
	msg := gpuproxy.ErrorMessage(err)
	field, _ := gpuproxy.ErrorDetails(err)["field"].(string)
	if rest, ok := strings.CutPrefix(msg, field+": "); ok && field != "" {
		if name, what := cliField(field, names, windows); name != "" {
			if what != "" && strings.HasPrefix(rest, "must be between") {
				rest = what + " " + rest
				if what == "duration" {
					rest += " minutes"
				}
			}
			msg = name + ": " + rest
		}
	}
	return errors.New(msg)
}

// cliField is the flag or argument for an API field path, and for a
// window's part, which part ("limit" or "duration"); "" when the field
// has no CLI name.
func cliField(field string, names map[string]string, windows []string) (name, what string) {
	if n, ok := names[field]; ok {
		return n, ""
	}
	if n, ok := flagOf[field]; ok {
		return n, ""
	}
	// base[i] or base[i].part
	base, idx, ok := strings.Cut(field, "[")
	if !ok {
		return "", ""
	}
	idx, part, _ := strings.Cut(idx, "]")
	i, err := strconv.Atoi(idx)
	flag := names[base]
	if flag == "" {
		flag = flagOf[base]
	}
	if err != nil || flag == "" {
		return "", ""
	}
	if base != "windows" {
		return fmt.Sprintf("%s[%d]", flag, i), ""
	}
	switch part {
	case ".limit":
		what = "limit"
	case ".window_minutes":
		what = "duration"
	}
	if i >= 0 && i < len(windows) {
		return flag + " " + windows[i], what
	}
	return fmt.Sprintf("%s #%d", flag, i+1), what
}
