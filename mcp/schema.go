package mcp

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/aiserve/gpuproxy"
)

// Input schemas are written out by hand so that every argument carries a
// description and bounds; the SDK validates arguments against them before
// a tool runs.

type field struct {
	name     string
	schema   *jsonschema.Schema
	required bool
}

// object is a closed object schema (unknown arguments are refused).
func object(fields ...field) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{},
		AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}}}
	for _, f := range fields {
		s.Properties[f.name] = f.schema
		s.PropertyOrder = append(s.PropertyOrder, f.name)
		if f.required {
			s.Required = append(s.Required, f.name)
		}
	}
	return s
}

func required(name string, s *jsonschema.Schema) field { return field{name, s, true} }
func optional(name string, s *jsonschema.Schema) field { return field{name, s, false} }

func str(desc string, maxLen int) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "string", Description: desc, MaxLength: jsonschema.Ptr(maxLen)}
}

func enum(desc string, values ...string) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "string", Description: desc}
	for _, v := range values {
		s.Enum = append(s.Enum, v)
	}
	return s
}

func number(desc string, min, max float64) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "number", Description: desc, Minimum: jsonschema.Ptr(min), Maximum: jsonschema.Ptr(max)}
}

func integer(desc string, min, max float64) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "integer", Description: desc, Minimum: jsonschema.Ptr(min), Maximum: jsonschema.Ptr(max)}
}

func withDefault(s *jsonschema.Schema, v any) *jsonschema.Schema {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	s.Default = b
	return s
}

// stringMap is an object of string values: at most maxProps entries.
func stringMap(desc string, maxProps, maxValue int) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "object", Description: desc, MaxProperties: jsonschema.Ptr(maxProps),
		AdditionalProperties: &jsonschema.Schema{Type: "string", MaxLength: jsonschema.Ptr(maxValue)}}
}

// outputSchema infers the schema of a tool's structured result from the Go
// type it renders, describing money (gpuproxy.Micros, rendered as a dollar
// decimal) as a number, as is a json.Number (written as a JSON number).
func outputSchema[T any]() *jsonschema.Schema {
	s, err := jsonschema.ForType(reflect.TypeFor[T](), &jsonschema.ForOptions{
		TypeSchemas: map[reflect.Type]*jsonschema.Schema{
			reflect.TypeFor[gpuproxy.Micros](): {Type: "number", Description: "US dollars"},
			reflect.TypeFor[json.Number]():     {Type: "number"},
		},
	})
	if err != nil {
		panic(fmt.Sprintf("output schema of %T: %v", *new(T), err))
	}
	return s
}
