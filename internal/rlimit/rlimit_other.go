//go:build !linux

package rlimit

import "errors"

// Get returns errors.ErrUnsupported: limits are read on Linux only.
func Get() (Limit, error) { return Limit{}, errors.ErrUnsupported }

// Raise does nothing and returns errors.ErrUnsupported: limits are raised
// on Linux only.
func Raise() (before, after Limit, err error) { return Limit{}, Limit{}, errors.ErrUnsupported }
