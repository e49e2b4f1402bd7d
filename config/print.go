package config

import (
	"bytes"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Marshal writes c as YAML with NeMo RL's key names; Load reads it back to the
// same Config.
func Marshal(c *Config) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	return b.Bytes(), nil
}

// YAML is the effective configuration: a comment header naming the files read
// and the ignored keys, then Marshal(&l.Config).
func (l *Loaded) YAML() ([]byte, error) {
	body, err := Marshal(&l.Config)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# tracegrpo effective configuration\n")
	if len(l.Files) == 0 {
		b.WriteString("# files: none (built-in defaults)\n")
	}
	for _, f := range l.Files {
		fmt.Fprintf(&b, "# file: %s\n", f)
	}
	if len(l.Ignored) > 0 {
		fmt.Fprintf(&b, "# ignored (%d keys for engines tracegrpo does not use):\n", len(l.Ignored))
		for _, k := range l.Ignored {
			fmt.Fprintf(&b, "#   %s\n", k)
		}
	}
	b.Write(body)
	return b.Bytes(), nil
}
