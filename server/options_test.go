package server_test

import (
	"strings"
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
	if err == nil || !strings.Contains(err.Error(), "MaxBody is -5") || !strings.Contains(err.Error(), "1 MiB") {
		t.Fatalf("MaxBody -5: %v, want an error naming MaxBody, -5 and the default", err)
	}
}
