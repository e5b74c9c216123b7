package server_test

import (
	"strings"
	"testing"
)

// TestTakeoverRefusesWhatNetHTTPRefuses sends, on a taken-over connection,
// request heads http.ReadRequest accepts but net/http's server refuses
// (the smuggling shapes): each must reach net/http, which answers 400 and
// closes, and never the handler.
func TestTakeoverRefusesWhatNetHTTPRefuses(t *testing.T) {
	t.Parallel()
	e := newPrefixEnv(t, 1_000_000)
	key, _ := e.key("acme", "engineer")
	for _, tc := range []struct{ name, head string }{
		{"Transfer-Encoding : chunked", "POST /api/v1/x/body HTTP/1.1\r\nHost: test\r\nX-API-Key: " + key +
			"\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"},
		{"X-API-Key : key", "GET /api/v1/x/inst HTTP/1.1\r\nHost: test\r\nX-API-Key : " + key + "\r\n\r\n"},
		{"Host : x", "GET /api/v1/x/inst HTTP/1.1\r\nHost : evil\r\nHost: test\r\nX-API-Key: " + key + "\r\n\r\n"},
		{"Host with a space", "GET /api/v1/x/inst HTTP/1.1\r\nHost: a b\r\nX-API-Key: " + key + "\r\n\r\n"},
		{"folded Host", "GET /api/v1/x/inst HTTP/1.1\r\nHost: test\r\n evil\r\nX-API-Key: " + key + "\r\n\r\n"},
		{"no Host", "GET /api/v1/x/inst HTTP/1.1\r\nX-API-Key: " + key + "\r\n\r\n"},
		{"absolute form without Host", "GET http://test/api/v1/x/inst HTTP/1.1\r\nX-API-Key: " + key + "\r\n\r\n"},
		{"NUL in a value", "GET /api/v1/x/inst HTTP/1.1\r\nHost: test\r\nX-API-Key: " + key + "\r\nX-A: a\x00b\r\n\r\n"},
	} {
		rc := e.dial(t)
		rc.do("GET", "/api/v1/x/inst", key, "")
		before := len(e.logLines(t))
		waitTakenOver(t, e.srv, 1)
		rc.send(tc.head)
		if res, body := rc.read("GET"); res.StatusCode != 400 || !strings.HasPrefix(body, "400 Bad Request") {
			t.Errorf("%s: %d %q; want net/http's 400", tc.name, res.StatusCode, body)
		}
		if !rc.closed() {
			t.Errorf("%s: connection kept", tc.name)
		}
		if n := len(e.logLines(t)); n != before {
			t.Errorf("%s: the request reached the handler", tc.name)
		}
		rc.c.Close()
		waitTakenOver(t, e.srv, 0)
	}
}
