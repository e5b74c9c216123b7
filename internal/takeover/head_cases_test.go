package takeover

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// A request target and the header lines most cases share.
const (
	caseTarget = "/api/v1/proxy/gpi_0123/v1/chat/completions"
	caseHost   = "Host: 127.0.0.1:8080\r\n"
	caseKey    = "X-Api-Key: gpx_0123456789abcdef_0123456789abcdef0123456789abcdef\r\n"
)

// headCase is a head, whether parseHead serves it and whether the
// reference (net/http) does.
type headCase struct {
	name       string
	head       string
	serve, ref bool
}

// headCases are real clients' heads and nasty ones. Every head parseHead
// serves, net/http serves alike; the nasty ones it hands back, whatever
// net/http does with them (ref says what).
var headCases = []headCase{
	// Real clients.
	{"curl", "POST " + caseTarget + " HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n" +
		"Content-Type: application/json\r\nAuthorization: Bearer gpx_k\r\nContent-Length: 80\r\n\r\n", true, true},
	{"wrk", "POST " + caseTarget + " HTTP/1.1\r\nHost: 127.0.0.1:40123\r\n" + caseKey +
		"Content-Type: application/json\r\nContent-Length: 80\r\n\r\n", true, true},
	{"Go client", "POST " + caseTarget + " HTTP/1.1\r\nHost: 127.0.0.1:40123\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 80\r\nContent-Type: application/json\r\n" + caseKey + "Accept-Encoding: gzip\r\n\r\n", true, true},
	{"OpenAI Python SDK", "POST " + caseTarget + " HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n" +
		"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\n" +
		"Content-Type: application/json\r\nUser-Agent: OpenAI/Python 1.51.0\r\nX-Stainless-Lang: python\r\n" +
		"X-Stainless-Package-Version: 1.51.0\r\nX-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\n" +
		"X-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.12.3\r\nAuthorization: Bearer gpx_k\r\n" +
		"X-Stainless-Async: false\r\nx-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\n" +
		"Content-Length: 95\r\n\r\n", true, true},
	{"OpenAI Node SDK", "POST " + caseTarget + " HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nconnection: keep-alive\r\n" +
		"content-type: application/json\r\nuser-agent: OpenAI/JS 4.67.3\r\naccept: application/json\r\n" +
		"x-stainless-lang: js\r\nx-stainless-package-version: 4.67.3\r\nx-stainless-os: Linux\r\n" +
		"x-stainless-arch: x64\r\nx-stainless-runtime: node\r\nx-stainless-runtime-version: v20.11.1\r\n" +
		"authorization: Bearer gpx_k\r\nx-stainless-retry-count: 0\r\naccept-language: *\r\n" +
		"sec-fetch-mode: cors\r\naccept-encoding: gzip, deflate\r\ncontent-length: 95\r\n\r\n", true, true},
	{"nginx, keep-alive upstream", "POST " + caseTarget + " HTTP/1.1\r\nHost: backend\r\nX-Real-IP: 10.0.0.7\r\n" +
		"X-Forwarded-For: 10.0.0.7\r\nContent-Length: 80\r\ncontent-type: application/json\r\n" + caseKey + "\r\n", true, true},
	{"nginx, HTTP/1.0 upstream", "POST " + caseTarget + " HTTP/1.0\r\nHost: backend\r\nConnection: close\r\n" +
		"Content-Length: 80\r\n\r\n", false, false},
	{"GET with a query", "GET /v1/models?limit=10&after=m%20x&q=a+b HTTP/1.1\r\n" + caseHost + caseKey + "\r\n", true, true},
	{"many headers", "GET /x HTTP/1.1\r\n" + caseHost + strings.Repeat("X-Many: v\r\n", 40) + "X-Other: o\r\n\r\n", true, true},
	{"long unknown lower-case name", "GET /x HTTP/1.1\r\n" + caseHost + "x-" + strings.Repeat("long-", 30) + "name: v\r\n\r\n", true, true},

	// Targets.
	{"escaped path", "GET /v1/models/meta%2Fllama HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"path needing RawPath", "GET /a!b(c)*'d HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"non-ASCII path", "GET /caf\xc3\xa9 HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"non-ASCII query", "GET /x?q=caf\xc3\xa9 HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"bad escape", "GET /a%zz HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"empty query", "GET /x? HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"two question marks", "GET /x?? HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"fragment", "GET /x#frag?q HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"double slash", "GET //evil/x HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"absolute form", "GET http://other/x HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"asterisk", "OPTIONS * HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"authority form", "CONNECT host:443 HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"CONNECT with a path", "CONNECT /x HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"DEL in the target", "GET /x\x7f HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"tab in the target", "GET /x\ty HTTP/1.1\r\n" + caseHost + "\r\n", false, false},

	// Request lines.
	{"lower-case method", "get /x HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"odd method", "M-SEARCH /x HTTP/1.1\r\n" + caseHost + "\r\n", true, true},
	{"method not a token", "GE(T /x HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"two spaces", "GET  /x HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"trailing space", "GET /x HTTP/1.1 \r\n" + caseHost + "\r\n", false, false},
	{"HTTP/1.0", "GET /x HTTP/1.0\r\n" + caseHost + "\r\n", false, false},
	{"HTTP/2.0", "GET /x HTTP/2.0\r\n" + caseHost + "\r\n", false, false},
	{"lower-case proto", "GET /x http/1.1\r\n" + caseHost + "\r\n", false, false},
	{"empty line first", "\r\nGET /x HTTP/1.1\r\n" + caseHost + "\r\n", false, false},
	{"bare LF", "GET /x HTTP/1.1\n" + caseHost + "\r\n", false, true},
	{"bare CR", "GET /x HTTP/1.1\r" + caseHost + "\r\n", false, false},

	// Host.
	{"no Host", "GET /x HTTP/1.1\r\n" + caseKey + "\r\n", false, false},
	{"empty Host", "GET /x HTTP/1.1\r\nHost:\r\n\r\n", false, false},
	{"two Hosts", "GET /x HTTP/1.1\r\n" + caseHost + "Host: other\r\n\r\n", false, false},
	{"host twice, cases", "GET /x HTTP/1.1\r\n" + caseHost + "host: other\r\n\r\n", false, false},
	{"Host a b", "GET /x HTTP/1.1\r\nHost: a b\r\n\r\n", false, false},
	{"Host with blanks around", "GET /x HTTP/1.1\r\nHost: \t example.com \t\r\n\r\n", true, true},
	{"IPv6 Host", "GET /x HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", true, true},
	{"Host : evil", "GET /x HTTP/1.1\r\nHost : evil\r\n" + caseHost + "\r\n", false, false},

	// Header lines.
	{"obs-fold", "GET /x HTTP/1.1\r\n" + caseHost + "X-A: a\r\n b\r\n\r\n", false, true},
	{"folded Host", "GET /x HTTP/1.1\r\n" + caseHost + " evil\r\n\r\n", false, false},
	{"blank before colon", "GET /x HTTP/1.1\r\n" + caseHost + "X-API-Key : k\r\n\r\n", false, false},
	{"tab before colon", "GET /x HTTP/1.1\r\n" + caseHost + "X-A\t: k\r\n\r\n", false, false},
	{"no colon", "GET /x HTTP/1.1\r\n" + caseHost + "X-A k\r\n\r\n", false, false},
	{"empty name", "GET /x HTTP/1.1\r\n" + caseHost + ": k\r\n\r\n", false, false},
	{"empty value", "GET /x HTTP/1.1\r\n" + caseHost + "X-A:\r\nX-B:   \r\n\r\n", true, true},
	{"colon in value", "GET /x HTTP/1.1\r\n" + caseHost + "X-A: a:b::c\r\n\r\n", true, true},
	{"blanks in value", "GET /x HTTP/1.1\r\n" + caseHost + "X-A:\t a \t b\t \r\n\r\n", true, true},
	{"repeated name", "GET /x HTTP/1.1\r\n" + caseHost + "X-A: 1\r\nx-a: 2\r\nX-A: 3\r\n\r\n", true, true},
	{"odd name bytes", "GET /x HTTP/1.1\r\n" + caseHost + "x_a.b~c|d!e: v\r\n1x: v\r\n\r\n", true, true},
	{"obs-text value", "GET /x HTTP/1.1\r\n" + caseHost + "X-A: caf\xc3\xa9\xff\r\n\r\n", true, true},
	{"NUL in a value", "GET /x HTTP/1.1\r\n" + caseHost + "X-A: a\x00b\r\n\r\n", false, false},
	{"CR in a value", "GET /x HTTP/1.1\r\n" + caseHost + "X-A: a\rb\r\n\r\n", false, false},
	{"CR before CRLF", "GET /x HTTP/1.1\r\n" + caseHost + "X-A: a\r\r\n\r\n", false, false},
	{"non-ASCII name", "GET /x HTTP/1.1\r\n" + caseHost + "X-\xc3\xa9: a\r\n\r\n", false, false},
	{"Pragma no-cache", "GET /x HTTP/1.1\r\n" + caseHost + "Pragma: no-cache\r\n\r\n", true, true},
	{"Pragma with Cache-Control", "GET /x HTTP/1.1\r\n" + caseHost + "Pragma: no-cache\r\nCache-Control: max-age=0\r\n\r\n", true, true},
	{"second Pragma no-cache", "GET /x HTTP/1.1\r\n" + caseHost + "Pragma: x\r\nPragma: no-cache\r\n\r\n", true, true},
	{"Trailer", "POST /x HTTP/1.1\r\n" + caseHost + "Trailer: X-T\r\nContent-Length: 1\r\n\r\n", true, true},

	// Framing and connection.
	{"Content-Length 0", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 0\r\n\r\n", true, true},
	{"Content-Length on a GET", "GET /x HTTP/1.1\r\n" + caseHost + "Content-Length: 3\r\n\r\n", true, true},
	{"Content-Length zeros", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 007\r\n\r\n", true, true},
	{"Content-Length largest", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 999999999999999999\r\n\r\n", true, true},
	{"Content-Length 19 digits", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 1000000000000000000\r\n\r\n", false, true},
	{"Content-Length overflow", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 99999999999999999999\r\n\r\n", false, false},
	{"Content-Length twice, same", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 1\r\nContent-Length: 1\r\n\r\n", false, true},
	{"Content-Length twice", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n", false, false},
	{"Content-Length list", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 1, 1\r\n\r\n", false, false},
	{"Content-Length signed", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: +1\r\n\r\n", false, false},
	{"Content-Length hex", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length: 0x1\r\n\r\n", false, false},
	{"Content-Length empty", "POST /x HTTP/1.1\r\n" + caseHost + "Content-Length:\r\n\r\n", false, false},
	{"chunked", "POST /x HTTP/1.1\r\n" + caseHost + "Transfer-Encoding: chunked\r\n\r\n", false, false},
	{"chunked and length", "POST /x HTTP/1.1\r\n" + caseHost + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", false, false},
	{"Transfer-Encoding : chunked", "POST /x HTTP/1.1\r\n" + caseHost + "Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n", false, false},
	{"Expect", "POST /x HTTP/1.1\r\n" + caseHost + "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", false, false},
	{"Upgrade", "GET /x HTTP/1.1\r\n" + caseHost + "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n", false, false},
	{"Connection: close", "GET /x HTTP/1.1\r\n" + caseHost + "Connection: close\r\n\r\n", false, false},
	{"Connection: Keep-Alive", "GET /x HTTP/1.1\r\n" + caseHost + "Connection: Keep-Alive\r\n\r\n", true, true},
	{"Connection: TE", "GET /x HTTP/1.1\r\n" + caseHost + "Connection: TE\r\nTE: trailers\r\n\r\n", false, true},
	{"Connection list with close", "GET /x HTTP/1.1\r\n" + caseHost + "Connection: keep-alive, close\r\n\r\n", false, false},

	// Whole heads.
	{"no blank line", "GET /x HTTP/1.1\r\n" + caseHost, false, false},
	{"bare LF blank line", "GET /x HTTP/1.1\r\n" + caseHost + "\n", false, false},
	{"bytes after the head", "GET /x HTTP/1.1\r\n" + caseHost + "\r\nX-A: b\r\n\r\n", false, false},
	{"empty", "", false, false},
	{"only CRLFs", "\r\n\r\n", false, false},
}

// TestParseHead checks what parseHead and the reference do with each of
// headCases, and that parseHead parses what it serves as the reference.
func TestParseHead(t *testing.T) {
	t.Parallel()
	for _, tc := range headCases {
		served := checkHead(t, []byte(tc.head))
		ref := refParseHead([]byte(tc.head)) != nil
		if served != tc.serve || ref != tc.ref {
			t.Errorf("%s: parseHead serves %v, the reference %v; want %v, %v", tc.name, served, ref, tc.serve, tc.ref)
		}
	}
}

// TestParseHeadFields spells out one parse, so that the reference and
// parseHead cannot agree on a wrong one.
func TestParseHeadFields(t *testing.T) {
	t.Parallel()
	req := parseHead([]byte("POST /a/b?x=1&y=%20 HTTP/1.1\r\nhost: h:1\r\ncontent-length: 12\r\n" +
		"X-A: 1\r\nx-a: 2\r\nPragma: no-cache\r\nConnection: keep-alive\r\n\r\n"))
	if req == nil {
		t.Fatal("not served")
	}
	want := http.Header{"Content-Length": {"12"}, "X-A": {"1", "2"}, "Pragma": {"no-cache"},
		"Cache-Control": {"no-cache"}, "Connection": {"keep-alive"}}
	if d := sameRequest(req, &http.Request{Method: "POST", URL: &url.URL{Path: "/a/b", RawQuery: "x=1&y=%20"},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: want, ContentLength: 12, Host: "h:1",
		RequestURI: "/a/b?x=1&y=%20"}); d != "" {
		t.Error(d)
	}
	if req.Body != http.NoBody {
		t.Errorf("Body %v, want http.NoBody", req.Body)
	}
}

// TestParseHeadValuesApart checks that appending to one key's values
// leaves the others' alone (they share one array).
func TestParseHeadValuesApart(t *testing.T) {
	t.Parallel()
	req := parseHead([]byte("GET /x HTTP/1.1\r\n" + caseHost + "X-A: a\r\nX-B: b\r\n\r\n"))
	if req == nil {
		t.Fatal("not served")
	}
	req.Header.Add("X-A", "a2")
	if got := req.Header["X-B"]; len(got) != 1 || got[0] != "b" {
		t.Errorf("X-B is %q after adding to X-A", got)
	}
}

// TestPathBytes checks the path bytes parseHead takes as they are against
// net/url: exactly those its escaping of a path leaves alone.
func TestPathBytes(t *testing.T) {
	t.Parallel()
	for c := range 256 {
		p := string([]byte{'/', byte(c)})
		plain := (&url.URL{Path: p}).EscapedPath() == p
		if pathByte[c] != plain {
			t.Errorf("byte %#x: pathByte %v, net/url leaves it unescaped %v", c, pathByte[c], plain)
		}
	}
}

// TestParseHeadAllocs pins parseHead's allocations on real clients'
// heads, canonical or lower-case: the head's string, the request (with
// its URL and value slices) and the header map (two for up to 8 keys,
// four for more).
func TestParseHeadAllocs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		allocs float64
	}{{"wrk", 4}, {"Go client", 4}, {"OpenAI Python SDK", 6}, {"OpenAI Node SDK", 6}} {
		var head []byte
		for _, hc := range headCases {
			if hc.name == tc.name {
				head = []byte(hc.head)
			}
		}
		n := testing.AllocsPerRun(100, func() {
			if parseHead(head) == nil {
				t.Fatal("not served")
			}
		})
		if n > tc.allocs {
			t.Errorf("%s: %.1f allocations, want at most %.0f", tc.name, n, tc.allocs)
		}
	}
}
