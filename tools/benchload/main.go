// Command benchload sends a fixed number of small JSON POSTs over
// kept-alive connections and waits for every answer: the load of
// scripts/bench-proxy.sh's instruction count (CALLGRIND=1), where the
// measured server runs under valgrind and wrk would be too fast for it to
// answer, and of a CPU profile taken without wrk. It counts requests, not
// time: what it measures is per request, not per second.
//
//	benchload -url http://127.0.0.1:8080/api/v1/proxy/gpi_bench/v1/chat/completions -key KEY -n 2000 -conns 4
//
// It exits non-zero on the first answer that is not a 200.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// requestTimeout bounds one request: under valgrind a server answers in
// milliseconds, not microseconds.
const requestTimeout = 60 * time.Second

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "benchload:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	f := flag.NewFlagSet("benchload", flag.ContinueOnError)
	url := f.String("url", "", "URL to POST to")
	key := f.String("key", "", "X-API-Key to send")
	n := f.Int("n", 2000, "requests to send (in all, over every connection)")
	conns := f.Int("conns", 1, "kept-alive connections, each sending its share of -n one after the other")
	body := f.String("body", `{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, "request body")
	if err := f.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("-url is required")
	}
	if *conns < 1 || *n < 0 {
		return errors.New("-conns must be at least 1 and -n not negative")
	}
	tr := &http.Transport{MaxIdleConns: *conns, MaxIdleConnsPerHost: *conns, MaxConnsPerHost: *conns,
		DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: requestTimeout}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, *conns)
	start := time.Now()
	for c := range *conns {
		wg.Go(func() {
			for next.Add(1) <= int64(*n) {
				if err := post(client, *url, *key, *body); err != nil {
					errs[c] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("%d requests on %d connections in %v\n", *n, *conns, time.Since(start).Round(time.Millisecond))
	return nil
}

// post sends one request and reads its whole answer.
func post(client *http.Client, url, key, body string) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answer %d: %s", resp.StatusCode, b)
	}
	return nil
}
