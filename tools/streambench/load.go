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
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The load client opens -streams streams, one per connection, evenly over
// -ramp; each is a GET of the upstream's stream path (through a proxy or
// not) that runs until a common end time: ramp, settle and hold. While
// every stream is open (the hold), it counts the events that arrive and
// reads the measured processes' CPU time and resident memory from /proc.
// It prints one RESULT line.

type loadStats struct {
	events    atomic.Int64
	completed atomic.Int64
	failed    atomic.Int64
	open      atomic.Int64
	mu        sync.Mutex
	ttfb      []time.Duration
	byTenth   [rampTenths][]time.Duration // ttfb by the tenth of the ramp the stream opened in
	firstErr  error
}

// rampTenths is how many slices of the ramp the first byte's p50 is
// reported for (ttfb_ramp_p50_ms): how it grows as streams pile up.
const rampTenths = 10

func (s *loadStats) fail(err error) {
	s.failed.Add(1)
	s.mu.Lock()
	if s.firstErr == nil {
		s.firstErr = err
	}
	s.mu.Unlock()
}

func runLoad(args []string) error {
	f := flag.NewFlagSet("load", flag.ContinueOnError)
	addr := f.String("addr", "", "host:port to connect to")
	path := f.String("path", "/v1/stream", "path of the stream (before the query)")
	post := f.Bool("post", false, "POST a streamed chat completion's body (as OpenAI clients do) instead of a GET")
	key := f.String("key", "", "X-API-Key to send (gpuproxy)")
	name := f.String("name", "run", "name printed in the RESULT line")
	streams := f.Int("streams", 1000, "streams to open, one per connection")
	rate := f.Float64("rate", 10, "events per second per stream")
	ramp := f.Duration("ramp", 5*time.Second, "time over which the streams are opened")
	settle := f.Duration("settle", 2*time.Second, "wait after the ramp before measuring")
	hold := f.Duration("hold", 10*time.Second, "measuring time with every stream open")
	pidList := f.String("pids", "", "comma-separated pids whose RSS and CPU are measured (summed)")
	if err := f.Parse(args); err != nil {
		return err
	}
	pids, err := parsePids(*pidList)
	if err != nil {
		return err
	}
	every := max(1, int(1000 / *rate))
	start := time.Now()
	holdAt := start.Add(*ramp + *settle)
	until := holdAt.Add(*hold + time.Second)
	method, body := "GET ", ""
	if *post {
		method = "POST "
		body = `{"model":"bench","stream":true,"max_tokens":4096,"messages":[{"role":"user","content":"stream tokens"}]}`
	}
	head := []byte(method + *path + "?every=" + strconv.Itoa(every) + "&until=" + strconv.FormatInt(until.UnixMilli(), 10) +
		" HTTP/1.1\r\nHost: " + *addr + "\r\nAccept: text/event-stream\r\nUser-Agent: streambench\r\n")
	if *key != "" {
		head = append(head, "X-API-Key: "+*key+"\r\n"...)
	}
	if body != "" {
		head = append(head, "Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n"...)
	}
	head = append(head, "\r\n"+body...)

	rssBefore := rssKB(pids)
	st := &loadStats{ttfb: make([]time.Duration, 0, *streams)}
	var wg sync.WaitGroup
	gap := *ramp / time.Duration(max(*streams, 1))
	for i := range *streams {
		if d := time.Until(start.Add(gap * time.Duration(i))); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			oneStream(*addr, head, until.Add(30*time.Second), st, min(rampTenths-1, i*rampTenths/max(*streams, 1)))
		}()
	}
	time.Sleep(time.Until(holdAt))
	rssOpen := rssKB(pids)
	openAtHold := st.open.Load()
	cpu0, ev0, t0 := cpuTicks(pids), st.events.Load(), time.Now()
	time.Sleep(*hold)
	cpu1, ev1, t1 := cpuTicks(pids), st.events.Load(), time.Now()
	wg.Wait()

	st.mu.Lock()
	slices.Sort(st.ttfb)
	p50, p90, p99 := pct(st.ttfb, 50), pct(st.ttfb, 90), pct(st.ttfb, 99)
	tenths := make([]string, rampTenths)
	for i, d := range st.byTenth {
		slices.Sort(d)
		tenths[i] = strconv.FormatFloat(ms(pct(d, 50)), 'f', 2, 64)
	}
	st.mu.Unlock()
	events := ev1 - ev0
	perStream := 0.0
	if openAtHold > 0 {
		perStream = float64(rssOpen-rssBefore) / float64(openAtHold)
	}
	cpuPerEvent := 0.0 // CPU µs per event
	if events > 0 {
		cpuPerEvent = float64(cpu1-cpu0) * 1e6 / float64(clockTicks) / float64(events)
	}
	fmt.Printf("RESULT name=%s streams=%d open=%d completed=%d failed=%d rss_before_kb=%d rss_open_kb=%d "+
		"rss_per_stream_kb=%.2f cpu_pct=%.1f events=%d cpu_per_event_us=%.3f ttfb_p50_ms=%.3f ttfb_p90_ms=%.3f ttfb_p99_ms=%.3f "+
		"ttfb_ramp_p50_ms=%s\n",
		*name, *streams, openAtHold, st.completed.Load(), st.failed.Load(), rssBefore, rssOpen, perStream,
		float64(cpu1-cpu0)*100/float64(clockTicks)/t1.Sub(t0).Seconds(), events, cpuPerEvent,
		ms(p50), ms(p90), ms(p99), strings.Join(tenths, ","))
	if st.firstErr != nil {
		fmt.Fprintf(os.Stderr, "%s: %d streams failed; first: %v\n", *name, st.failed.Load(), st.firstErr)
	}
	return nil
}

