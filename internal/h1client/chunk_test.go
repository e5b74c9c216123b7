package h1client

import (
	"bufio"
	"bytes"
	"io"
	"net/http/httputil"
	"testing"
)

// decodeAll feeds in to a chunkDecoder in pieces of at most step bytes
// and returns the data, whether the body ended, and the error.
func decodeAll(in []byte, step int) ([]byte, bool, error) {
	var d chunkDecoder
	var out []byte
	for len(in) > 0 {
		piece := in[:min(step, len(in))]
		for len(piece) > 0 {
			data, used, done, err := d.next(piece)
			out = append(out, data...)
			if err != nil {
				return out, false, err
			}
			if done {
				return out, true, nil
			}
			piece = piece[used:]
			in = in[used:]
		}
	}
	return out, false, nil
}

// reference decodes in with net/http's chunked reader (with a buffer
// large enough that only its own line limit applies).
func reference(in []byte) ([]byte, bool, error) {
	out, err := io.ReadAll(httputil.NewChunkedReader(bufio.NewReaderSize(bytes.NewReader(in), 64<<10)))
	if err == io.ErrUnexpectedEOF {
		return out, false, nil // ran out of input: not an error, not ended
	}
	return out, err == nil, err
}

var chunkSeeds = []string{
	"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n",
	"4;ext=1\r\nWiki\r\n0\r\n\r\n",
	"4 \t\r\nWiki\r\n0\r\n",
	"4 ;x\r\nWiki\r\n0\r\n",
	"4\nWiki\r\n0\r\n",
	"4\r\nWikiX\r\n0\r\n",
	"\r\n",
	";x\r\n",
	" 4\r\nWiki\r\n0\r\n",
	"00000000000000004\r\nWiki\r\n0\r\n",
	"0000000000000004\r\nWiki\r\n0\r\n",
	"A\r\n0123456789\r\n0\r\n",
	"4\r\nWi",
	"4\r\nWiki\r",
	"1\r\nX\r\n1\r\nY\r\n",
	"4\r\r\nWiki\r\n0\r\n",
	"4;a\rb\r\nWiki\r\n0\r\n",
	"4\r\nWiki\r\n0;last\r\nTrailer: x\r\n\r\n",
}

// TestChunkDecoderMatchesNetHTTP: the decoder gives the data, the end
// and the refusals net/http's chunked reader gives, whatever pieces the
// bytes come in.
func TestChunkDecoderMatchesNetHTTP(t *testing.T) {
	t.Parallel()
	for _, s := range chunkSeeds {
		for _, step := range []int{1, 2, 3, 7, 1 << 20} {
			compareChunked(t, []byte(s), step)
		}
	}
	long := append(bytes.Repeat([]byte("a"), maxChunkLine-1), "\r\n"...)
	compareChunked(t, append([]byte("1;"), long...), 5)
	compareChunked(t, append([]byte("1;"), long[2:]...), 5)
	many := bytes.Repeat([]byte("1;"+string(bytes.Repeat([]byte("e"), 100))+"\r\nX\r\n"), 300)
	compareChunked(t, many, 64)
}

func FuzzChunkDecoder(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		compareChunked(t, in, int(step)+1)
	})
}

func compareChunked(t *testing.T, in []byte, step int) {
	t.Helper()
	got, gotDone, gotErr := decodeAll(in, step)
	want, wantDone, wantErr := reference(in)
	if gotErr != nil && wantErr == nil && !wantDone {
		// The decoder refuses as soon as a byte is wrong; net/http, given
		// too few bytes, waits for the rest of the line: it must refuse
		// once the line ends.
		if _, _, err := reference(append(append([]byte(nil), in...), "\r\n"...)); err != nil {
			return
		}
	}
	if (gotErr != nil) != (wantErr != nil) || gotDone != wantDone || (wantErr == nil && !bytes.Equal(got, want)) {
		t.Fatalf("%q in pieces of %d: decoder %q done=%v err=%v; net/http %q done=%v err=%v",
			in, step, got, gotDone, gotErr, want, wantDone, wantErr)
	}
}
