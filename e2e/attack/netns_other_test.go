//go:build !linux

package attack

import (
	"errors"
	"net"
)

// listenInNetns: network namespaces are Linux's; the partition falls back
// to the forwarder that stops forwarding.
func listenInNetns(ns, addr string) (net.Listener, error) {
	return nil, errors.New("network namespaces need Linux")
}
