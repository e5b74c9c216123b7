package billing

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/aiserve/gpuproxy"
)

// Exports (CSV) are for people and spreadsheets:
//
//   - times are UTC date-times in CSVTimeLayout, which spreadsheets read as
//     date-times, and the header says UTC (time_utc, day_utc);
//   - money is signed as it counts toward spend: charges positive,
//     credits and refunds negative, adjustments as recorded (Entry.Signed),
//     in USD always printed with six decimals (amount, "-100.000000") and
//     in micro-dollars (amount_micros), so a column's sum is its total;
//   - each entry names the API key it is attributed to (key_id, key_name;
//     empty for entries of no key);
//   - free text that a spreadsheet would run as a formula is defused.

// CSVTimeLayout is how exports write times: UTC, to the second.
const CSVTimeLayout = "2006-01-02 15:04:05"

// TransactionsCSVHeader is the header row of a transactions export.
var TransactionsCSVHeader = []string{"id", "time_utc", "account", "key_id", "key_name", "type", "amount", "amount_micros",
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
		safeText(e.KeyID), safeText(e.KeyName), string(e.Type), usd6(amt), strconv.FormatInt(int64(amt), 10), safeText(e.Provider),
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
// account, or key_id with key_name), the account column unless grouped by
// account, then the signed totals and the entry count.
func SummaryCSVHeader(g Group) []string {
	var h []string
	switch g {
	case ByDay:
		h = []string{"day_utc"}
	case ByInstance:
		h = []string{"instance_id", "gpu", "gpu_count"}
	case ByKey:
		h = []string{"key_id", "key_name"}
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
// negative, and amount is the row's total (Totals.Amount: the sum of its
// entries' signed amounts).
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
		case ByKey:
			rec = []string{safeText(r.Key), safeText(r.KeyName)}
		default:
			rec = []string{safeText(r.Key)}
		}
		if g != ByAccount {
			rec = append(rec, safeText(account))
		}
		sg := r.Signed()
		rec = append(rec, usd6(sg.Charges), usd6(sg.Credits), usd6(sg.Refunds), usd6(sg.Adjustments),
			usd6(r.Amount()), strconv.FormatInt(int64(r.Amount()), 10), strconv.FormatInt(r.Count, 10))
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// usd6 renders m as US dollars with exactly six decimals ("-100.000000"),
// so a column reads at one precision.
func usd6(m gpuproxy.Micros) string {
	neg := ""
	u := uint64(m)
	if m < 0 {
		neg, u = "-", -u
	}
	return fmt.Sprintf("%s%d.%06d", neg, u/gpuproxy.MicrosPerUSD, u%gpuproxy.MicrosPerUSD)
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
