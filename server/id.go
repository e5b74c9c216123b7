package server

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
)

// gpuproxyID returns a random request id: 24 hex digits. Request ids need
// to be unique and not to reveal the request rate, not to be secret, so
// they come from math/rand/v2's generator (ChaCha8, seeded by the OS)
// rather than a system call per request.
func gpuproxyID() string {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint32(b[8:], rand.Uint32())
	var out [24]byte
	hex.Encode(out[:], b[:])
	return string(out[:])
}
