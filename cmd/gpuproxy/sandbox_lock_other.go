//go:build !unix

package main

import (
	"errors"
	"fmt"
	"os"
)

// lockSandbox takes the lock at path by creating it exclusively:
// errSandboxBusy if it exists. Without flock a killed sandbox leaves it
// behind; the error then says to remove it.
func lockSandbox(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%w (%s exists; remove it if no sandbox runs)", errSandboxBusy, path)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the sandbox lock: %w", err)
	}
	_ = f.Close()
	return func() { _ = os.Remove(path) }, nil
}

// processAlive cannot tell here; the state file is removed when the
// sandbox stops.
func processAlive(pid int) bool { return pid > 0 }
