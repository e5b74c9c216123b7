package billing_test

import (
	"bytes"
	"encoding/csv"
	"reflect"
	"testing"
	"time"

	"github.com/aiserve/gpuproxy/billing"
)

func readCSV(t *testing.T, b []byte) [][]string {
	t.Helper()
	recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err != nil {
		t.Fatalf("not CSV: %v\n%s", err, b)
	}
	return recs
}

func TestTransactionsCSV(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 13, 4, 5, 999_000_000, time.FixedZone("CET", 3600))
	var buf bytes.Buffer
	w := billing.NewTransactionsCSV(&buf)
	for _, e := range []billing.Entry{
		{ID: 1, Type: billing.Charge, Amount: 1_500_000, At: at, Account: "acme", KeyID: "k1", KeyName: "=ci", Provider: "vast.ai",
			InstanceID: "gpi_1", GPUName: "RTX 4090", NumGPUs: 2, Basis: billing.Metered, Description: "=HYPERLINK()"},
		{ID: 2, Type: billing.Credit, Amount: 100_000_000, At: at, Account: "-acme", Basis: billing.Manual},
		{ID: 3, Type: billing.Refund, Amount: 250_000, At: at, Account: "acme", Basis: billing.Prepaid},
		{ID: 4, Type: billing.Adjustment, Amount: -1, At: at, Account: "acme", Basis: billing.Provider},
	} {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	got := readCSV(t, buf.Bytes())
	want := [][]string{
		billing.TransactionsCSVHeader,
		{"1", "2026-11-25 12:04:05", "acme", "k1", "'=ci", "charge", "1.500000", "1500000", "vast.ai", "gpi_1", "RTX 4090", "2", "metered", "'=HYPERLINK()"},
		{"2", "2026-11-25 12:04:05", "'-acme", "", "", "credit", "-100.000000", "-100000000", "", "", "", "", "manual", ""},
		{"3", "2026-11-25 12:04:05", "acme", "", "", "refund", "-0.250000", "-250000", "", "", "", "", "prepaid", ""},
		{"4", "2026-11-25 12:04:05", "acme", "", "", "adjustment", "-0.000001", "-1", "", "", "", "", "provider", ""},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("csv =\n%q\nwant\n%q", got, want)
	}
	if got[0][1] != "time_utc" || got[0][2] != "account" || got[0][3] != "key_id" {
		t.Fatalf("header = %q", got[0])
	}

	// An empty export is the header alone.
	buf.Reset()
	if err := billing.NewTransactionsCSV(&buf).Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readCSV(t, buf.Bytes()); len(got) != 1 || !reflect.DeepEqual(got[0], billing.TransactionsCSVHeader) {
		t.Fatalf("empty export = %q", got)
	}
}

func TestSummaryCSV(t *testing.T) {
	t.Parallel()
	row := billing.SummaryRow{Key: "k", GPUName: "H100", NumGPUs: 8, KeyName: "ci",
		Totals: billing.Totals{Charges: 7_000_000, Credits: 100_000_000, Refunds: 2_000_000, Adjustments: -500_000, Count: 4}}
	for _, tc := range []struct {
		g    billing.Group
		want [][]string
	}{
		{billing.ByDay, [][]string{
			{"day_utc", "account", "charges", "credits", "refunds", "adjustments", "amount", "amount_micros", "count"},
			{"k", "acme", "7.000000", "-100.000000", "-2.000000", "-0.500000", "-95.500000", "-95500000", "4"}}},
		{billing.ByInstance, [][]string{
			{"instance_id", "gpu", "gpu_count", "account", "charges", "credits", "refunds", "adjustments", "amount", "amount_micros", "count"},
			{"k", "H100", "8", "acme", "7.000000", "-100.000000", "-2.000000", "-0.500000", "-95.500000", "-95500000", "4"}}},
		{billing.ByAccount, [][]string{
			{"account", "charges", "credits", "refunds", "adjustments", "amount", "amount_micros", "count"},
			{"k", "7.000000", "-100.000000", "-2.000000", "-0.500000", "-95.500000", "-95500000", "4"}}},
		{billing.ByKey, [][]string{
			{"key_id", "key_name", "account", "charges", "credits", "refunds", "adjustments", "amount", "amount_micros", "count"},
			{"k", "ci", "acme", "7.000000", "-100.000000", "-2.000000", "-0.500000", "-95.500000", "-95500000", "4"}}},
		{billing.ByProvider, [][]string{
			{"provider", "account", "charges", "credits", "refunds", "adjustments", "amount", "amount_micros", "count"},
			{"k", "acme", "7.000000", "-100.000000", "-2.000000", "-0.500000", "-95.500000", "-95500000", "4"}}},
	} {
		var buf bytes.Buffer
		if err := billing.WriteSummaryCSV(&buf, tc.g, "acme", []billing.SummaryRow{row}); err != nil {
			t.Fatal(err)
		}
		if got := readCSV(t, buf.Bytes()); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: csv =\n%q\nwant\n%q", tc.g, got, tc.want)
		}
	}
}
