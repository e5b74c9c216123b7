//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockSandbox takes the exclusive lock at path (flock on a file created if
// missing, never removed), without waiting: errSandboxBusy if another
// sandbox holds it. The lock ends with unlock or with the process, however
// it ends, so a killed sandbox leaves no stale lock.
func lockSandbox(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the sandbox lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errSandboxBusy
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, nil
}

// processAlive reports whether a process with this id exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
