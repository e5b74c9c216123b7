package proxy

import (
	"encoding/json"
	"errors"

	"github.com/aiserve/gpuproxy/internal/h1client"
)

// cutFilter passes a detached stream through its filter (if any) and
// ends it, when the replica's side fails mid-way, with streamCutEvent
// (h1client.Cutter): a service's token streams.
type cutFilter struct{ f h1client.Filter }

// Filter implements h1client.Filter.
func (c cutFilter) Filter(p []byte, e h1client.Emitter) error {
	if c.f == nil {
		return e.Emit(p)
	}
	return c.f.Filter(p, e)
}

// Flush implements h1client.Filter.
func (c cutFilter) Flush(e h1client.Emitter) error {
	if c.f == nil {
		return nil
	}
	return c.f.Flush(e)
}

// Cut implements h1client.Cutter.
func (cutFilter) Cut(err error) []byte { return streamCutEvent(err) }

// streamCutEvent is what a service's token stream's caller reads when the replica's
// side of the stream fails mid-way (its instance preempted or gone, a
// body over the limit): an SSE event carrying an OpenAI-shaped error, so
// that clients (the OpenAI SDKs raise it) know the answer is incomplete
// rather than meeting a body cut short. It starts with a blank line,
// ending an event the cut left half-written.
func streamCutEvent(err error) []byte {
	msg := "the replica's answer was cut before its end (its instance failed or was preempted): the answer is incomplete"
	if errors.Is(err, errResponseTooLarge) || errors.Is(err, h1client.ErrBodyTooLarge) {
		msg = "the replica's answer is over the response limit: the answer is incomplete"
	}
	b, _ := json.Marshal(struct {
		Error any `json:"error"`
	}{struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
		Param   any    `json:"param"`
	}{msg, "server_error", CodeUpstream, nil}})
	out := make([]byte, 0, len(b)+10)
	out = append(out, "\n\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}
