package takeover

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// refParseHead is the reference parseHead is proved against: how conn.parse
// read a head before parseHead, with net/http's own parser
// (http.ReadRequest, through a reader of refReadSize as then) and the
// checks net/http's server adds to what it returns (serverAccepts), and
// nil for the requests this loop does not serve.
func refParseHead(head []byte) *http.Request {
	if !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		return nil
	}
	hb := bytes.NewReader(head)
	hr := bufio.NewReaderSize(hb, refReadSize)
	req, err := http.ReadRequest(hr)
	if err != nil || hr.Buffered() > 0 || hb.Len() > 0 || req.ProtoMajor != 1 || req.ProtoMinor != 1 ||
		req.Close || req.ContentLength < 0 || len(req.TransferEncoding) > 0 || req.Method == http.MethodConnect ||
		req.Header["Expect"] != nil || req.Header["Upgrade"] != nil || !serverAccepts(req) {
		return nil
	}
	return req
}

// refReadSize is the reader http.ReadRequest read a head through.
const refReadSize = 4096

// serverAccepts reports whether net/http's server accepts an HTTP/1.1
// request head that http.ReadRequest accepted, with the checks its
// conn.readRequest adds: a valid Host, valid header names (ReadRequest
// lets "Name : value" through, with the space in the name) and values.
// ReadRequest has taken Host out of the header; for a target in origin
// form (the only one served here) req.Host is its value. An empty Host,
// which net/http accepts, is handed back all the same.
func serverAccepts(req *http.Request) bool {
	if req.RequestURI == "" || req.RequestURI[0] != '/' || req.URL.Host != "" || req.Host == "" ||
		!httpguts.ValidHostHeader(req.Host) {
		return false
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// sameRequest returns how got (parseHead's) differs from want
// (refParseHead's), field by field; "" when they are equal. Bodies are
// not compared: serveOne replaces both.
func sameRequest(got, want *http.Request) string {
	var diffs []string
	field := func(name string, g, w any) {
		if !reflect.DeepEqual(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s: got %#v, want %#v", name, g, w))
		}
	}
	field("Method", got.Method, want.Method)
	field("URL", *got.URL, *want.URL)
	field("Proto", got.Proto, want.Proto)
	field("ProtoMajor", got.ProtoMajor, want.ProtoMajor)
	field("ProtoMinor", got.ProtoMinor, want.ProtoMinor)
	field("Header", got.Header, want.Header)
	field("ContentLength", got.ContentLength, want.ContentLength)
	field("TransferEncoding", got.TransferEncoding, want.TransferEncoding)
	field("Close", got.Close, want.Close)
	field("Host", got.Host, want.Host)
	field("RequestURI", got.RequestURI, want.RequestURI)
	field("Trailer", got.Trailer, want.Trailer)
	field("Context", got.Context(), want.Context())
	// Whatever else a request holds (unexported fields included).
	g, w := *got, *want
	g.Body, w.Body = nil, nil
	g.URL, w.URL = nil, nil
	if diffs == nil && !reflect.DeepEqual(g, w) {
		diffs = append(diffs, fmt.Sprintf("request: got %+v, want %+v", g, w))
	}
	return strings.Join(diffs, "\n")
}

// checkHead checks parseHead against refParseHead on head: if parseHead
// serves it, the reference serves it too, parsed the same.
func checkHead(t *testing.T, head []byte) (served bool) {
	t.Helper()
	got := parseHead(head)
	if got == nil {
		return false
	}
	want := refParseHead(head)
	if want == nil {
		t.Fatalf("parseHead serves a head the reference hands back: %q", head)
	}
	if d := sameRequest(got, want); d != "" {
		t.Fatalf("parseHead and the reference disagree on %q:\n%s", head, d)
	}
	return true
}

// FuzzHeadParse differentially fuzzes parseHead against refParseHead
// (http.ReadRequest and net/http's server checks): for every head,
// parseHead serves only what the reference serves, parsed the same (every
// field); what the reference hands back, parseHead hands back. A fuzz
// input is cut where conn.head cuts a head. The seeds are real clients'
// heads, nasty ones, and FuzzTakeoverHead's corpus.
//
//	go test -run '^$' -fuzz '^FuzzHeadParse$' -fuzztime 1m ./internal/takeover/
func FuzzHeadParse(f *testing.F) {
	for _, tc := range headCases {
		f.Add([]byte(tc.head))
	}
	for _, data := range takeoverCorpus(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if n := headLen(data, 0); n > 0 {
			data = data[:n]
		}
		checkHead(t, data)
	})
}

// takeoverCorpus returns the data of FuzzTakeoverHead's seed corpus.
func takeoverCorpus(tb testing.TB) [][]byte {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzTakeoverHead", "*"))
	if err != nil {
		tb.Fatal(err)
	}
	var out [][]byte
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			tb.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if q, ok := strings.CutPrefix(line, "[]byte("); ok {
				s, err := strconv.Unquote(strings.TrimSuffix(q, ")"))
				if err != nil {
					tb.Fatalf("%s: %v", name, err)
				}
				out = append(out, []byte(s))
			}
		}
	}
	if len(out) == 0 {
		tb.Fatal("no FuzzTakeoverHead corpus")
	}
	return out
}
