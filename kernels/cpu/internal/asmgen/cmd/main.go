// Command asmgen writes kernels/cpu/gen_kernels_amd64.s (see package asmgen).
package main

import (
	"flag"
	"log"
	"os"

	"github.com/tracegrpo/tracegrpo/kernels/cpu/internal/asmgen"
)

func main() {
	out := flag.String("out", "gen_kernels_amd64.s", "output file")
	flag.Parse()
	if err := os.WriteFile(*out, asmgen.Generate(), 0o644); err != nil {
		log.Fatal(err)
	}
}
