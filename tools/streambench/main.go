// Command streambench is the SSE upstream and the load client of
// scripts/bench-streams.sh, which measures long-lived token streams
// reached directly, through gpuproxy (tools/benchproxy) and
// through nginx proxy_pass.
//
//	streambench upstream -addr 127.0.0.1:0
//	streambench load -addr HOST:PORT [-path P] [-key K] -streams N -rate R -ramp D -hold D -pids PID,…
//
// The upstream prints "READY <addr>"; the load client prints one line
// "RESULT name=… streams=… open=… completed=… failed=… rss_before_kb=…
// rss_open_kb=… rss_per_stream_kb=… cpu_pct=… events=… cpu_per_event_us=…
// ttfb_p50_ms=… ttfb_p90_ms=… ttfb_p99_ms=… ttfb_ramp_p50_ms=…" (the last: the
// first byte's p50 for the streams opened in each tenth of the ramp).
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, errUsage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "upstream":
		err = runUpstream(os.Args[2:])
	case "load":
		err = runLoad(os.Args[2:])
	default:
		err = errUsage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "streambench:", err)
		os.Exit(1)
	}
}
