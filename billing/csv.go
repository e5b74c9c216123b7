package billing

import (
	"encoding/csv"
	"io"
	"strconv"
	"strings"
)

// Exports (CSV) are for people and spreadsheets:
//
//   - times are UTC date-times in CSVTimeLayout, which spreadsheets read as
//     date-times, and the header says UTC (time_utc, day_utc);
//   - money is signed by what it cost the account: charges positive,
//     credits and refunds negative, adjustments as recorded (Entry.Signed),
//     in USD (amount, exact to six places) and micro-dollars
//     (amount_micros), so a column's sum is the net cost;
//   - free text that a spreadsheet would run as a formula is defused.

// CSVTimeLayout is how exports write times: UTC, to the second.
const CSVTimeLayout = "2006-01-02 15:04:05"

// TransactionsCSVHeader is the header row of a transactions export.
var TransactionsCSVHeader = []string{"id", "time_utc", "account", "type", "amount", "amount_micros",
	"provider", "instance_id", "gpu", "gpu_count", "basis", "description"}

// TransactionsCSV writes ledger entries as CSV, header first.
type TransactionsCSV struct {
	w      *csv.Writer
	header bool
}

// NewTransactionsCSV returns a writer of a transactions export to w.
func NewTransactionsCSV(w io.Writer) *TransactionsCSV {
	return &TransactionsCSV{w: csv.NewWriter(w)}
}

// Write writes one entry (after the header, the first time).
func (t *TransactionsCSV) Write(e Entry) error {
	if err := t.writeHeader(); err != nil {
		return err
	}
	gpus := ""
	if e.NumGPUs > 0 {
		gpus = strconv.Itoa(e.NumGPUs)
	}
	amt := e.Signed()
	return t.w.Write([]string{strconv.FormatInt(e.ID, 10), e.At.UTC().Format(CSVTimeLayout), safeText(e.Account),
		string(e.Type), amt.String(), strconv.FormatInt(int64(amt), 10), safeText(e.Provider),
		safeText(e.InstanceID), safeText(e.GPUName), gpus, string(e.Basis), safeText(e.Description)})
}

// Flush writes the header if no entry was written, and flushes.
func (t *TransactionsCSV) Flush() error {
	if err := t.writeHeader(); err != nil {
		return err
	}
	t.w.Flush()
	return t.w.Error()
}

func (t *TransactionsCSV) writeHeader() error {
	if t.header {
		return nil
	}
	t.header = true
	return t.w.Write(TransactionsCSVHeader)
}

// SummaryCSVHeader is the header row of a summary export grouped by g: the
// group's column (day_utc, provider, instance_id with gpu and gpu_count,
// or account), the account column unless grouped by account, then the
// signed totals and the entry count.
func SummaryCSVHeader(g Group) []string {
	var h []string
	switch g {
	case ByDay:
		h = []string{"day_utc"}
	case ByInstance:
		h = []string{"instance_id", "gpu", "gpu_count"}
	default:
		h = []string{string(g)}
	}
	if g != ByAccount {
		h = append(h, "account")
	}
	return append(h, "charges", "credits", "refunds", "adjustments", "amount", "amount_micros", "count")
}

// WriteSummaryCSV writes summary rows grouped by g as CSV. account names
// what the summary covers (an account's name, or "all") unless grouped by
// account. Money is signed as in transaction exports: credits and refunds
// negative, and amount is the row's net cost (charges + adjustments −
// credits − refunds).
func WriteSummaryCSV(w io.Writer, g Group, account string, rows []SummaryRow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(SummaryCSVHeader(g)); err != nil {
		return err
	}
	for _, r := range rows {
		var rec []string
		switch g {
		case ByInstance:
			gpus := ""
			if r.NumGPUs > 0 {
				gpus = strconv.Itoa(r.NumGPUs)
			}
			rec = []string{safeText(r.Key), safeText(r.GPUName), gpus}
		default:
			rec = []string{safeText(r.Key)}
		}
		if g != ByAccount {
			rec = append(rec, safeText(account))
		}
		net := -r.Net()
		rec = append(rec, r.Charges.String(), (-r.Credits).String(), (-r.Refunds).String(), r.Adjustments.String(),
			net.String(), strconv.FormatInt(int64(net), 10), strconv.FormatInt(r.Count, 10))
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// safeText defuses spreadsheet formula injection in text: a value that
// starts with a character a spreadsheet reads as a formula gets a leading
// apostrophe.
func safeText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}
