package vastai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode"

	"github.com/aiserve/gpuproxy/providers"
)

// reply is the common envelope of vast.ai replies and error bodies:
// {"success":false,"error":"<slug>","msg":"<text>"}, sometimes with only msg,
// message or detail, and for creates possibly new_contract.
type reply struct {
	Success     *bool           `json:"success"`
	Error       text            `json:"error"`
	Msg         text            `json:"msg"`
	Message     text            `json:"message"`
	Detail      json.RawMessage `json:"detail"`
	NewContract idValue         `json:"new_contract"`
}

// parseReply decodes the envelope; ok is false when the body is not a JSON
// object (e.g. the plain-text 429 "API requests too frequent").
func parseReply(body []byte) (r reply, ok bool) {
	trimmed := strings.TrimSpace(string(body))
	if !strings.HasPrefix(trimmed, "{") {
		return reply{}, false
	}
	if json.Unmarshal(body, &r) != nil {
		return reply{}, false
	}
	return r, true
}

// failed reports whether a parsed 2xx reply is an error (success:false).
func (r reply) failed() bool { return r.Success != nil && !*r.Success }

// message picks the most useful human text from a reply.
func (r reply) message(body []byte, status int) string {
	var detail string
	if len(r.Detail) > 0 && string(r.Detail) != "null" {
		if json.Unmarshal(r.Detail, &detail) != nil {
			detail = string(r.Detail)
		}
	}
	for _, s := range []string{string(r.Msg), string(r.Message), detail} {
		if s != "" {
			if r.Error != "" && !strings.Contains(s, string(r.Error)) {
				return string(r.Error) + ": " + s
			}
			return s
		}
	}
	if r.Error != "" {
		return string(r.Error)
	}
	if t := plainText(body); t != "" {
		return t
	}
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "no message"
}

// plainText makes a short one-line excerpt of a non-JSON body.
func plainText(body []byte) string {
	s := strings.TrimSpace(string(body))
	if strings.HasPrefix(s, "{") || strings.HasPrefix(s, "<") {
		return "" // JSON without known fields, or an HTML error page
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// slugIn reports whether the reply's slug or message names one of slugs.
func (r reply) slugIn(slugs ...string) bool {
	for _, s := range slugs {
		if string(r.Error) == s || strings.Contains(string(r.Msg), s) ||
			strings.Contains(string(r.Message), s) {
			return true
		}
	}
	return false
}

// authProblem reports messages that mean the credentials were refused, even
// when the status is 404 (some endpoints answer an unknown key with 404).
func (r reply) authProblem() bool {
	if r.Error == "auth_error" {
		return true
	}
	m := strings.ToLower(string(r.Msg) + " " + string(r.Message))
	for _, s := range []string{"invalid user key", "requires login", "session expired", "two factor"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// goneSlugs name a missing offer or instance.
var goneSlugs = []string{"no_such_ask", "no_such_instance", "not_found"}

// classify maps a non-successful reply of a safe call to a Kind.
func classify(status int, r reply) providers.Kind {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden || r.authProblem():
		return providers.KindAuth
	case status == http.StatusTooManyRequests || r.Error == "rate_limit_exceeded":
		return providers.KindRateLimited
	case status >= 500:
		return providers.KindUnavailable
	case status == http.StatusNotFound || status == http.StatusGone || r.slugIn(goneSlugs...):
		return providers.KindNotFound
	default:
		return providers.KindInvalid
	}
}

// classifyCreate maps a reply to a create that revealed no new_contract.
// A 5xx or a malformed 2xx leaves the outcome unknown; the other cases are
// definite refusals.
func classifyCreate(status int, r reply, isJSON bool) providers.Kind {
	switch {
	case status >= 500:
		return providers.KindAmbiguous
	case status >= 200 && status < 300 && (!isJSON || !r.failed()):
		return providers.KindAmbiguous // "success" without an instance id
	case status == http.StatusUnauthorized || r.authProblem():
		return providers.KindAuth
	case status == http.StatusTooManyRequests || r.Error == "rate_limit_exceeded":
		return providers.KindRateLimited
	case status == http.StatusNotFound || status == http.StatusGone || r.slugIn("no_such_ask"):
		return providers.KindGone
	case status == http.StatusForbidden && (r.Error == "" || r.Error == "auth_error"):
		return providers.KindAuth
	default:
		return providers.KindInvalid
	}
}

// apiError builds a classified error from a reply, with the API key scrubbed.
func (a *Adapter) apiError(kind providers.Kind, op string, resp *providers.Response, r reply) *providers.Error {
	msg := r.message(resp.Body, resp.Status)
	return &providers.Error{
		Provider: providers.VastAI,
		Kind:     kind,
		Status:   resp.Status,
		Message:  a.scrub(fmt.Sprintf("%s: %s (HTTP %d)", op, msg, resp.Status)),
	}
}

// errorf builds a classified error without an HTTP reply.
func (a *Adapter) errorf(kind providers.Kind, format string, args ...any) *providers.Error {
	return &providers.Error{Provider: providers.VastAI, Kind: kind,
		Message: a.scrub(fmt.Sprintf(format, args...))}
}

// wrapTransport adds the operation to an error from providers.Client.Do
// (transport failure, timeout or open breaker), keeping its Kind.
func (a *Adapter) wrapTransport(op string, err error) error {
	var pe *providers.Error
	if errors.As(err, &pe) {
		cp := *pe
		cp.Message = a.scrub(op + ": " + pe.Message)
		return &cp
	}
	return a.errorf(providers.KindUnavailable, "%s: %v", op, err)
}

// scrub removes the API key from a message, whatever echoed it.
func (a *Adapter) scrub(s string) string {
	if k := a.opts.APIKey; len(k) >= 4 {
		s = strings.ReplaceAll(s, k, "[redacted]")
	}
	return s
}
