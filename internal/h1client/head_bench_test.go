package h1client

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkReadResponse measures reading one upstream response head (and
// its short body) with readResponse, for a canonical answer (Go's
// net/http) and a lower-case one (uvicorn).
//
//	go test -run '^$' -bench ReadResponse -benchmem ./internal/h1client/
func BenchmarkReadResponse(b *testing.B) {
	for _, name := range []string{"Go net/http", "vLLM (uvicorn)"} {
		b.Run(name, func(b *testing.B) {
			var answer string
			for _, tc := range respCases {
				if tc.name == name {
					answer = tc.answer
				}
			}
			src := strings.NewReader(answer)
			br := bufio.NewReaderSize(src, headReadSize)
			req := &http.Request{Method: http.MethodPost}
			p := make([]byte, CopySize)
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(answer)
				br.Reset(src)
				resp, err := readResponse(br, req)
				if err != nil {
					b.Fatal(err)
				}
				for err == nil {
					_, err = resp.Body.Read(p)
				}
			}
		})
	}
}
