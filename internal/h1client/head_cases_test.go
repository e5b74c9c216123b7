package h1client

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

// Bodies and header lines the cases share.
const (
	caseDate  = "Date: Sat, 28 Nov 2026 09:00:00 GMT\r\n"
	caseJSON  = `{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`
	caseEvent = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
	caseSSE   = "30\r\n" + caseEvent + "\r\n" + "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
)

// respCase is a stream of answers to a request of method, and how many
// of its heads parseResponse parses itself (the others go to
// http.ReadResponse).
type respCase struct {
	name   string
	method string
	answer string
	fast   int
}

// respCases are real servers' answers and nasty ones.
var respCases = []respCase{
	// Real servers.
	{"Go net/http", "POST", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + caseDate +
		"Content-Length: 58\r\n\r\n" + caseJSON, 1},
	{"Go net/http, chunked SSE", "POST", "HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\nContent-Type: text/event-stream\r\n" +
		caseDate + "Transfer-Encoding: chunked\r\n\r\n" + caseSSE, 1},
	{"nginx keep-alive", "POST", "HTTP/1.1 200 OK\r\nServer: nginx/1.24.0\r\n" + caseDate +
		"Content-Type: application/json\r\nContent-Length: 58\r\nConnection: keep-alive\r\n\r\n" + caseJSON, 1},
	{"nginx close", "POST", "HTTP/1.1 502 Bad Gateway\r\nServer: nginx/1.24.0\r\n" + caseDate +
		"Content-Type: text/html\r\nContent-Length: 5\r\nConnection: close\r\n\r\n<br/>", 1},
	{"nginx SSE", "POST", "HTTP/1.1 200 OK\r\nServer: nginx\r\n" + caseDate + "Content-Type: text/event-stream\r\n" +
		"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\nX-Accel-Buffering: no\r\n\r\n" + caseSSE, 1},
	{"vLLM (uvicorn)", "POST", "HTTP/1.1 200 OK\r\ndate: Sat, 28 Nov 2026 09:00:00 GMT\r\nserver: uvicorn\r\n" +
		"content-length: 58\r\ncontent-type: application/json\r\n\r\n" + caseJSON, 1},
	{"vLLM SSE (uvicorn)", "POST", "HTTP/1.1 200 OK\r\ndate: Sat, 28 Nov 2026 09:00:00 GMT\r\nserver: uvicorn\r\n" +
		"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n" + caseSSE, 1},
	{"vLLM 400", "POST", "HTTP/1.1 400 Bad Request\r\ndate: Sat, 28 Nov 2026 09:00:00 GMT\r\nserver: uvicorn\r\n" +
		"content-length: 2\r\ncontent-type: application/json\r\nx-request-id: 9f2c\r\n\r\n{}", 1},
	{"two answers kept alive", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 404 Not Found\r\n" +
		"Content-Length: 0\r\n\r\n", 2},
	{"read to the close", "GET", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, then the close", 1},
	{"many header lines", "GET", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Many: v\r\n", 40) + "Content-Length: 1\r\n\r\nx", 1},
	{"a dozen header lines", "GET", "HTTP/1.1 200 OK\r\n" + strings.Repeat("Vary: v\r\n", 11) + "Content-Length: 1\r\n\r\nx", 1},

	// Answers without a body, and informational ones.
	{"204", "DELETE", "HTTP/1.1 204 No Content\r\n" + caseDate + "\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 2},
	{"204 with a length", "GET", "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", 2},
	{"304 chunked", "GET", "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\nEtag: \"x\"\r\n\r\n", 1},
	{"HEAD with a length", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", 2},
	{"HEAD chunked", "HEAD", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 1},
	{"HEAD without length", "HEAD", "HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", 1},
	{"100 Continue", "POST", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", 2},
	{"103 Early Hints", "GET", "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n" +
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", 2},
	{"101 unasked", "GET", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", 1},

	// Fields parsed here.
	{"no reason", "GET", "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 1},
	{"empty reason", "GET", "HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n", 1},
	{"reason with obs-text", "GET", "HTTP/1.1 200 D\xe9j\xe0 vu\r\nContent-Length: 0\r\n\r\n", 1},
	{"odd status", "GET", "HTTP/1.1 099 Odd\r\nContent-Length: 1\r\n\r\nx", 1},
	{"Connection: close among tokens", "GET", "HTTP/1.1 200 OK\r\nConnection: Keep-Alive, CLOSE\r\nContent-Length: 1\r\n\r\nx", 1},
	{"Connection closes not", "GET", "HTTP/1.1 200 OK\r\nConnection: closed\r\nContent-Length: 1\r\n\r\nx", 1},
	{"two Connection fields", "GET", "HTTP/1.1 200 OK\r\nConnection: upgrade\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", 1},
	{"Chunked in capitals", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n1\r\nx\r\n0\r\n\r\n", 1},
	{"unannounced trailer", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX-T: 1\r\nx-u: 2\r\n\r\nrest", 1},
	{"bad trailer", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX T: 1\r\n\r\n", 1},
	{"truncated trailer", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX", 1},
	{"truncated chunk", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nxx", 1},
	{"bad chunk size", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n", 1},
	{"truncated body", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 1},
	{"length with zeros", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 0003\r\n\r\nabcd", 1},
	{"length of 18 digits", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\n", 1},
	{"Pragma", "GET", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nPragma: x\r\nContent-Length: 0\r\n\r\n", 1},
	{"Pragma and Cache-Control", "GET", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nCache-Control: max-age=1\r\n\r\n", 1},
	{"blanks around values", "GET", "HTTP/1.1 200 OK\r\nX-A:\t a b \t\r\nX-Empty:\r\nContent-Length:  1 \r\n\r\nx", 1},
	{"long unknown lower-case name", "GET", "HTTP/1.1 200 OK\r\nx-" + strings.Repeat("long-", 30) + "name: v\r\n\r\n", 1},

	// Heads that go to http.ReadResponse.
	{"announced trailer", "GET", "HTTP/1.1 200 OK\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX-T: 1\r\n\r\n", 0},
	{"Trailer without chunks", "GET", "HTTP/1.1 200 OK\r\nTrailer: X-T\r\nContent-Length: 0\r\n\r\n", 0},
	{"HTTP/1.0", "GET", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 0},
	{"HTTP/1.0 keep-alive", "GET", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx", 0},
	{"HTTP/2.0", "GET", "HTTP/2.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 0},
	{"lower-case version", "GET", "http/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", 0},
	{"two spaces", "GET", "HTTP/1.1  200 OK\r\nContent-Length: 1\r\n\r\nx", 0},
	{"four digits", "GET", "HTTP/1.1 2000 OK\r\nContent-Length: 1\r\n\r\nx", 0},
	{"signed status", "GET", "HTTP/1.1 +99 OK\r\nContent-Length: 1\r\n\r\nx", 0},
	{"bare LF", "GET", "HTTP/1.1 200 OK\nContent-Length: 1\n\nx", 0},
	{"bare LF in a field", "GET", "HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 1\r\n\r\nx", 0},
	{"bare CR", "GET", "HTTP/1.1 200 OK\r\nX-A: 1\rContent-Length: 1\r\n\r\nx", 0},
	{"NUL in a value", "GET", "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 1\r\n\r\nx", 0},
	{"obs-fold", "GET", "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 1\r\n\r\nx", 0},
	{"space before the colon", "GET", "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nxxxxx", 0},
	{"leading space", "GET", "HTTP/1.1 200 OK\r\n X-A: 1\r\nContent-Length: 1\r\n\r\nx", 0},
	{"no colon", "GET", "HTTP/1.1 200 OK\r\nX-A\r\nContent-Length: 1\r\n\r\nx", 0},
	{"empty name", "GET", "HTTP/1.1 200 OK\r\n: 1\r\nContent-Length: 1\r\n\r\nx", 0},
	{"two lengths, same", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 0},
	{"two lengths, differing", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", 0},
	{"length and chunked", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", 0},
	{"chunked and length", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\nx\r\n0\r\n\r\n", 0},
	{"signed length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx", 0},
	{"empty length", "GET", "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nx", 0},
	{"19-digit length", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775807\r\n\r\n", 0},
	{"gzip encoding", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 0},
	{"two encodings", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 0},
	{"Kelvin sign", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chun\u212aed\r\n\r\n", 0},
	{"truncated head", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n", 0},
	{"garbage", "GET", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 0},
	{"empty line first", "GET", "\r\nHTTP/1.1 200 OK\r\n\r\n", 0},
	{"head longer than the reader", "GET", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", headReadSize) + "\r\n\r\n", 0},
}

// TestReadResponseCases checks readResponse against http.ReadResponse on
// respCases, read whole and piece by piece, and that parseResponse parses
// the heads it is meant to (so that a fast path that refuses everything
// fails).
func TestReadResponseCases(t *testing.T) {
	t.Parallel()
	for _, tc := range respCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			whole := answerRead{method: tc.method, step: 1 << 20, bufSize: headReadSize, readSize: CopySize}
			if fast := checkAnswers(t, []byte(tc.answer), whole); fast != tc.fast {
				t.Errorf("parseResponse parsed %d heads, want %d", fast, tc.fast)
			}
			for _, ar := range []answerRead{
				{method: tc.method, step: 1, bufSize: 16, readSize: 1},
				{method: tc.method, step: 5, bufSize: 64, readSize: 3, closeAfter: 1},
				{method: tc.method, step: 7, bufSize: headReadSize, readSize: 512, closeAfter: 2},
				{method: "", step: 1 << 20, bufSize: headReadSize, readSize: 512},
			} {
				checkAnswers(t, []byte(tc.answer), ar)
			}
		})
	}
}

// TestReadResponseBodyKinds checks the body parseResponse gives each
// framing, so that handing them all to http.ReadResponse fails.
func TestReadResponseBodyKinds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		answer string
		kind   uint8
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", bodyLength},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", bodyChunked},
		{"HTTP/1.1 200 OK\r\n\r\nx", bodyToClose},
	} {
		br := bufio.NewReader(strings.NewReader(tc.answer))
		resp := parseResponse(br, &http.Request{Method: http.MethodGet})
		if resp == nil {
			t.Fatalf("parseResponse refused %q", tc.answer)
		}
		if b, ok := resp.Body.(*respBody); !ok || b.kind != tc.kind {
			t.Errorf("%q: body %T %+v, want kind %d", tc.answer, resp.Body, resp.Body, tc.kind)
		}
	}
}

// TestReadResponseAllocs pins readResponse's allocations on real
// servers' answers, head parsed and a body with a length read to its end
// (a chunked one is not read: the Client reads it through its own
// decoder): the head's string, the response (with its body and value
// slices) and the header map (two for up to 8 keys). It logs http.ReadResponse's for the
// same answers.
func TestReadResponseAllocs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		allocs float64
	}{{"Go net/http", 4}, {"vLLM (uvicorn)", 4}, {"vLLM SSE (uvicorn)", 4}, {"nginx keep-alive", 4}} {
		answer := findCase(t, tc.name).answer
		src := strings.NewReader(answer)
		br := bufio.NewReaderSize(src, headReadSize)
		req := &http.Request{Method: http.MethodPost}
		p := make([]byte, CopySize)
		run := func(read func(*bufio.Reader, *http.Request) (*http.Response, error)) float64 {
			return testing.AllocsPerRun(100, func() {
				src.Reset(answer)
				br.Reset(src)
				resp, err := read(br, req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.TransferEncoding == nil {
					for err == nil {
						_, err = resp.Body.Read(p)
					}
				}
			})
		}
		got, ref := run(readResponse), run(http.ReadResponse)
		t.Logf("%s: %.1f allocations, http.ReadResponse %.1f", tc.name, got, ref)
		if got > tc.allocs {
			t.Errorf("%s: %.1f allocations, want at most %.0f", tc.name, got, tc.allocs)
		}
	}
}

func findCase(t *testing.T, name string) respCase {
	t.Helper()
	for _, tc := range respCases {
		if tc.name == name {
			return tc
		}
	}
	t.Fatalf("no case %q", name)
	return respCase{}
}
