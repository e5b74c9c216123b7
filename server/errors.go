package server

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/internal/httpapi"
)

// errorHandler renders every error in the one shape
// {"error":{"code","message","details"}}; internal errors are logged and
// shown as "internal error".
func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		err = s.fromEchoError(he)
	}
	if errors.Is(err, context.Canceled) && c.Request().Context().Err() != nil {
		// The caller hung up mid-request: nobody reads an answer and
		// nothing here went wrong. The request log records it as 499 at
		// INFO, as it does every client-side outcome (4xx).
		c.Response().Status = statusClientClosed
		return
	}
	// Client mistakes (4xx: invalid input, unauthorized, not found, limit
	// exceeded…) are only in the request log, at INFO; ERROR is kept for
	// what an operator must look at.
	code := gpuproxy.ErrorCode(err)
	if code == gpuproxy.EINTERNAL || code == gpuproxy.EUNAVAILABLE {
		s.log.Error("request failed", "request_id", requestID(c), "code", code, "err", err)
	}
	httpapi.WriteError(c.Response(), c.Request(), httpapi.Status(err), err)
}

// statusClientClosed is recorded (never sent) when the caller went away
// before an answer, as nginx does.
const statusClientClosed = 499

func (s *Server) fromEchoError(he *echo.HTTPError) error {
	msg := fmt.Sprint(he.Message)
	switch he.Code {
	case http.StatusNotFound:
		return gpuproxy.Errorf(gpuproxy.ENOTFOUND, "no such route")
	case http.StatusMethodNotAllowed:
		return &gpuproxy.Error{Code: gpuproxy.EINVALID, Message: "method not allowed on this route"}
	case http.StatusRequestEntityTooLarge:
		return s.tooLarge()
	case http.StatusUnauthorized:
		return gpuproxy.Errorf(gpuproxy.EUNAUTHORIZED, "%s", msg)
	}
	if he.Code >= 400 && he.Code < 500 {
		return gpuproxy.Errorf(gpuproxy.EINVALID, "%s", strings.ToLower(msg))
	}
	return &gpuproxy.Error{Code: gpuproxy.EINTERNAL, Message: msg, Cause: he}
}

// bind decodes a JSON body strictly: unknown fields, wrong types, trailing
// data and oversize bodies are refused with a message naming the field,
// with the index of every array on its way ("windows[1].window_minutes").
func bind(c echo.Context, v any) error {
	b, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return jsonError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonErrorAt(err, gpuproxy.JSONErrorField(b, v, err))
	}
	if dec.More() {
		return gpuproxy.Invalid("body", "must contain one JSON object")
	}
	return nil
}

// jsonError is the invalid-input error of a body the JSON decoder
// refused with err, naming the field err names.
func jsonError(err error) error { return jsonErrorAt(err, "") }

// jsonErrorAt is jsonError naming field ("": the one err names) for a
// value of the wrong type or an unknown field: the caller found its full
// path in the body (gpuproxy.JSONErrorField), array indexes included.
func jsonErrorAt(err error, field string) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		// The limit the reader was given: the server's MaxBody.
		return &gpuproxy.Error{Code: gpuproxy.ETOOLARGE, Message: httpapi.BodyLimitMessage(mbe.Limit),
			Details: map[string]any{"limit_bytes": mbe.Limit}}
	case errors.As(err, &te):
		f := cmp.Or(field, te.Field, "body")
		return gpuproxy.Invalid(f, "must be %s, not %s", jsonKind(te.Type.Kind().String()), te.Value)
	case errors.As(err, &se):
		return gpuproxy.Invalid("body", "malformed JSON at offset %d", se.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := cmp.Or(field, strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
		return gpuproxy.Invalid(f, "unknown field")
	case errors.Is(err, io.EOF):
		return gpuproxy.Invalid("body", "a JSON object is required")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return gpuproxy.Invalid("body", "malformed JSON (truncated)")
	}
	var fe *fieldError
	if errors.As(err, &fe) {
		return gpuproxy.Invalid(fe.field, "%s", fe.msg)
	}
	return gpuproxy.Invalid("body", "%s", strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "int32", "float64", "uint":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return k
}

// fieldError is returned by custom field decoders to name their field.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// amount is a request field holding US dollars as a JSON number, decoded
// exactly to micro-dollars.
type amount struct {
	set   bool
	value gpuproxy.Micros
	raw   json.RawMessage
}

func (a *amount) UnmarshalJSON(b []byte) error {
	a.set, a.raw = true, append(json.RawMessage(nil), b...)
	return nil
}

// parse validates the amount for field: a number, ≥ 0 (or > 0 when
// positive), at most gpuproxy.MaxMicros. A number out of that range is
// refused with the range; only text that is not a number is told so.
func (a *amount) parse(field string, required, positive bool) (gpuproxy.Micros, error) {
	if !a.set {
		if required {
			return 0, gpuproxy.Invalid(field, "is required")
		}
		return 0, nil
	}
	inRange := gpuproxy.AmountRange(0, gpuproxy.MaxMicros, positive)
	var m gpuproxy.Micros
	if err := json.Unmarshal(a.raw, &m); err != nil {
		switch {
		case errors.Is(err, gpuproxy.ErrUSDPlaces):
			return 0, gpuproxy.Invalid(field, "%v", gpuproxy.ErrUSDPlaces)
		case errors.Is(err, gpuproxy.ErrUSDRange):
			return 0, gpuproxy.Invalid(field, "%s", inRange)
		}
		return 0, gpuproxy.Invalid(field, "must be a number of US dollars, e.g. 12.5")
	}
	if m < 0 || positive && m == 0 || m > gpuproxy.MaxMicros {
		return 0, gpuproxy.Invalid(field, "%s", inRange)
	}
	a.value = m
	return m, nil
}
