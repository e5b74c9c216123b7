package h1client

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// stepReader gives data at most step bytes a read, then io.EOF at every
// read, as a closed connection does.
type stepReader struct {
	data []byte
	step int
}

func (r *stepReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.step)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// answerRead is how checkAnswers reads a stream of answers: the request
// method ("" for a nil request), the bytes each read of the connection
// gives, the size of the reader, of a body read, and after how many body
// reads a body is closed (0: read to its end).
type answerRead struct {
	method     string
	step       int
	bufSize    int
	readSize   int
	closeAfter int
}

// maxAnswers bounds the answers checkAnswers reads from one input.
const maxAnswers = 4

// checkAnswers reads the answers in data, one after the other, with
// readResponse and with http.ReadResponse, each from a reader of its own,
// and fails unless both return the same error or equal responses whose
// bodies give the same bytes, errors and trailers, leaving the same bytes
// behind. It returns how many heads parseResponse parsed itself.
func checkAnswers(t *testing.T, data []byte, ar answerRead) (fast int) {
	t.Helper()
	gbr := bufio.NewReaderSize(&stepReader{data: data, step: ar.step}, ar.bufSize)
	wbr := bufio.NewReaderSize(&stepReader{data: data, step: ar.step}, ar.bufSize)
	var req *http.Request
	if ar.method != "" {
		req = &http.Request{Method: ar.method}
	}
	for range maxAnswers {
		if _, err := gbr.Peek(1); err != nil {
			break
		}
		_, _ = wbr.Peek(1)
		// readResponse, counting the heads parseResponse takes.
		got, gerr := parseResponse(gbr, req), error(nil)
		if got != nil {
			fast++
		} else {
			got, gerr = http.ReadResponse(gbr, req)
		}
		want, werr := http.ReadResponse(wbr, req)
		if errText(gerr) != errText(werr) {
			t.Fatalf("%+v: error %q, want %q; input %q", ar, errText(gerr), errText(werr), data)
		}
		if werr != nil {
			break
		}
		if d := sameResponse(got, want); d != "" {
			t.Fatalf("%+v: responses differ on %q:\n%s", ar, data, d)
		}
		if d := sameBody(got.Body, want.Body, ar); d != "" {
			t.Fatalf("%+v: bodies differ on %q:\n%s", ar, data, d)
		}
		if !reflect.DeepEqual(got.Trailer, want.Trailer) {
			t.Fatalf("%+v: trailer %#v, want %#v; input %q", ar, got.Trailer, want.Trailer, data)
		}
	}
	grest, gerr := io.ReadAll(gbr)
	wrest, werr := io.ReadAll(wbr)
	if !bytes.Equal(grest, wrest) || errText(gerr) != errText(werr) {
		t.Fatalf("%+v: left %q (%v), want %q (%v); input %q", ar, grest, gerr, wrest, werr, data)
	}
	return fast
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sameResponse returns how got differs from want, every field but Body;
// "" when they are equal.
func sameResponse(got, want *http.Response) string {
	g, w := *got, *want
	g.Body, w.Body = nil, nil
	if reflect.DeepEqual(g, w) && g.Request == w.Request {
		return ""
	}
	var diffs []string
	gv, wv := reflect.ValueOf(g), reflect.ValueOf(w)
	for i := range gv.NumField() {
		if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
			diffs = append(diffs, fmt.Sprintf("%s: got %#v, want %#v", gv.Type().Field(i).Name,
				gv.Field(i).Interface(), wv.Field(i).Interface()))
		}
	}
	return strings.Join(diffs, "\n")
}

