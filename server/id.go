package server

import (
	"crypto/rand"
	"encoding/hex"
)

// gpuproxyID returns a random request id.
func gpuproxyID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
