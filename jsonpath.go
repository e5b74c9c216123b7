package gpuproxy

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
)

// JSONErrorField names the field of body that err, an error of
// encoding/json decoding body into v, is about, with the index of every
// array on the way: "windows[1].window_minutes" where the decoder's
// *json.UnmarshalTypeError says "windows.window_minutes", and
// "windows[0].duration" for an unknown field its error calls "duration".
// It returns "" when err is neither, is about the body as a whole, or
// names a field body does not hold; callers then name what err names.
// Every transport that turns a decoding error into a field name asks it,
// so every array field is named by its index alike.
func JSONErrorField(body []byte, v any, err error) string {
	var te *json.UnmarshalTypeError
	var unknown string
	switch {
	case err == nil:
		return ""
	case errors.As(err, &te):
		if te.Field == "" {
			return ""
		}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		unknown = strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
	default:
		return ""
	}
	w := jsonWalk{dec: json.NewDecoder(bytes.NewReader(body))}
	w.dec.UseNumber()
	if w.value(reflect.TypeOf(v), "", "") != nil {
		return ""
	}
	if te == nil {
		for _, k := range w.unknown {
			if k.name == unknown {
				return k.path
			}
		}
		return ""
	}
	// The value the decoder stopped at: the last one on the error's
	// field path that ends at or before its offset (a scalar's offset is
	// its end, an object's or array's the byte after its opening). A
	// custom decoder's type error has no offset: the first value there.
	found := ""
	for _, s := range w.values {
		if s.plain != te.Field {
			continue
		}
		if te.Offset == 0 {
			return s.path
		}
		if s.end <= te.Offset {
			found = s.path
		}
	}
	return found
}

// jsonWalk reads a JSON document along the Go type it decodes into,
// recording each value's path (with array indexes), its path as
// encoding/json names it (struct fields only, dotted) and where it ends,
// and each object key the type has no field for.
type jsonWalk struct {
	dec     *json.Decoder
	values  []jsonSpot
	unknown []jsonKey
}

type jsonSpot struct {
	path, plain string
	end         int64
}

type jsonKey struct{ name, path string }

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// value reads one value of type t at path (plain: its struct-field path).
func (w *jsonWalk) value(t reflect.Type, path, plain string) error {
	for t != nil && t.Kind() == reflect.Pointer && !decodesItself(t) {
		t = t.Elem()
	}
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	w.values = append(w.values, jsonSpot{path: path, plain: plain, end: w.dec.InputOffset()})
	d, isDelim := tok.(json.Delim)
	if !isDelim {
		return nil
	}
	if t == nil || decodesItself(t) {
		return w.skip(d)
	}
	switch {
	case d == '[' && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i := 0; w.dec.More(); i++ {
			if err := w.value(t.Elem(), path+"["+strconv.Itoa(i)+"]", plain); err != nil {
				return err
			}
		}
		_, err = w.dec.Token()
		return err
	case d == '{' && t.Kind() == reflect.Map:
		for w.dec.More() {
			key, err := w.dec.Token()
			if err != nil {
				return err
			}
			if err := w.value(t.Elem(), join(path, key.(string)), plain); err != nil {
				return err
			}
		}
		_, err = w.dec.Token()
		return err
	case d == '{' && t.Kind() == reflect.Struct:
		for w.dec.More() {
			tok, err := w.dec.Token()
			if err != nil {
				return err
			}
			key := tok.(string)
			ft, via, ok := jsonFieldType(t, key)
			if !ok {
				w.unknown = append(w.unknown, jsonKey{name: key, path: join(path, key)})
			}
			if err := w.value(ft, join(path, key), join(plain, via+key)); err != nil {
				return err
			}
		}
		_, err = w.dec.Token()
		return err
	}
	return w.skip(d)
}

// skip reads the rest of an object or array whose opening was read.
func (w *jsonWalk) skip(json.Delim) error {
	for depth := 1; depth > 0; {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

// decodesItself: t (or *t) has its own JSON or text decoding, or is an
// interface: what its value holds is not read along a type.
func decodesItself(t reflect.Type) bool {
	return t.Kind() == reflect.Interface || t.Implements(jsonUnmarshaler) || t.Implements(textUnmarshaler) ||
		reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)
}

// jsonFieldType is the type of struct t's field that encoding/json
// decodes key into (its tag's name, else its Go name; an exact match
// first, else one equal under case folding; embedded structs' fields
// promoted), and the embedded structs' names on the way as
// encoding/json's error paths have them ("Embedded.").
func jsonFieldType(t reflect.Type, key string) (reflect.Type, string, bool) {
	var fold reflect.Type
	var foldVia string
	var walk func(t reflect.Type, via string) (reflect.Type, string, bool)
	walk = func(t reflect.Type, via string) (reflect.Type, string, bool) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			ft := f.Type
			if f.Anonymous && name == "" {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct {
					if got, gotVia, ok := walk(et, via+et.Name()+"."); ok {
						return got, gotVia, true
					}
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if name == key {
				return ft, via, true
			}
			if fold == nil && strings.EqualFold(name, key) {
				fold, foldVia = ft, via
			}
		}
		return nil, "", false
	}
	if got, via, ok := walk(t, ""); ok {
		return got, via, true
	}
	return fold, foldVia, fold != nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
