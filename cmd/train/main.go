// Command train is tracegrpo's command line: multi-trace GRPO training and the
// tools around it. Each subcommand lives in its own file and registers itself
// in commands; main only dispatches.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/nearest"
	"github.com/tracegrpo/tracegrpo/internal/quote"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// command is one subcommand of train.
type command struct {
	name    string
	summary string
	// run parses args (without the subcommand name) and does the work.
	run func(args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("train: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// errUsage marks an error whose message is a usage problem (exit status 2);
// the trainer package marks its own usage errors the same way.
var errUsage = trainer.ErrUsage

// errQuiet is a failure already reported (by rank 0 of a run whose ranks
// all failed together, or by the rank that aborted the others): exit
// status 1, or 2 when it is also errUsage, and no message.
var errQuiet = errors.New("failed (reported by rank 0)")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command args names. Every write to stdout is checked: a
// command whose output could not be written (a full disk, a closed pipe)
// fails with exit status 1, whatever it returned. What it writes to stderr
// (errors, warnings, logs) quotes no value longer than quote.Max bytes: a
// longer one is cut, with its length.
func run(args []string, stdout, stderr io.Writer) int {
	stderr = quote.Writer{W: stderr} // a quoted value in a message is cut at quote.Max bytes, with its length
	out := &checkedWriter{w: stdout}
	code := dispatch(args, out, stderr)
	if out.err != nil && code == 0 {
		fmt.Fprintf(stderr, "train: write the output: %v\n", out.err)
		return 1
	}
	return code
}

// checkedWriter remembers the first failed write; every later write fails
// with it.
type checkedWriter struct {
	w   io.Writer
	err error
}

func (c *checkedWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	c.err = err
	return n, err
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	name := ""
	if len(args) > 0 {
		if c, ok := commands[args[0]]; ok {
			name = c.name
			args = args[1:]
		} else if args[0] == "help" {
			usage(stdout)
			return 0
		}
	}
	if name == "" && len(args) > 0 && isWord(args[0]) {
		// A bare word is no override (key=value) and no flag: a command,
		// mistyped.
		fmt.Fprintf(stderr, "train: unknown command %q%s (the commands: %s; train --help)\n", args[0], didYouMean(args[0]), strings.Join(commandNames(), ", "))
		return 2
	}
	if name == "" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			usage(stdout)
			if c, ok := commands[""]; ok {
				fmt.Fprintln(stdout)
				c.run([]string{"--help"}, stdout, stderr)
			}
			return 0
		}
		c, ok := commands[""]
		if !ok {
			usage(stderr)
			return 2
		}
		name = c.name
	}
	err := commands[name].run(args, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pflag.ErrHelp):
		return 0
	case errors.Is(err, errQuiet) && errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errQuiet):
		return 1
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "tracegrpo: multi-trace GRPO for language-model agents.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage:")
	fmt.Fprintln(w, "  train [flags]              run GRPO (the built-in task on the CPU by default)")
	fmt.Fprintln(w, "  train COMMAND [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		if n != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'train COMMAND --help' for a command's flags.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Exit status: 0 on success (and for --help), 1 when the work failed (bad input,")
	fmt.Fprintln(w, "an error while training, a signal that stopped the run), 2 for a usage error")
	fmt.Fprintln(w, "(an unknown flag or command, a bad flag value or combination).")
}

// parseFlags parses a subcommand's arguments. A bad flag or value, or a
// positional argument when maxArgs is 0, is a usage error (exit status 2)
// naming the subcommand; --help is pflag.ErrHelp (exit status 0).
func parseFlags(fs *pflag.FlagSet, args []string, maxArgs int) error {
	name := fs.Name()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %s: %v%s (see %s)", errUsage, name, err, flagNearest(fs, err), helpName(name))
	}
	if maxArgs >= 0 && fs.NArg() > maxArgs {
		return fmt.Errorf("%w: %s: unexpected argument %q (see %s)", errUsage, name, fs.Arg(maxArgs), helpName(name))
	}
	return nil
}

// flagNearest is "; did you mean --X?" for pflag's unknown-flag error err,
// naming fs's flag nearest to the one typed, or "".
func flagNearest(fs *pflag.FlagSet, err error) string {
	typed, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok || typed == "" {
		return ""
	}
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	sort.Strings(names)
	if c, _ := nearest.Of(typed, names, max(3, len(typed)/3)); c != "" {
		return fmt.Sprintf("; did you mean --%s?", c)
	}
	return ""
}

// overrideArgs are a subcommand's positional arguments as Hydra overrides
// (key=value, +key=value, ++key=value, ~key); anything else is a usage
// error naming it.
func overrideArgs(fs *pflag.FlagSet) ([]string, error) {
	for _, a := range fs.Args() {
		if err := config.CheckOverride(a); err != nil {
			return nil, fmt.Errorf("%w: %s: unexpected argument %q: an override is key.path=value, +key=value, ++key=value or ~key (%v) (see %s)", errUsage, fs.Name(), a, err, helpName(fs.Name()))
		}
	}
	return fs.Args(), nil
}

// helpName is the command line that prints the help of command name.
func helpName(name string) string {
	if name == "train" || name == "" {
		return "train --help"
	}
	return "train " + name + " --help"
}

// newFlags returns a flag set for a subcommand whose --help prints a synopsis
// and the flags to stdout.
func newFlags(name, synopsis string, stdout io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: %s\n\n%s", synopsis, fs.FlagUsages())
	}
	return fs
}

// isWord reports whether a is a bare word (letters, digits, - and _),
// which can be neither a flag nor a Hydra override.
func isWord(a string) bool {
	if a == "" || a[0] == '-' {
		return false
	}
	for _, c := range a {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// didYouMean is "; did you mean X?" for the command nearest to a, or "".
func didYouMean(a string) string {
	if c, _ := nearest.Of(strings.ToLower(a), commandNames(), max(3, len(a)/2)); c != "" {
		return fmt.Sprintf("; did you mean %q?", c)
	}
	return ""
}

// commandNames are the subcommands, sorted.
func commandNames() []string {
	var out []string
	for n := range commands {
		if n != "" {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
