package proxy

import (
	"bytes"
	"encoding/json"
)

// Reading a request body's few top-level fields (a priced request's
// max_tokens, max_completion_tokens and n; a stream's stream and
// stream_options) without encoding/json's allocations: the body is
// checked whole by json.Valid (which allocates nothing once its scanner
// pool is warm), then its top-level members are walked, each value's raw
// bytes handed over as json.Unmarshal would put them in a json.RawMessage.
// Keys match as encoding/json matches a struct's field names: exactly or
// case-insensitively (ASCII; a key with escapes or non-ASCII bytes is left
// to encoding/json: topFields reports false), the last member winning.
// FuzzTopFields holds it to json.Unmarshal.

// topFields calls f with each top-level member of body, a JSON object,
// and reports whether body is one; a JSON null is an object without
// members (as json.Unmarshal into a struct reads it). ok is false for
// invalid JSON, another top-level value, or a key topFields leaves to
// encoding/json (then f may have seen some members).
func topFields(body []byte, f func(key, value []byte)) (ok bool) {
	if !json.Valid(body) {
		return false
	}
	i := skipSpace(body, 0)
	if bytes.HasPrefix(body[i:], []byte("null")) {
		return true
	}
	if body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	if body[i] == '}' {
		return true
	}
	for {
		// body[i] is the '"' of a key (the body is valid).
		end := i + 1
		for body[end] != '"' {
			if c := body[end]; c == '\\' || c >= 0x80 {
				return false
			}
			end++
		}
		key := body[i+1 : end]
		i = skipSpace(body, end+1) + 1 // past ':'
		i = skipSpace(body, i)
		vend := skipValue(body, i)
		f(key, body[i:vend])
		i = skipSpace(body, vend)
		if body[i] == '}' {
			return true
		}
		i = skipSpace(body, i+1) // past ','
	}
}

// skipSpace returns the index of the first non-space byte of b at or
// after i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the valid JSON value at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// skipString returns the index just past the valid JSON string at b[i].
func skipString(b []byte, i int) int {
	for i++; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// fieldIs reports whether key names the field name (lower-case ASCII) as
// encoding/json matches it.
func fieldIs(key []byte, name string) bool {
	return len(key) == len(name) && bytes.EqualFold(key, []byte(name))
}
