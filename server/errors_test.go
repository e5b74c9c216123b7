package server

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
)

// TestJSONErrorEOF: an empty body and a truncated one are told apart by
// the error's identity (errors.Is), not its text, so a wrapped io.EOF is
// still "a JSON object is required" and a wrapped io.ErrUnexpectedEOF
// still "truncated".
func TestJSONErrorEOF(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{io.EOF, "a JSON object is required"},
		{fmt.Errorf("reading body: %w", io.EOF), "a JSON object is required"},
		{io.ErrUnexpectedEOF, "malformed JSON (truncated)"},
		{fmt.Errorf("reading body: %w", io.ErrUnexpectedEOF), "malformed JSON (truncated)"},
		{errors.New("EOF here"), "EOF here"},
	} {
		got := jsonError(tc.err)
		if gpuproxy.ErrorCode(got) != gpuproxy.EINVALID || !strings.Contains(gpuproxy.ErrorMessage(got), tc.want) {
			t.Errorf("jsonError(%q) = %v, want invalid %q", tc.err, got, tc.want)
		}
	}
}
