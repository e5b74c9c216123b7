package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/aiserve/gpuproxy"
)

// definition is the body of a create (whole) or an update (the fields to
// change): -f FILE's object with the flags' fields set over it, and the
// flag to name for each field an error may be about (a flag given, or
// one the file leaves out).
func (sf serviceFlags) definition(set map[string]bool, stdin io.Reader, create bool) (map[string]any, map[string]string, error) {
	body := map[string]any{}
	if set["f"] {
		var err error
		if body, err = readDefinition(*sf.file, stdin); err != nil {
			return nil, nil, err
		}
	}
	if create && !set["f"] {
		for _, r := range []struct{ flag, what string }{
			{"name", "the service's name, e.g. llama-8b"}, {"model", "the model name clients send"},
			{"image", "the replicas' container image, e.g. vllm/vllm-openai:latest"},
			{"port", "the port of the replica's OpenAI-compatible server, e.g. 8000"},
			{"max-price", "the most you accept per replica, USD per hour (e.g. 1.50)"},
		} {
			if !set[r.flag] {
				return nil, nil, fmt.Errorf("--%s is required without -f FILE: %s", r.flag, r.what)
			}
		}
	}
	values := map[string]func() (any, error){
		"name":      func() (any, error) { return *sf.name, nil },
		"model":     func() (any, error) { return *sf.model, nil },
		"image":     func() (any, error) { return *sf.image, nil },
		"placement": func() (any, error) { return *sf.placement, nil },
		"port":      func() (any, error) { return *sf.port, nil },
		"min":       func() (any, error) { return *sf.min, nil },
		"max":       func() (any, error) { return *sf.max, nil },
		"gpu":       func() (any, error) { return []string(*sf.gpus), nil },
		"max-price": func() (any, error) {
			p, err := gpuproxy.ParseUSD(strings.TrimSpace(*sf.maxPrice))
			if err != nil || p <= 0 {
				return nil, fmt.Errorf("--max-price: give US dollars per hour greater than 0, e.g. 1.50 (got %q)", *sf.maxPrice)
			}
			return json.Number(p.String()), nil
		},
	}
	names := map[string]string{}
	given := 0
	for flag, field := range serviceFields {
		if !set[flag] {
			if !set["f"] || !hasField(body, field) {
				names[field] = serviceFlagOf[field]
			}
			continue
		}
		given++
		names[field] = serviceFlagOf[field]
		v, err := values[flag]()
		if err != nil {
			return nil, nil, err
		}
		if err := setField(body, field, v); err != nil {
			return nil, nil, fmt.Errorf("--%s with -f %s: %w", flag, *sf.file, err)
		}
	}
	if !create && !set["f"] && given == 0 {
		return nil, nil, errors.New("give -f FILE (the fields to change) or at least one of --model, --gpu, --max-price, " +
			"--image, --port, --min, --max, --placement")
	}
	return body, names, nil
}

// readDefinition reads -f FILE ("-": stdin) as one JSON object, numbers
// kept as written.
func readDefinition(file string, stdin io.Reader) (map[string]any, error) {
	var r io.Reader = stdin
	if file != "-" {
		fh, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("-f: %w", err)
		}
		defer fh.Close()
		r = fh
	}
	b, err := io.ReadAll(io.LimitReader(r, maxDefinitionFile+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("-f %s: %w", file, err)
	case len(b) > maxDefinitionFile:
		return nil, fmt.Errorf("-f %s: larger than %d bytes", file, maxDefinitionFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, fmt.Errorf("-f %s: not a JSON object (a service definition, as POST /api/v1/services takes): %v", file, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("-f %s: more than one JSON value", file)
	}
	return m, nil
}

// hasField reports whether m has the dotted field ("spec.gpu").
func hasField(m map[string]any, field string) bool {
	head, rest, nested := strings.Cut(field, ".")
	v, ok := m[head]
	if !ok || !nested {
		return ok
	}
	sub, _ := v.(map[string]any)
	return sub != nil && hasField(sub, rest)
}

// setField sets the dotted field of m to v, making the objects on the way.
func setField(m map[string]any, field string, v any) error {
	head, rest, nested := strings.Cut(field, ".")
	if !nested {
		m[head] = v
		return nil
	}
	sub, ok := m[head].(map[string]any)
	if !ok {
		if m[head] != nil {
			return fmt.Errorf("%s must be an object to set %s", head, field)
		}
		sub = map[string]any{}
		m[head] = sub
	}
	return setField(sub, rest, v)
}
