package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// cookieName is the session cookie. (The __Host- prefix would require
// Secure, which a plain-HTTP deployment on loopback cannot set.)
const cookieName = "gpuproxy_console"

// session is what the signed cookie carries: never the key, only its id.
type session struct {
	KeyID string `json:"k"`
	Start int64  `json:"s"` // sign-in, Unix seconds: bounds the session's whole life
	Exp   int64  `json:"e"` // expiry, Unix seconds: renewed while the session is used
	Nonce string `json:"n"` // random; the CSRF token is derived from it
}

// sessions signs and checks session tokens and CSRF tokens with one secret.
type sessions struct {
	secret []byte
	idle   time.Duration // a token's life, renewed by use
	max    time.Duration // a session's whole life from sign-in
}

func (s sessions) mac(purpose, msg string) []byte {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write([]byte(msg))
	return m.Sum(nil)
}

var b64 = base64.RawURLEncoding

// start returns a new session for keyID signed in at now.
func (s sessions) start(keyID string, now time.Time) session {
	n := make([]byte, 16)
	_, _ = rand.Read(n)
	ss := session{KeyID: keyID, Start: now.Unix(), Nonce: b64.EncodeToString(n)}
	return s.renewed(ss, now)
}

// renewed extends ss by the idle time, never past its whole life.
func (s sessions) renewed(ss session, now time.Time) session {
	ss.Exp = min(now.Add(s.idle).Unix(), time.Unix(ss.Start, 0).Add(s.max).Unix())
	return ss
}

// needsRenewal reports whether ss has used half its idle time and can
// still be extended.
func (s sessions) needsRenewal(ss session, now time.Time) bool {
	return time.Unix(ss.Exp, 0).Sub(now) < s.idle/2 && s.renewed(ss, now).Exp > ss.Exp
}

// encode renders ss as payload.signature, both base64url.
func (s sessions) encode(ss session) string {
	p, _ := json.Marshal(ss)
	payload := b64.EncodeToString(p)
	return payload + "." + b64.EncodeToString(s.mac("session", payload))
}

// decode checks a token's signature and expiry.
func (s sessions) decode(tok string, now time.Time) (session, bool) {
	payload, sig, ok := strings.Cut(tok, ".")
	if !ok || len(tok) > 1024 {
		return session{}, false
	}
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac("session", payload)) {
		return session{}, false
	}
	p, err := b64.DecodeString(payload)
	var ss session
	if err != nil || json.Unmarshal(p, &ss) != nil || ss.KeyID == "" || ss.Nonce == "" {
		return session{}, false
	}
	if now.Unix() >= ss.Exp || now.Unix() >= time.Unix(ss.Start, 0).Add(s.max).Unix() {
		return session{}, false
	}
	return ss, true
}

// csrf is the session's CSRF token: a MAC of its nonce, so it needs no
// storage and changes with every sign-in.
func (s sessions) csrf(ss session) string {
	return b64.EncodeToString(s.mac("csrf", ss.Nonce))
}

// checkCSRF compares a submitted token with the session's in constant time.
func (s sessions) checkCSRF(ss session, tok string) bool {
	got, err := b64.DecodeString(tok)
	return err == nil && tok != "" && hmac.Equal(got, s.mac("csrf", ss.Nonce))
}

// secure reports whether r reached us over TLS (directly, or through a
// proxy that says so); the cookie is then marked Secure.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// setCookie stores ss in the session cookie. It is a browser-session
// cookie: the token's own expiry bounds it.
func (s sessions) setCookie(w http.ResponseWriter, r *http.Request, ss session) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.encode(ss), Path: "/console/",
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
}

// clearCookie ends the session in this browser.
func clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/console/", MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
}
