package ionet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aiserve/gpuproxy/providers"
)

// op names the adapter call in error messages ("creating deployment").
type op struct {
	name   string
	unsafe bool // a create: 5xx and transport failures are ambiguous
	// gone404 maps 404 to KindGone (a deployment or offer that existed and
	// is no longer there) instead of KindNotFound.
	gone404 bool
}

// httpError classifies a non-2xx reply. 401/403 → auth; 404 → not found (or
// gone); 409 and capacity 400s → gone; 410 → gone; 422 → invalid with the
// FastAPI field messages; 429 → rate limited; 5xx → unavailable, or
// ambiguous for a create; any other 4xx → invalid.
func (a *Adapter) httpError(o op, r *providers.Response) *providers.Error {
	msg := detailMessage(r.Body)
	if msg == "" {
		msg = http.StatusText(r.Status)
	}
	kind := providers.KindInvalid
	switch s := r.Status; {
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		kind = providers.KindAuth
	case s == http.StatusNotFound:
		kind = providers.KindNotFound
		if o.gone404 {
			kind = providers.KindGone
		}
	case s == http.StatusGone:
		kind = providers.KindGone
	case s == http.StatusConflict:
		kind = providers.KindGone
		if nameConflict(msg) {
			kind = providers.KindInvalid
		}
	case s == http.StatusBadRequest:
		if noCapacity(msg) {
			kind = providers.KindGone
		}
	case s == http.StatusTooManyRequests:
		kind = providers.KindRateLimited
	case s >= 500 || s < 400:
		kind = providers.KindUnavailable
		if o.unsafe {
			kind = providers.KindAmbiguous
			msg += " (the deployment may have been created; match it by resource_private_name)"
		}
	}
	return &providers.Error{Provider: providers.IONet, Kind: kind, Status: r.Status,
		Message: a.redact(fmt.Sprintf("%s: HTTP %d: %s", o.name, r.Status, msg))}
}

// wrapErr puts the op name on an error from Client.Do (already classified
// and free of URLs) or any other error, keeping its kind.
func (a *Adapter) wrapErr(o op, err error) error {
	var pe *providers.Error
	if errors.As(err, &pe) {
		cp := *pe
		cp.Message = a.redact(o.name + ": " + pe.Message)
		cp.Err = err
		return &cp
	}
	kind := providers.KindUnavailable
	if o.unsafe {
		kind = providers.KindAmbiguous
	}
	return &providers.Error{Provider: providers.IONet, Kind: kind,
		Message: a.redact(o.name + ": " + err.Error()), Err: err}
}

// decodeErr reports a 2xx reply we could not read. For a create it is
// ambiguous: the deployment may exist.
func (a *Adapter) decodeErr(o op, err error) error {
	kind := providers.KindUnavailable
	if o.unsafe {
		kind = providers.KindAmbiguous
	}
	return &providers.Error{Provider: providers.IONet, Kind: kind,
		Message: a.redact(o.name + ": unreadable reply: " + err.Error()), Err: err}
}

// redact removes the API key from a message, in case a server echoes it.
func (a *Adapter) redact(s string) string {
	if len(a.key) >= 4 {
		s = strings.ReplaceAll(s, a.key, "[redacted]")
	}
	return s
}

// detailMessage extracts FastAPI's error detail: a string, or a validation
// list rendered as "body.container_config.traffic_port: Field required
// (missing); ...". Other bodies are returned trimmed and shortened.
func detailMessage(body []byte) string {
	var env struct {
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &env) == nil && len(env.Detail) > 0 && string(env.Detail) != "null" {
		var s string
		if json.Unmarshal(env.Detail, &s) == nil {
			return shorten(s)
		}
		var items []struct {
			Loc  []any  `json:"loc"`
			Msg  string `json:"msg"`
			Type string `json:"type"`
		}
		if json.Unmarshal(env.Detail, &items) == nil && len(items) > 0 {
			parts := make([]string, 0, len(items))
			for _, it := range items {
				loc := make([]string, 0, len(it.Loc))
				for _, l := range it.Loc {
					loc = append(loc, fmt.Sprint(l))
				}
				p := strings.Join(loc, ".") + ": " + it.Msg
				if it.Type != "" {
					p += " (" + it.Type + ")"
				}
				parts = append(parts, p)
			}
			return shorten(strings.Join(parts, "; "))
		}
		return shorten(string(env.Detail))
	}
	return shorten(strings.TrimSpace(string(body)))
}

func shorten(s string) string {
	const limit = 400
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

// noCapacity recognises a 400 that means the hardware is no longer there.
func noCapacity(msg string) bool {
	m := strings.ToLower(msg)
	for _, w := range []string{"capacity", "not enough", "insufficient replicas",
		"no available", "not available", "unavailable", "sold out", "available replicas"} {
		if strings.Contains(m, w) {
			return true
		}
	}
	return false
}

// nameConflict recognises a 409 about a duplicate resource_private_name.
func nameConflict(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "name") || strings.Contains(m, "exist") || strings.Contains(m, "unique")
}
