package teststack

import (
	"errors"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/providers"
)

// WantKind fails the test unless err is a *providers.Error of kind k whose
// text and message do not contain secret (the provider's API key), and
// returns it.
func WantKind(t testing.TB, err error, k providers.Kind, secret string) *providers.Error {
	t.Helper()
	var pe *providers.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T), want *providers.Error of kind %s", err, err, k)
	}
	if pe.Kind != k {
		t.Fatalf("kind %s (%v), want %s", pe.Kind, err, k)
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(pe.Message, secret) {
		t.Fatalf("API key leaked into error: %v", err)
	}
	return pe
}
