package rlimit

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// rlimInfinity is RLIM_INFINITY.
const rlimInfinity = ^uint64(0)

// Get returns the process's open-files limits.
func Get() (Limit, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return Limit{}, fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	return Limit{Soft: l.Cur, Hard: l.Max}, nil
}

// Raise raises the soft open-files limit to the hard one (to the kernel's
// fs.nr_open when the hard limit is unlimited) and returns the limits
// before and after.
func Raise() (before, after Limit, err error) {
	before, err = Get()
	if err != nil {
		return before, before, err
	}
	target := before.Hard
	if target == rlimInfinity {
		if n, ok := nrOpen(); ok {
			target = n
		}
	}
	if before.Soft >= target {
		return before, before, nil
	}
	l := syscall.Rlimit{Cur: target, Max: before.Hard}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return before, before, fmt.Errorf("raising RLIMIT_NOFILE from %d to %d: %w", before.Soft, target, err)
	}
	after, err = Get()
	return before, after, err
}

// nrOpen reads fs.nr_open, the most descriptors a process may have.
func nrOpen() (uint64, bool) {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}
