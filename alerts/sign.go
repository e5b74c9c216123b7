package alerts

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries a webhook's signature: "t=UNIX,v1=HEX".
const SignatureHeader = "X-Gpuproxy-Signature"

// Other headers of every webhook POST.
const (
	EventHeader    = "X-Gpuproxy-Event"    // the event's kind
	DeliveryHeader = "X-Gpuproxy-Delivery" // the event's id (the same on every attempt)
)

// NewSecret returns a new signing secret: "whsec_" and 48 hex digits.
func NewSecret() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "whsec_" + hex.EncodeToString(b)
}

// Sign returns the signature header value of body sent at t under
// secret: "t=UNIX,v1=HEX", HEX being the lower-case hex HMAC-SHA256,
// keyed with the secret's bytes as shown, of the decimal UNIX time, a
// '.', and the raw body.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Errors of Verify.
var (
	ErrNoSignature  = errors.New("no valid t= and v1= in the signature header")
	ErrBadSignature = errors.New("signature does not match")
	ErrStale        = errors.New("signature timestamp outside the tolerance")
)

// Verify checks a signature header value against body and secret, as a
// receiver does: some v1= must be the HMAC of "t.body" (compared in
// constant time) and, when tolerance is positive, t must be within
// tolerance of now (replay protection).
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrNoSignature
	}
	want := mac(secret, ts, body)
	ok := false
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			ok = true
		}
	}
	if !ok {
		return ErrBadSignature
	}
	if tolerance > 0 {
		if d := now.Sub(time.Unix(unix, 0)); d > tolerance || d < -tolerance {
			return ErrStale
		}
	}
	return nil
}
