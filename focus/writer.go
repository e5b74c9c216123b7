package focus

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"io"
)

// Writer writes rows of an export.
type Writer interface {
	Write(Row) error
	// Flush ends the export (a header alone when no row was written).
	Flush() error
}

// Header is the CSV header row: the column names of Columns.
func Header() []string {
	h := make([]string, len(Columns))
	for i, c := range Columns {
		h[i] = c.Name
	}
	return h
}

// CSV writes rows as CSV with a header row; a null is an empty field.
type CSV struct {
	w      *csv.Writer
	header bool
}

// NewCSV returns a CSV writer to w.
func NewCSV(w io.Writer) *CSV { return &CSV{w: csv.NewWriter(w)} }

// Write writes one row (after the header, the first time).
func (c *CSV) Write(r Row) error {
	if err := c.writeHeader(); err != nil {
		return err
	}
	rec := make([]string, len(Columns))
	for i, col := range Columns {
		rec[i] = r[col.Name]
	}
	return c.w.Write(rec)
}

// Flush writes the header if no row was written, and flushes.
func (c *CSV) Flush() error {
	if err := c.writeHeader(); err != nil {
		return err
	}
	c.w.Flush()
	return c.w.Error()
}

func (c *CSV) writeHeader() error {
	if c.header {
		return nil
	}
	c.header = true
	return c.w.Write(Header())
}

// JSONLines writes rows as JSON Lines: one object per row with every
// column, in Columns order; decimals as JSON numbers (exact, as in CSV),
// Tags as an object, nulls as null.
type JSONLines struct {
	w *bufio.Writer
}

// NewJSONLines returns a JSON Lines writer to w.
func NewJSONLines(w io.Writer) *JSONLines { return &JSONLines{w: bufio.NewWriter(w)} }

// Write writes one row as one line.
func (j *JSONLines) Write(r Row) error {
	j.w.WriteByte('{')
	for i, col := range Columns {
		if i > 0 {
			j.w.WriteByte(',')
		}
		k, _ := json.Marshal(col.Name)
		j.w.Write(k)
		j.w.WriteByte(':')
		v, ok := r[col.Name]
		switch {
		case !ok:
			j.w.WriteString("null")
		case col.Type == Decimal || col.Type == JSON:
			j.w.WriteString(v) // already a JSON number or object
		default:
			b, _ := json.Marshal(v)
			j.w.Write(b)
		}
	}
	_, err := j.w.WriteString("}\n")
	return err
}

// Flush flushes what is buffered.
func (j *JSONLines) Flush() error { return j.w.Flush() }
