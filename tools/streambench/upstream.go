package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The upstream is an SSE server shaped like an inference server's token
// stream: GET /v1/stream?until=<unix ms>&every=<ms> (or POST
// /v1/chat/completions?…, whose body asking for include_usage gets a
// usage chunk at the end) answers 200
// text/event-stream, chunked, with one event at once and one every
// `every` ms until `until`, then ends the body and keeps the connection
// for the next request (keep-alive). Streams are not a goroutine each
// while they run: a hub writes every due event from one goroutine, so the
// upstream's own cost stays small and the same for every proxy measured.

// tick is the hub's resolution; streams are spread over the slots of an
// interval so that events do not all fall on the same instant.
const tick = 10 * time.Millisecond

var event = []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n")

// chunk is one event in chunked framing.
var chunk = append(append([]byte(strconv.FormatInt(int64(len(event)), 16)+"\r\n"), event...), "\r\n"...)

const streamHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
	"Transfer-Encoding: chunked\r\n\r\n"

type stream struct {
	c     net.Conn
	br    *bufio.Reader
	every int // in ticks
	slot  int
	until time.Time
	usage bool // a POST that asked for the stream's usage: a usage chunk ends it
}

// usageEvent is the usage chunk a stream that asked for it ends with.
var usageEvent = []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":100}}\n\n")

var usageChunk = append(append([]byte(strconv.FormatInt(int64(len(usageEvent)), 16)+"\r\n"), usageEvent...), "\r\n"...)

type hub struct {
	mu      sync.Mutex
	streams []*stream
	n       int
}

func (h *hub) add(s *stream) {
	h.mu.Lock()
	s.slot = h.n % s.every
	h.n++
	h.streams = append(h.streams, s)
	h.mu.Unlock()
}

// run writes each stream's due event every tick and ends the streams
// whose time is up, handing their connections back for a next request.
func (h *hub) run() {
	t := time.NewTicker(tick)
	defer t.Stop()
	for n := 0; ; n++ {
		now := <-t.C
		h.mu.Lock()
		list := h.streams
		h.mu.Unlock()
		keep := list[:0:0]
		for _, s := range list {
			switch {
			case !now.Before(s.until):
				end := "0\r\n\r\n"
				if s.usage {
					end = string(usageChunk) + end
				}
				if _, err := io.WriteString(s.c, end); err != nil {
					_ = s.c.Close()
					continue
				}
				go serveConn(h, s.c, s.br)
				continue
			case n%s.every == s.slot:
				if _, err := s.c.Write(chunk); err != nil {
					_ = s.c.Close()
					continue
				}
			}
			keep = append(keep, s)
		}
		h.mu.Lock()
		// Streams added while writing are appended after list's end.
		added := h.streams[len(list):]
		h.streams = append(keep, added...)
		h.mu.Unlock()
	}
}

// serveConn reads the next request on c and hands its stream to the hub.
func serveConn(h *hub, c net.Conn, br *bufio.Reader) {
	req, err := http.ReadRequest(br)
	if err != nil {
		_ = c.Close()
		return
	}
	body, _ := io.ReadAll(req.Body)
	q := req.URL.Query()
	every, _ := strconv.Atoi(q.Get("every"))
	untilMs, _ := strconv.ParseInt(q.Get("until"), 10, 64)
	if (req.URL.Path != "/v1/stream" && req.URL.Path != "/v1/chat/completions") || every <= 0 {
		_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
		go serveConn(h, c, br)
		return
	}
	if _, err := io.WriteString(c, streamHead+string(chunk)); err != nil {
		_ = c.Close()
		return
	}
	s := &stream{c: c, br: br, every: max(1, every*int(time.Millisecond)/int(tick)), until: time.UnixMilli(untilMs),
		usage: bytes.Contains(body, []byte(`"include_usage":true`))}
	h.add(s)
}

func runUpstream(args []string) error {
	f := flag.NewFlagSet("upstream", flag.ContinueOnError)
	addr := f.String("addr", "127.0.0.1:0", "listen address (loopback)")
	if err := f.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	h := &hub{}
	go h.run()
	fmt.Printf("READY %s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Out of file descriptors, say: wait and go on.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go serveConn(h, c, bufio.NewReaderSize(c, 1024))
	}
}
