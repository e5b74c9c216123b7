// Command benchmarket is the load driver of scripts/bench-market.sh: it
// rents replicas by spec through a running `gpuproxy serve` (which talks to
// `gpuproxy sim --market`), sends a steady request load to them through the
// instance proxy for a fixed time, and prints what a million output tokens
// cost, the share of requests answered, latency, preemptions, replicas used
// and the peak spend of each window against its limit.
//
//	benchmarket run -url URL -key KEY -market on-demand|interruptible|any -out FILE [flags]
//	benchmarket compare FILE...
//
// Services have no placement yet, so benchmarket stands in for the
// services controller and router: it keeps -replicas replicas, each a rent
// by spec with the placement's market; when one is preempted (or fails) it
// destroys it at once and rents a replacement by spec (the paused one may
// resume by itself on vast.ai, but its disk bills while it waits), and a
// request that fails on one replica is retried once on another, as the
// services router does.
package main

import (
	"errors"
	"fmt"
	"os"
)

var errUsage = errors.New("usage: benchmarket run -url URL -key KEY -market M -out FILE [flags] | benchmarket compare FILE [FILE]")

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
