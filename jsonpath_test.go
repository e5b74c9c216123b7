package gpuproxy_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/aiserve/gpuproxy"
)

// TestJSONErrorField checks that a decoding error names its field with
// the index of every array on the way, as encoding/json itself does not:
// a type error in the second window is windows[1].…, an unknown field in
// the first windows[0].…
func TestJSONErrorField(t *testing.T) {
	type window struct {
		WindowMinutes int     `json:"window_minutes"`
		Limit         float64 `json:"limit"`
	}
	type Embedded struct {
		Note string `json:"note"`
	}
	type body struct {
		Embedded
		Windows []window               `json:"windows"`
		ByName  map[string][]window    `json:"by_name"`
		Nested  *struct{ Ws []window } `json:"nested"`
		Grid    [][]int                `json:"grid"`
		Name    string                 `json:"name"`
		Raw     json.RawMessage        `json:"raw"`
	}
	for _, c := range []struct{ body, want string }{
		{`{"windows":[{"window_minutes":"60","limit":5}]}`, "windows[0].window_minutes"},
		{`{"windows":[{"window_minutes":60,"limit":5},{"window_minutes":60,"limit":"abc"}]}`, "windows[1].limit"},
		{`{"windows":[{"window_minutes":60,"limit":5},{"window_minutes":true}]}`, "windows[1].window_minutes"},
		{`{"windows":[{"window_minutes":1},{"window_minutes":2},{"window_minutes":{}}]}`, "windows[2].window_minutes"},
		{`{"windows":[{"window_minutes":60},5]}`, "windows[1]"},
		{`{"windows":{"window_minutes":60}}`, "windows"},
		{`{"windows":[{"duration":"1h","limit":"abc"}]}`, "windows[0].duration"},
		{`{"windows":[{"limit":1},{"limit":2,"limitt":3}]}`, "windows[1].limitt"},
		{`{"by_name":{"a":[{"window_minutes":1}],"b":[{"window_minutes":"x"}]}}`, "by_name.b[0].window_minutes"},
		{`{"nested":{"Ws":[{"window_minutes":1},{"window_minutes":[]}]}}`, "nested.Ws[1].window_minutes"},
		{`{"nested":{"ws":[{"window_minutes":1},{"extra":1}]}}`, "nested.ws[1].extra"},
		{`{"grid":[[1,2],[3,"x"]]}`, "grid[1][1]"},
		{`{"raw":{"windows":[{"name":1}]},"name":5}`, "name"},
		{`{"note":7}`, "note"}, // encoding/json calls it Embedded.note
		{`{"windows":[],"nme":"x"}`, "nme"},
		{`{"name":"x"}`, ""}, // no error
	} {
		var v body
		dec := json.NewDecoder(bytes.NewReader([]byte(c.body)))
		dec.DisallowUnknownFields()
		err := dec.Decode(&v)
		if got := gpuproxy.JSONErrorField([]byte(c.body), &v, err); got != c.want {
			t.Errorf("%s (%v): field %q, want %q", c.body, err, got, c.want)
		}
	}
	// Not a decoding error, or a malformed body: no field.
	if got := gpuproxy.JSONErrorField([]byte(`{"windows":[`), &body{}, &json.UnmarshalTypeError{Field: "windows", Type: reflect.TypeFor[int](), Offset: 12}); got != "" {
		t.Errorf("a truncated body: %q", got)
	}
}
