package gpuproxy

import (
	"errors"
	"fmt"
)

// Error codes shared by every transport. Each transport maps them once: to an
// HTTP status in server, to a JSON-RPC error or isError result in mcp.
const (
	EINVALID      = "invalid"
	ENOTFOUND     = "not_found"
	ECONFLICT     = "conflict"
	EUNAUTHORIZED = "unauthorized"
	EFORBIDDEN    = "forbidden"
	ELIMIT        = "spending_limit_exceeded"
	ECONFIRM      = "confirmation_required" // a person must confirm the cost (details carry a confirm token)
	ERATELIMITED  = "rate_limited"
	EUNAVAILABLE  = "unavailable"
	EPROVIDER     = "provider_unavailable"
	EGONE         = "offer_gone"
	ENOMATCH      = "no_matching_offer" // a rent by spec found no offer it could rent (details name the nearest misses)
	ETOOLARGE     = "too_large"
	EINTERNAL     = "internal"
)

// Error is the application error: a machine-readable code, a message safe to
// show the caller, and optional structured details (e.g. window numbers).
type Error struct {
	Code    string
	Message string
	Details map[string]any
	// Cause is the underlying error, for logs only; never shown to callers.
	Cause error
}

// Error implements the error interface.
func (e *Error) Error() string {
	if e.Cause != nil {
		return e.Code + ": " + e.Message + ": " + e.Cause.Error()
	}
	return e.Code + ": " + e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Errorf returns an *Error with the given code and formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an EINVALID error naming the offending field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: EINVALID, Message: field + ": " + fmt.Sprintf(format, args...),
		Details: map[string]any{"field": field}}
}

// ErrorCode returns the code of the first *Error in err's chain, EINTERNAL
// for any other non-nil error, and "" for nil.
func ErrorCode(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	default:
		return EINTERNAL
	}
}

// ErrorMessage returns the caller-safe message of err: the *Error message,
// or "internal error" for anything else.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// ErrorDetails returns the details of the first *Error in err's chain.
func ErrorDetails(err error) map[string]any {
	var e *Error
	if errors.As(err, &e) {
		return e.Details
	}
	return nil
}
