package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// cliFlags is a flag set with -c, parsed with flags and arguments in any
// order ("accounts create NAME -c FILE" works).
type cliFlags struct {
	*flag.FlagSet
	config *string
	args   []string
	// only maps a flag to the subcommands it belongs to (absent: all of
	// them), so that "keys list --help" lists list's flags alone.
	only map[string][]string
}

func newFlags(name string) *cliFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &cliFlags{FlagSet: fs, config: fs.String("c", "", "config file (gpuproxy.yaml)"), only: map[string][]string{}}
}

// forSub records that the flags named belong to the subcommands in subs
// (space-separated) only.
func (f *cliFlags) forSub(subs string, names ...string) {
	for _, n := range names {
		f.only[n] = strings.Fields(subs)
	}
}

func (f *cliFlags) parse(args []string) error {
	for {
		if err := f.FlagSet.Parse(args); errors.Is(err, flag.ErrHelp) {
			return helpError{f.help()}
		} else if err != nil {
			return fmt.Errorf("%s: %w (gpuproxy %s --help lists them)", f.Name(), err, f.Name())
		}
		args = f.FlagSet.Args()
		if len(args) == 0 {
			return nil
		}
		f.args = append(f.args, args[0])
		args = args[1:]
	}
}

// helpError is a command's -h/--help: run prints its text (the command's
// usage and flags) to stdout and exits 0.
type helpError struct{ text string }

func (h helpError) Error() string { return h.text }

// help renders the command's lines of the overview and its flags; after a
// subcommand ("keys list --help"), that subcommand's lines and flags only.
func (f *cliFlags) help() string {
	cmd, sub := f.Name(), ""
	if len(f.args) > 0 && len(usageLines(f.Name()+" "+f.args[0])) > 0 {
		cmd, sub = f.Name()+" "+f.args[0], f.args[0]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "usage: gpuproxy %s [flags]\n\n", cmd)
	for _, line := range usageLines(cmd) {
		b.WriteString(line + "\n")
	}
	b.WriteString("\nflags:\n")
	var all strings.Builder
	f.SetOutput(&all)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
	// PrintDefaults writes one block per flag, each starting "  -name".
	blocks := strings.SplitAfter(all.String(), "\n")
	keep := false
	for _, line := range blocks {
		if rest, ok := strings.CutPrefix(line, "  -"); ok {
			name, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
			subs, limited := f.only[name]
			keep = sub == "" || !limited || slices.Contains(subs, sub)
		}
		if keep {
			b.WriteString(line)
		}
	}
	return b.String()
}

// usageLines returns the overview's entries for cmd ("keys" or "keys
// list"), each with its continuation lines.
func usageLines(cmd string) []string {
	var out []string
	in := false
	for _, line := range strings.Split(usage, "\n") {
		switch {
		case strings.HasPrefix(line, "  "+cmd+" ") || line == "  "+cmd:
			in = true
		case strings.HasPrefix(line, "   ") && in: // the entry's continuation
		default:
			in = false
		}
		if in {
			out = append(out, line)
		}
	}
	return out
}
