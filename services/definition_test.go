package services_test

import (
	"errors"
	"testing"

	"github.com/aiserve/gpuproxy"
	"github.com/aiserve/gpuproxy/services"
)

// TestDecodeDefinitionNamesNestedFields: a wrong type or an unknown field
// inside the spec or another object is named by its whole path, as the
// REST body has it, not by its last name alone.
func TestDecodeDefinitionNamesNestedFields(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, field string }{
		{`{"name":"llama","spec":{"gpus":"A100"}}`, "spec.gpus"},
		{`{"name":"llama","replicas":{"min":1,"maxx":2}}`, "replicas.maxx"},
		{`{"name":"llama","replica":{"min":1}}`, "replica"},
		{`{"name":"llama","model":7}`, "model"},
		{`{"name":"llama","spec":{"locations":{"a":1}}}`, "spec.locations"},
	} {
		_, err := services.DecodeDefinition([]byte(c.body), nil)
		if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID {
			t.Errorf("%s: %v, want invalid", c.body, err)
			continue
		}
		var e *gpuproxy.Error
		if !errors.As(err, &e) || e.Details["field"] != c.field {
			t.Errorf("%s: %v names %v, want %s", c.body, err, e.Details["field"], c.field)
		}
	}
}
