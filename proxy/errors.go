package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// Error codes of the proxy beyond the shared ones. They are returned as
// *gpuproxy.Error codes and mapped to HTTP statuses by HTTPStatus.
const (
	// CodeUpstream: the instance could not be reached or its answer was
	// unusable (connection refused or reset, a redirect off the instance,
	// a response over the size bound) — HTTP 502.
	CodeUpstream = "upstream_error"
	// CodeUpstreamTimeout: the instance did not answer within
	// UpstreamTimeout — HTTP 504.
	CodeUpstreamTimeout = "upstream_timeout"
	// CodeOverloaded: gpuproxy itself ran out of something (open files,
	// local ports, socket buffers, memory) on the way to the instance —
	// HTTP 503 with Retry-After. Not held against the instance.
	CodeOverloaded = "overloaded"
)

// HTTPStatus maps an error to its HTTP status: the proxy's own codes, then
// the API's one table for the shared codes (httpapi.Status).
func HTTPStatus(err error) int {
	switch gpuproxy.ErrorCode(err) {
	case CodeUpstream:
		return http.StatusBadGateway
	case CodeUpstreamTimeout:
		return http.StatusGatewayTimeout
	case CodeOverloaded:
		return http.StatusServiceUnavailable
	}
	return httpapi.Status(err)
}

// statusClientClosed is recorded (never sent) when the caller went away
// before an answer, as nginx does.
const statusClientClosed = 499

// writeError renders err in the API's one error shape and returns the
// status written. Internal errors are logged and shown as
// "internal error".
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) int {
	status := HTTPStatus(err)
	switch code := gpuproxy.ErrorCode(err); code {
	case gpuproxy.EINTERNAL:
		log.Error("proxy request failed", "request_id", w.Header().Get("X-Request-Id"), "err", err)
	case gpuproxy.EUNAVAILABLE, CodeUpstream, CodeUpstreamTimeout:
		log.Warn("proxy request failed", "request_id", w.Header().Get("X-Request-Id"), "code", code, "err", err)
	}
	if s, ok := gpuproxy.ErrorDetails(err)["retry_after_seconds"].(int); ok {
		w.Header().Set("Retry-After", strconv.Itoa(s))
	}
	httpapi.WriteError(w, r, status, err)
	return status
}

// upstreamErr classifies a failed exchange with an instance: a refusal by
// the address policy stays a refusal, the caller going away is returned as
// is, a limit of gpuproxy's own is overloaded (503, see ownLimit), a
// deadline is a timeout (504), anything else is a 502.
func upstreamErr(instanceID string, timeout time.Duration, err error) error {
	var ge *gpuproxy.Error
	if errors.As(err, &ge) {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if limit := ownLimit(err); limit != "" {
		return overloaded(instanceID, limit, err)
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return &gpuproxy.Error{Code: CodeUpstreamTimeout, Cause: err,
			Message: "instance " + instanceID + " did not answer within " + timeout.String(),
			Details: map[string]any{"instance_id": instanceID, "timeout_seconds": timeout.Seconds()}}
	}
	return &gpuproxy.Error{Code: CodeUpstream, Cause: err,
		Message: "instance " + instanceID + " could not be reached",
		Details: map[string]any{"instance_id": instanceID}}
}
