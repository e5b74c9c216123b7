// Command benchmarket is the load driver of scripts/bench-market.sh: it
// defines a service with a placement through a running `gpuproxy serve`
// (which talks to `gpuproxy sim --market`), sends a steady request load to
// the service's OpenAI endpoint for a fixed time, and prints what a
// million output tokens cost, the share of requests answered, latency,
// preemptions, replicas rented and the peak spend of each window against
// its limit.
//
//	benchmarket run -url URL -key KEY -placement on-demand|interruptible|interruptible-with-fallback -out FILE [flags]
//	benchmarket compare FILE...
//
// The services controller does the work: it rents the replicas by spec
// on the placement's market, spreads them, replaces a preempted one (kept
// paused for the service's preempted_grace in case it resumes), falls
// back to on-demand replicas while interruptible ones are short and moves
// back; the services router retries a request whose replica could not
// answer on another.
package main

import (
	"errors"
	"fmt"
	"os"
)

var errUsage = errors.New("usage: benchmarket run -url URL -key KEY -placement P -out FILE [flags] | benchmarket compare FILE [FILE]")

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, errUsage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runBench(os.Args[2:], os.Stdout)
	case "compare":
		err = compare(os.Args[2:], os.Stdout)
	default:
		err = errUsage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarket:", err)
		os.Exit(1)
	}
}
