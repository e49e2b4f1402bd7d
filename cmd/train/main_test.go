package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// TestMain runs this test binary as the train command when the environment
// asks for it (TRACEGRPO_CLI_ARGS, a JSON list of arguments), so that tests
// can signal a real train process.
func TestMain(m *testing.M) {
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

// trainCommand is this test binary started as train with args.
func trainCommand(args ...string) *exec.Cmd {
	a, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TRACEGRPO_CLI_ARGS="+string(a))
	return cmd
}
