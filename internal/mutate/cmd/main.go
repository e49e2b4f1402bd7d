// Command mutate is `make mutate` (scripts/mutate.sh): it plants the bugs
// of a mutant list one at a time, runs the tests of the packages each
// touches, and prints how many the suite catches (see package mutate for
// the list's format). Exit status: 0 when every mutant the list expects to
// be caught is, 1 when one survived or does not build, 2 for a bad list or
// command line.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/tracegrpo/tracegrpo/internal/mutate"
)

func main() {
	list := flag.String("list", "", "one mutant list, relative to the repository root (default: scripts/mutants.txt and every scripts/mutants/*.txt)")
	run := flag.String("run", "", "only the mutants whose names match this regular expression")
	check := flag.Bool("check", false, "only check that every mutant applies (its from: text occurs once); run no tests")
	timeout := flag.Duration("timeout", 10*time.Minute, "go test -timeout for each package")
	verbose := flag.Bool("v", false, "print the output of the test that caught each mutant")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: scripts/mutate.sh [flags]\n\nPlants each bug of the mutant list in turn, runs the tests of the packages it\ntouches (as make test runs them: make mutate passes its environment), restores\nthe file, and prints the score.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	os.Exit(mainErr(*list, *run, *check, *timeout, *verbose))
}

func mainErr(list, run string, check bool, timeout time.Duration, verbose bool) int {
	root, err := mutate.Root(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lists := mutate.DefaultLists
	if list != "" {
		lists = []string{list}
	}
	list = strings.Join(lists, " ")
	ms, err := mutate.ReadLists(root, lists...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mutate: %v\n", err)
		return 2
	}
	if run != "" {
		re, err := regexp.Compile(run)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mutate: -run: %v\n", err)
			return 2
		}
		var keep []mutate.Mutant
		for _, m := range ms {
			if re.MatchString(m.Name) {
				keep = append(keep, m)
			}
		}
		if len(keep) == 0 {
			fmt.Fprintf(os.Stderr, "mutate: -run %q matches none of the %d mutants of %s\n", run, len(ms), list)
			return 2
		}
		ms = keep
	}
	if check {
		bad := 0
		for _, m := range ms {
			if _, err := mutate.Check(root, m); err != nil {
				fmt.Fprintln(os.Stderr, err)
				bad++
			}
		}
		if bad > 0 {
			return 2
		}
		fmt.Printf("mutate: all %d mutants of %s apply\n", len(ms), list)
		return 0
	}
	// Ctrl-C or SIGTERM: the test in progress is killed and the planted
	// file restored before the process exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	fmt.Printf("mutate: %d mutants from %s; each runs its packages' tests until one fails\n", len(ms), list)
	rs, err := mutate.Run(ctx, mutate.Options{Root: root, Timeout: timeout, Log: os.Stdout, Verbose: verbose}, ms)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mutate: %v\n", err)
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "mutate: interrupted; the planted file was restored")
			return 130
		}
		return 2
	}
	if !mutate.Summary(os.Stdout, rs) {
		return 1
	}
	return 0
}
