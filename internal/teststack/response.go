package teststack

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Response is one HTTP answer, read in full.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body as a JSON object, failing the test if it is not one.
func (r Response) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %q", err, r.Body)
	}
	return m
}

// apiError is the error object of gpuproxy's REST answers.
type apiError struct {
	Error struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	} `json:"error"`
}

func (r Response) apiError() apiError {
	var b apiError
	_ = json.Unmarshal(r.Body, &b)
	return b
}

// Err returns the code and message of a REST error answer, failing the
// test if the body is not JSON or has no error object.
func (r Response) Err(t testing.TB) (code, message string) {
	t.Helper()
	e, _ := r.JSON(t)["error"].(map[string]any)
	if e == nil {
		t.Fatalf("no error object in %s", r.Body)
	}
	code, _ = e["code"].(string)
	message, _ = e["message"].(string)
	return code, message
}

// ErrCode returns the code of a REST error answer ("" if there is none).
func (r Response) ErrCode() string { return r.apiError().Error.Code }

// ErrMessage returns the message of a REST error answer ("" if there is none).
func (r Response) ErrMessage() string { return r.apiError().Error.Message }

// ErrDetails returns the details of a REST error answer (nil if there are none).
func (r Response) ErrDetails() map[string]any { return r.apiError().Error.Details }

// Do sends req with http.DefaultClient and reads the whole answer, failing
// the test if the request or the read fails.
func Do(t testing.TB, req *http.Request) Response {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return Response{Status: res.StatusCode, Header: res.Header, Body: b}
}

// Send sends a request to url with body (nil: none) and the header pairs
// hdr ("Name", "value", …; "Host" sets the request's host), and returns
// the answer.
func Send(t testing.TB, method, url string, body io.Reader, hdr ...string) Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if http.CanonicalHeaderKey(hdr[i]) == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return Do(t, req)
}

// SendJSON is Send with a JSON body and "Content-Type: application/json"
// (before hdr, which may change it). body is sent as is if it is a string
// or []byte, marshalled otherwise; nil sends no body.
func SendJSON(t testing.TB, method, url string, body any, hdr ...string) Response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encoding request body: %v", err)
		}
		rd = bytes.NewReader(raw)
	}
	return Send(t, method, url, rd, append([]string{"Content-Type", "application/json"}, hdr...)...)
}
