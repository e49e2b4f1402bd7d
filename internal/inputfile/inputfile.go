// Package inputfile opens every file a command reads. An input is a
// regular file: a named pipe, a device (/dev/zero), a socket or a directory
// is refused by name, and opening never blocks (a FIFO with no writer
// cannot hang the command). A file read whole is read only up to the size
// cap of its kind, so an input can neither exhaust memory nor be endless.
//
// Files that are streamed (rollout records, tensors read through a
// ReaderAt) are opened with Open and a Kind whose Max is 0: they are still
// regular files, and their readers bound what they hold in memory.
package inputfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Kind is what an input is, for its error messages and its size cap.
type Kind struct {
	// Name says what the file is: "model config", "recipe".
	Name string
	// Max is the most bytes the file may hold (0: no cap; the file is
	// streamed, and its reader bounds what it keeps).
	Max int64
}

// The kinds of input the commands read.
var (
	// ModelConfig is a Hugging Face config.json: a few kilobytes.
	ModelConfig = Kind{Name: "model config (config.json)", Max: 16 << 20}
	// Recipe is a NeMo RL recipe or an override file (YAML).
	Recipe = Kind{Name: "recipe (YAML)", Max: 16 << 20}
	// SafetensorsIndex is model.safetensors.index.json.
	SafetensorsIndex = Kind{Name: "safetensors index", Max: 64 << 20}
	// Safetensors is a tensor file, read through a ReaderAt; its reader
	// bounds the header (safetensors.MaxHeaderSize).
	Safetensors = Kind{Name: "safetensors file"}
	// Records is a JSONL stream (rollout records, token ids): read a line
	// at a time by readers that bound a line.
	Records = Kind{Name: "JSONL records"}
	// CheckpointJSON is a checkpoint's manifest, trainer state or config.
	CheckpointJSON = Kind{Name: "checkpoint JSON", Max: 64 << 20}
	// Checkpoint is a checkpoint's tensor file, hashed and read in one pass.
	Checkpoint = Kind{Name: "checkpoint file"}
	// Metrics is a run's metrics.jsonl, read whole to be truncated on
	// resume or plotted.
	Metrics = Kind{Name: "metrics log", Max: 1 << 30}
	// LoopJSON is a file of the trainer–generator protocol (package loop):
	// a weights directory's DONE marker or a step file's sidecar.
	LoopJSON = Kind{Name: "loop protocol JSON", Max: 1 << 20}
)

// ErrNotRegular is wrapped by the error for an input that is not a regular
// file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped by the error for an input larger than its kind's
// cap.
var ErrTooLarge = errors.New("larger than its kind allows")

// Open opens path for reading as an input of kind k: it must be a regular
// file (checked on the opened file, so nothing swapped in after a check is
// read) of at most k.Max bytes when k has a cap. Errors name the path.
func Open(path string, k Kind) (*os.File, error) {
	f, err := OpenNoBlock(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := check(path, st, k); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func check(path string, st fs.FileInfo, k Kind) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: %w (%s): a %s is read from a regular file", path, ErrNotRegular, describe(st.Mode()), k.Name)
	}
	if k.Max > 0 && st.Size() > k.Max {
		return fmt.Errorf("%s: %d bytes: %w: a %s is at most %d bytes", path, st.Size(), ErrTooLarge, k.Name, k.Max)
	}
	return nil
}

// ReadFile reads the whole input path of kind k (Open's checks), never
// more than k.Max bytes however the file changes while it is read.
func ReadFile(path string, k Kind) ([]byte, error) {
	if k.Max <= 0 {
		panic("inputfile: ReadFile of " + k.Name + ", a kind without a size cap")
	}
	f, err := Open(path, k)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, k.Max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > k.Max {
		return nil, fmt.Errorf("%s: grew past %d bytes while read: %w: a %s is at most %d bytes", path, k.Max, ErrTooLarge, k.Name, k.Max)
	}
	return data, nil
}

// describe names a file mode's type for people.
func describe(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeIrregular != 0:
		return "an irregular file"
	}
	return "not a regular file"
}
