package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/tracegrpo/tracegrpo/trainer"
)

// TestMain runs this test binary as the train command when the environment
// asks for it (TRACEGRPO_CLI_ARGS, a JSON list of arguments), so that tests
// can signal a real train process.
func TestMain(m *testing.M) {
	if os.Getenv(holdStopEnv) == "1" {
		// Signals are watched as train watches them, but the first stop
		// request never reaches the run: only a second signal ends it.
		watchSignals = func(log io.Writer) (<-chan os.Signal, func()) {
			_, release := trainer.WatchSignals(log)
			return make(chan os.Signal), release
		}
	}
	if n := os.Getenv(fileSizeLimitEnv); n != "" {
		// A file system that fills up: writes past n bytes fail (EFBIG).
		var lim uint64
		fmt.Sscan(n, &lim)
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if a := os.Getenv("TRACEGRPO_CLI_ARGS"); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(run(args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// fileSizeLimitEnv makes this test binary, started as train, unable to
// write more than that many bytes to any one file, as a full disk would.
const fileSizeLimitEnv = "TRACEGRPO_TEST_FILE_SIZE_LIMIT"

// holdStopEnv makes this test binary, started as train, hold back the
// first stop request of its signals.
const holdStopEnv = "TRACEGRPO_TEST_HOLD_STOP"

// trainCommand is this test binary started as train with args.
func trainCommand(args ...string) *exec.Cmd {
	a, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TRACEGRPO_CLI_ARGS="+string(a))
	return cmd
}
