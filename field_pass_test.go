package gpuproxy_test

import (
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy"
)

// TestFieldStringListSecret: a FieldString takes one string up to its
// length, a FieldList an array of strings; other JSON is refused naming
// the field, and a Secret field's refusal never quotes the value.
func TestFieldStringListSecret(t *testing.T) {
	rules := gpuproxy.FieldRules{
		{Name: "login", Kind: gpuproxy.FieldString, MaxLen: 20, Secret: true},
		{Name: "script", Kind: gpuproxy.FieldString, MaxLen: 5},
		{Name: "args", Kind: gpuproxy.FieldList, MaxItems: 2, MaxLen: 3},
	}
	for _, c := range []struct{ body, field string }{
		{`{"login":"-u a -p s3cr3t","script":"","args":["a","bc"]}`, ""},
		{`{"args":[]}`, ""},
		{`{"login":null}`, ""},
		{`{"login":"s3cr3t-s3cr3t-s3cr3t-s3cr3t"}`, "login"},
		{`{"login":["s3cr3t"]}`, "login"},
		{`{"login":12345}`, "login"},
		{`{"script":"echo hi"}`, "script"},
		{`{"script":["a"]}`, "script"},
		{`{"args":"a"}`, "args"},
		{`{"args":["a","b","c"]}`, "args"},
		{`{"args":["abcd"]}`, "args"},
		{`{"args":[1]}`, "args"},
	} {
		err := rules.Check([]byte(c.body))
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: %v", c.body, err)
			}
			continue
		}
		if gpuproxy.ErrorCode(err) != gpuproxy.EINVALID || gpuproxy.ErrorDetails(err)["field"] != c.field {
			t.Errorf("%s: %v, want invalid naming %s", c.body, err, c.field)
		}
		if c.field == "login" && strings.Contains(gpuproxy.ErrorMessage(err), "s3cr3t") {
			t.Errorf("%s: the refusal quotes the secret: %v", c.body, err)
		}
	}
}
