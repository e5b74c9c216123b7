package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/aiserve/gpuproxy"
)

// statusOf is the one mapping from application error codes to HTTP.
var statusOf = map[string]int{
	gpuproxy.EINVALID:      http.StatusBadRequest,
	gpuproxy.ENOTFOUND:     http.StatusNotFound,
	gpuproxy.ECONFLICT:     http.StatusConflict,
	gpuproxy.EGONE:         http.StatusConflict,
	gpuproxy.ENOMATCH:      http.StatusConflict,
	gpuproxy.EUNAUTHORIZED: http.StatusUnauthorized,
	gpuproxy.EFORBIDDEN:    http.StatusForbidden,
	gpuproxy.ELIMIT:        http.StatusPaymentRequired,
	gpuproxy.ECONFIRM:      http.StatusPreconditionRequired,
	gpuproxy.ERATELIMITED:  http.StatusTooManyRequests,
	gpuproxy.EUNAVAILABLE:  http.StatusServiceUnavailable,
	gpuproxy.EPROVIDER:     http.StatusServiceUnavailable,
	gpuproxy.ETOOLARGE:     http.StatusRequestEntityTooLarge,
	gpuproxy.EINTERNAL:     http.StatusInternalServerError,
}

// Status returns the HTTP status for an application error (500 for a code
// it does not know).
func Status(err error) int {
	if s, ok := statusOf[gpuproxy.ErrorCode(err)]; ok {
		return s
	}
	return http.StatusInternalServerError
}

type errorBody struct {
	Error errorPayload `json:"error"`
}

type errorPayload struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// WriteError writes err with status in the API's one error shape
// {"error":{"code","message","details"}}. An internal error's message and
// details are replaced by "internal error" (log it first).
func WriteError(w http.ResponseWriter, r *http.Request, status int, err error) {
	code := gpuproxy.ErrorCode(err)
	body := errorBody{errorPayload{Code: code, Message: gpuproxy.ErrorMessage(err), Details: gpuproxy.ErrorDetails(err)}}
	if code == gpuproxy.EINTERNAL {
		body.Error.Message, body.Error.Details = "internal error", nil
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_ = json.NewEncoder(w).Encode(body)
	}
}
