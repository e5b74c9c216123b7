// Command benchupstream is the upstream of scripts/bench-proxy.sh: a tiny
// HTTP server on loopback that answers every request with a small JSON body
// shaped like an OpenAI-compatible completion, as an inference server
// would for a short reply.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

var reply = []byte(`{"id":"chatcmpl-bench","object":"chat.completion","model":"bench","choices":[{"index":0,` +
	`"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,` +
	`"completion_tokens":1,"total_tokens":6}}`)

var replyLen = strconv.Itoa(len(reply))

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback)")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hd := w.Header()
		hd["Content-Type"] = []string{"application/json"}
		hd["Content-Length"] = []string{replyLen}
		_, _ = w.Write(reply)
	})
	fmt.Printf("READY %s\n", ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute}
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
