package server_test

import (
	"testing"

	"github.com/aiserve/gpuproxy/server"
)

// Validate names the wrong field and prints its configured value; zero
// values take the defaults.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := (server.Options{}).Validate(); err != nil {
		t.Fatalf("zero options: %v", err)
	}
	if err := (server.Options{MaxBody: 2048}).Validate(); err != nil {
		t.Fatalf("MaxBody 2048: %v", err)
	}
	err := (server.Options{MaxBody: -5}).Validate()
	if want := "server.Options.MaxBody: must not be negative, got -5 (0 takes the default 1 MiB)"; err == nil || err.Error() != want {
		t.Fatalf("MaxBody -5: %v, want %q", err, want)
	}
}
