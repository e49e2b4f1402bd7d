package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"

	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

func init() {
	register(command{
		name:    "traces",
		summary: "finalize Gym rollout records into training_traces envelopes",
		run:     runTraces,
	})
}

// maxJobs caps traces --jobs: the batch in flight holds 4 records per job,
// and more workers than this gain nothing on any machine (100000000 jobs
// ran out of memory sizing the batch).
const maxJobs = 4096

// tracesSummary counts what one traces run produced.
type tracesSummary struct {
	rollouts, delivered, prebuilt, traces, masked int
	byReason                                      map[string]int
}

func runTraces(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("traces", "train traces --captures DIR --rollouts FILE [--builder prefix_merging|per_request] [--out FILE]", stdout)
	captures := fs.String("captures", "", "NeMo Gym token-capture directory (<rollout_id>.tokens.jsonl[.zst], intents, state)")
	rollouts := fs.String("rollouts", "", "rollout records JSONL written by Gym's rollout collection ('-' for stdin)")
	builder := fs.String("builder", gym.BuilderPrefixMerging, "trace builder: prefix_merging or per_request")
	out := fs.String("out", "", "output JSONL (default stdout)")
	rebuild := fs.Bool("rebuild", false, "rebuild from the captures even when a record already carries training_traces")
	jobs := fs.Int("jobs", runtime.GOMAXPROCS(0), "rollouts finalized concurrently (output order is input order)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *jobs < 1 || *jobs > maxJobs {
		return fmt.Errorf("%w: traces: --jobs %d: expected 1 to %d rollouts finalized concurrently", errUsage, *jobs, maxJobs)
	}
	if *captures == "" || *rollouts == "" {
		return fmt.Errorf("%w: traces: --captures and --rollouts are required", errUsage)
	}
	if *builder != gym.BuilderPrefixMerging && *builder != gym.BuilderPerRequest {
		return fmt.Errorf("%w: traces: --builder must be %s or %s, not %q", errUsage, gym.BuilderPrefixMerging, gym.BuilderPerRequest, *builder)
	}
	src, err := gym.NewReader(*captures)
	if err != nil {
		return fmt.Errorf("traces: %w", err)
	}
	var in io.Reader
	name := *rollouts
	if name == "-" {
		in, name = os.Stdin, "<stdin>"
	} else {
		f, err := inputfile.Open(name, inputfile.Records)
		if err != nil {
			return fmt.Errorf("traces: %w", err)
		}
		defer f.Close()
		in = f
	}
	// The output goes to a temporary file renamed into place once every
	// record is written: a failed or interrupted run leaves no partial
	// output, and an output that is the input is refused before anything
	// is opened for writing.
	var w io.Writer = stdout
	var outFile *atomicfile.File
	if *out != "" {
		if err := atomicfile.CheckNotInput(*out, *rollouts); err != nil {
			return fmt.Errorf("%w: traces: --out %s: %v: write the finalized records elsewhere", errUsage, *out, err)
		}
		if err := atomicfile.CheckNotInside(*out, *captures); err != nil {
			return fmt.Errorf("%w: traces: --out: %v, the capture store read (--captures): write the finalized records elsewhere", errUsage, err)
		}
		outFile, err = atomicfile.Create(*out)
		if err != nil {
			return fmt.Errorf("traces: %w", err)
		}
		defer outFile.Abort()
		w = outFile
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	sum, err := finalizeRecords(gym.NewRecordReader(in, name), src, *builder, *rebuild, *jobs, bw)
	if ferr := bw.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("traces: write: %w", ferr)
	}
	if outFile != nil && err == nil {
		if cerr := outFile.Commit(); cerr != nil {
			err = fmt.Errorf("traces: %w", cerr)
		}
	}
	printSummary(stderr, sum)
	if err != nil && outFile != nil {
		err = fmt.Errorf("%w (nothing written to %s)", err, *out)
	}
	return err
}

// finalizeRecords finalizes every record of rr and writes one JSON line per
// record to w, in input order, holding at most 4*jobs records in memory. It
// stops at the first error (bad input, not a mask).
func finalizeRecords(rr *gym.RecordReader, src gym.Source, builder string, rebuild bool, jobs int, w io.Writer) (tracesSummary, error) {
	sum := tracesSummary{byReason: map[string]int{}}
	if jobs < 1 {
		jobs = 1
	}
	batch := make([]*gym.Record, 0, 4*jobs)
	var line []byte
	flush := func() error {
		results, ferr := gym.FinalizeBatch(batch, src, builder, rebuild, jobs)
		for i, res := range results {
			if res == nil {
				break
			}
			sum.rollouts++
			if res.Masked {
				sum.masked++
				sum.byReason[res.Reason]++
			} else {
				sum.delivered++
				sum.traces += len(res.Envelope.Traces)
				if res.Prebuilt {
					sum.prebuilt++
				}
			}
			line = batch[i].AppendJSON(line[:0])
			line = append(line, '\n')
			if _, err := w.Write(line); err != nil {
				return fmt.Errorf("traces: write: %w", err)
			}
		}
		batch = batch[:0]
		if ferr != nil {
			return fmt.Errorf("traces: %w", ferr)
		}
		return nil
	}
	for {
		rec, err := rr.Next()
		if err == io.EOF {
			return sum, flush()
		}
		if err != nil {
			if ferr := flush(); ferr != nil {
				return sum, ferr
			}
			return sum, fmt.Errorf("traces: %w", err)
		}
		batch = append(batch, rec)
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return sum, err
			}
		}
	}
}

func printSummary(w io.Writer, s tracesSummary) {
	fmt.Fprintf(w, "traces: %d rollouts, %d delivered (%d already attached), %d traces, %d masked\n",
		s.rollouts, s.delivered, s.prebuilt, s.traces, s.masked)
	reasons := make([]string, 0, len(s.byReason))
	for r := range s.byReason {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(w, "traces:   masked %-22s %d\n", r, s.byReason[r])
	}
}
