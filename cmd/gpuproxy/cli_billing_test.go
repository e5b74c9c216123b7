package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aiserve/gpuproxy/billing"
)

// TestBillingFocusCLI: `gpuproxy billing focus` writes the server's FOCUS
// export of the caller's ledger (CSV to stdout or -o FILE, JSON Lines on
// request), its BilledCost summing to the ledger's charges, and turns a
// bad --from into an error naming the flag.
func TestBillingFocusCLI(t *testing.T) {
	w := newInstancesWorld(t)
	env := map[string]string{"GPUPROXY_URL": w.env["GPUPROXY_URL"], "GPUPROXY_API_KEY": w.key("--preset", "finance")}
	appendEntries(t, w.env["DATABASE_URL"], "acme",
		billing.Entry{Type: billing.Charge, Amount: 1_250_000, Basis: billing.Manual, Description: "a"},
		billing.Entry{Type: billing.Charge, Amount: 500_001, Basis: billing.Manual, Description: "b"})
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := cmdBilling(context.Background(), args, envFunc(env), &out, io.Discard)
		return out.String(), err
	}
	out, err := run("focus")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(rows) != 3 {
		t.Fatalf("want a header and 2 rows, got %d (%v):\n%s", len(rows), err, out)
	}
	col := -1
	for i, name := range rows[0] {
		if name == "BilledCost" {
			col = i
		}
	}
	if col < 0 || rows[1][col]+"|"+rows[2][col] != "1.250000|0.500001" && rows[1][col]+"|"+rows[2][col] != "0.500001|1.250000" {
		t.Fatalf("BilledCost column %d: %v", col, rows[1:])
	}
	file := filepath.Join(t.TempDir(), "focus.jsonl")
	if _, err := run("focus", "--format", "jsonl", "-o", file); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(file); err != nil || strings.Count(string(b), "\n") != 2 || !strings.Contains(string(b), `"BilledCost"`) {
		t.Fatalf("-o FILE with jsonl: %v\n%s", err, b)
	}
	if _, err := run("focus", "--from", "yesterday"); err == nil || !strings.Contains(err.Error(), "--from") {
		t.Fatalf("a bad --from: %v, want an error naming --from", err)
	}
	if _, err := run("nope"); err == nil {
		t.Fatal("an unknown subcommand passed")
	}
}
