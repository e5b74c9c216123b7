package proxy

import (
	"encoding/json"
	"testing"
)

var modelBody = []byte(`{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)

// BenchmarkModelOnly: the service endpoint's read of a body's model
// (modelOnly.read) against the json.Unmarshal it replaces.
func BenchmarkModelOnly(b *testing.B) {
	b.Run("read", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var mo modelOnly
			if err := mo.read(modelBody); err != nil || mo.Model == nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var mo modelOnly
			if err := json.Unmarshal(modelBody, &mo); err != nil || mo.Model == nil {
				b.Fatal(err)
			}
		}
	})
}