// sameBody reads both bodies the same way and returns how they differ;
// "" when they do not. When a connection's read may give less than the
// reader holds (ar.step < ar.bufSize), the readers may hold different
// bytes ahead after the head (a net/http body's reads give what is
// buffered, or read it): the bodies are read to their end and their
// bytes, last error and Close's error compared. Otherwise they are
// closed after ar.closeAfter reads when it is not 0, read once more and
// closed again, and every read compared.
func sameBody(got, want io.ReadCloser, ar answerRead) string {
	exact := ar.step >= ar.bufSize
	if !exact {
		ar.closeAfter = 0
	}
	read := func(b io.ReadCloser) (data []byte, trace []string) {
		p := make([]byte, ar.readSize)
		for i := 1; ; i++ {
			if ar.closeAfter > 0 && i > ar.closeAfter {
				trace = append(trace, "close: "+errText(b.Close()))
				n, err := b.Read(p)
				data = append(data, p[:n]...)
				trace = append(trace, fmt.Sprintf("read %d: %v", n, err), "close: "+errText(b.Close()))
				return data, trace
			}
			n, err := b.Read(p)
			data = append(data, p[:n]...)
			switch {
			case exact:
				trace = append(trace, fmt.Sprintf("read %d: %v", n, err))
			case err != nil:
				trace = append(trace, fmt.Sprintf("read: %v", err))
			}
			if err != nil {
				trace = append(trace, "close: "+errText(b.Close()))
				return data, trace
			}
		}
	}
	gdata, gtrace := read(got)
	wdata, wtrace := read(want)
	if bytes.Equal(gdata, wdata) && reflect.DeepEqual(gtrace, wtrace) {
		return ""
	}
	return fmt.Sprintf("got %q %q\nwant %q %q", gdata, gtrace, wdata, wtrace)
}

// FuzzReadResponse differentially fuzzes readResponse against
// http.ReadResponse: a fuzz input is a stream of answers, read with a
// request method, a size of the connection's reads, of the reader and of
// the body's reads, and maybe closed early (checkAnswers). The seeds are
// real servers' answers and nasty ones (respCases).
//
//	go test -run '^$' -fuzz '^FuzzReadResponse$' -fuzztime 1m ./internal/h1client/
func FuzzReadResponse(f *testing.F) {
	for _, tc := range respCases {
		for _, m := range []uint8{0, 1, 2, 3} {
			f.Add([]byte(tc.answer), m, uint16(0), uint16(headReadSize), uint16(512), uint8(0))
		}
		f.Add([]byte(tc.answer), uint8(1), uint16(7), uint16(64), uint16(3), uint8(2))
	}
	f.Fuzz(func(t *testing.T, data []byte, method uint8, step, bufSize, readSize uint16, closeAfter uint8) {
		checkAnswers(t, data, fuzzRead(method, step, bufSize, readSize, closeAfter))
	})
}

// fuzzRead makes a fuzz input's numbers an answerRead.
func fuzzRead(method uint8, step, bufSize, readSize uint16, closeAfter uint8) answerRead {
	methods := []string{"", http.MethodGet, http.MethodPost, http.MethodHead}
	ar := answerRead{
		method:     methods[int(method)%len(methods)],
		step:       int(step),
		bufSize:    16 + int(bufSize)%(headReadSize+1),
		readSize:   1 + int(readSize)%(CopySize),
		closeAfter: int(closeAfter % 8),
	}
	if ar.step == 0 {
		ar.step = 1 << 20
	}
	return ar
}

// TestReadResponseGoServer checks readResponse on what net/http's server
// really sends (a body with a length, a flushed event stream, 204, 304, an
// answer to HEAD, one closing its connection), read from a connection,
// and that parseResponse parses each head itself.
func TestReadResponseGoServer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, caseJSON)
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			for range 3 {
				_, _ = io.WriteString(w, caseEvent)
				w.(http.Flusher).Flush()
			}
		case "/204":
			w.WriteHeader(http.StatusNoContent)
		case "/304":
			w.Header().Set("Etag", `"x"`)
			w.WriteHeader(http.StatusNotModified)
		case "/close":
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, "bye")
		}
	}))
	defer srv.Close()
	for _, tc := range []struct{ method, path string }{
		{"POST", "/json"}, {"POST", "/sse"}, {"DELETE", "/204"}, {"GET", "/304"}, {"HEAD", "/json"}, {"GET", "/close"},
	} {
		answer := rawAnswer(t, srv.Listener.Addr().String(), tc.method, tc.path)
		ar := answerRead{method: tc.method, step: 1 << 20, bufSize: headReadSize, readSize: CopySize}
		if fast := checkAnswers(t, answer, ar); fast != 1 {
			t.Errorf("%s %s: parseResponse parsed %d heads of %q, want 1", tc.method, tc.path, fast, answer)
		}
	}
}

// rawAnswer sends a request asking to close the connection and returns
// all the server sent.
func rawAnswer(t *testing.T, addr, method, path string) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: upstream\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", method, path)
	answer, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return answer
}
