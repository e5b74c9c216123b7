package h1client

import "errors"

// chunkDecoder decodes a chunked body (RFC 9112 §7.1) as its bytes arrive,
// in pieces of any size: it never needs more bytes than it was given, so a
// detached stream can feed it exactly what one read returned, inside the
// read (see detachedStream.relay). It accepts what net/http's chunked
// reader accepts and refuses what it refuses, with the same limits
// (differential fuzz test): a size line of hex digits (at most 16), an
// optional extension after ';' (ignored), trailing spaces or tabs, ended by
// CRLF (no bare LF, no other CR), shorter than 4096 bytes; data followed
// by CRLF; at most 16 KiB of framing beyond 16 bytes per chunk and twice
// its data. The body ends with the size line of the zero-size chunk; what
// follows (trailer, final CRLF) is the caller's.
type chunkDecoder struct {
	state   uint8
	n       uint64 // the size being read, then the data left in the chunk
	digits  int    // hex digits of the size line so far
	lineLen int    // bytes of the size line so far, CRLF excluded
	excess  int64  // framing beyond the allowance (as net/http counts it)
}

const (
	ckDigits uint8 = iota // the size's hex digits
	ckOWS                 // spaces or tabs after them
	ckExt                 // an extension, after ';'
	ckLF                  // the LF after the line's CR
	ckData                // n data bytes left
	ckDataCR              // the CR after the data
	ckDataLF              // the LF after it
	ckDone                // the last chunk's size line is read
)

// maxChunkLine is net/http's bound on a chunk size line, CRLF excluded.
const maxChunkLine = 4096

var (
	errChunkLine     = errors.New("malformed chunk size line")
	errChunkEnd      = errors.New("malformed chunked encoding")
	errChunkTooLarge = errors.New("http chunk length too large")
	errChunkLineLong = errors.New("chunk size line too long")
	errChunkExcess   = errors.New("chunked encoding contains too much non-data")
)

// next consumes the framing at the start of in and returns the data
// segment that follows it (a slice of in, possibly empty at the end of
// in), how many bytes of in it used, and whether the body has ended (the
// last chunk's size line used: in[used:] is what follows the body).
func (d *chunkDecoder) next(in []byte) (data []byte, used int, done bool, err error) {
	i := 0
	for i < len(in) {
		if d.state == ckDone {
			return nil, i, true, nil
		}
		if d.state == ckData {
			k := min(uint64(len(in)-i), d.n)
			d.n -= k
			if d.n == 0 {
				d.state = ckDataCR
			}
			return in[i : i+int(k)], i + int(k), false, nil
		}
		c := in[i]
		i++
		switch d.state {
		case ckDataCR:
			if c != '\r' {
				return nil, i, false, errChunkEnd
			}
			d.state = ckDataLF
			continue
		case ckDataLF:
			if c != '\n' {
				return nil, i, false, errChunkEnd
			}
			d.state, d.n, d.digits, d.lineLen = ckDigits, 0, 0, 0
			continue
		case ckLF:
			if c != '\n' {
				return nil, i, false, errChunkLine // a CR not ending the line
			}
			if err := d.endLine(); err != nil {
				return nil, i, false, err
			}
			if d.state == ckDone {
				return nil, i, true, nil
			}
			continue
		}
		if c == '\r' {
			d.state = ckLF
			continue
		}
		if d.lineLen++; d.lineLen >= maxChunkLine {
			return nil, i, false, errChunkLineLong
		}
		switch {
		case c == '\n':
			return nil, i, false, errChunkLine // a bare LF
		case d.state == ckExt:
		case d.state == ckOWS:
			if c != ' ' && c != '\t' {
				return nil, i, false, errChunkLine // only spaces or tabs may end the line
			}
		case c == ';':
			d.state = ckExt
		case c == ' ' || c == '\t':
			d.state = ckOWS
		default:
			v, ok := unhex(c)
			if !ok {
				return nil, i, false, errChunkLine
			}
			if d.digits == 16 {
				return nil, i, false, errChunkTooLarge
			}
			d.digits++
			d.n = d.n<<4 | uint64(v)
		}
	}
	return nil, i, d.state == ckDone, nil
}

// endLine ends a size line: the chunk's data follows, or the body ends.
func (d *chunkDecoder) endLine() error {
	if d.digits == 0 {
		return errChunkLine
	}
	d.excess += int64(d.lineLen) + 2 // the line, and the CRLF after the data
	d.excess -= 16 + 2*int64(d.n)
	d.excess = max(d.excess, 0)
	if d.excess > 16<<10 {
		return errChunkExcess
	}
	if d.n == 0 {
		d.state = ckDone
	} else {
		d.state = ckData
	}
	return nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