var eventEnd = []byte("\n\n")

// oneStream opens one stream and reads it to its end.
// tenth is the slice of the ramp it opens in.
func oneStream(addr string, head []byte, deadline time.Time, st *loadStats, tenth int) {
	t0 := time.Now()
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		st.fail(err)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := c.Write(head); err != nil {
		st.fail(err)
		return
	}
	br := bufio.NewReaderSize(c, 1024)
	if _, err := br.Peek(1); err != nil {
		st.fail(fmt.Errorf("waiting for the answer: %w", err))
		return
	}
	ttfb := time.Since(t0)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		st.fail(err)
		return
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		st.fail(fmt.Errorf("status %d: %s", resp.StatusCode, b))
		return
	}
	st.mu.Lock()
	st.ttfb = append(st.ttfb, ttfb)
	st.byTenth[tenth] = append(st.byTenth[tenth], ttfb)
	st.mu.Unlock()
	st.open.Add(1)
	defer st.open.Add(-1)
	var buf [512]byte
	var tail []byte // an event's start left over from the last read
	for {
		n, err := resp.Body.Read(buf[:])
		if n > 0 {
			b := buf[:n]
			if len(tail) > 0 {
				b = append(tail, b...)
			}
			cnt := bytes.Count(b, eventEnd)
			st.events.Add(int64(cnt))
			if i := bytes.LastIndex(b, eventEnd); i >= 0 {
				tail = append(tail[:0], b[i+2:]...)
			} else {
				tail = append(tail[:0], b...)
			}
		}
		if err == io.EOF {
			st.completed.Add(1)
			return
		}
		if err != nil {
			st.fail(fmt.Errorf("reading the stream: %w", err))
			return
		}
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, len(d)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func parsePids(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("-pids: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on Linux).
const clockTicks = 100

// rssKB sums VmRSS of pids (/proc/PID/status).
func rssKB(pids []int) int64 {
	var total int64
	for _, p := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/status")
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				total += n
			}
		}
	}
	return total
}

// cpuTicks sums utime and stime of pids (/proc/PID/stat, fields 14 and 15).
func cpuTicks(pids []int) int64 {
	var total int64
	for _, p := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
		if err != nil {
			continue
		}
		// The command name may hold spaces: fields count from after ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fs := strings.Fields(string(b[i+1:]))
		if len(fs) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(fs[11], 10, 64)
		s, _ := strconv.ParseInt(fs[12], 10, 64)
		total += u + s
	}
	return total
}

var errUsage = errors.New("usage: streambench upstream|load [flags]")
