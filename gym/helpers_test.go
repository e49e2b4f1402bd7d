package gym

import (
	"bufio"
	"os"
)

// writeEntriesFile is used by tests and benchmarks to lay down a store
// without the Writer's per-put overhead.
func writeEntriesFile(path string, entries []TokenEntry) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	var buf []byte
	for i := range entries {
		buf = entries[i].AppendJSON(buf[:0])
		buf = append(buf, '\n')
		if _, err := bw.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
