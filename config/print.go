package config

import (
	"bytes"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Marshal writes c as YAML with NeMo RL's key names; Load reads it back to the
// same Config.
func Marshal(c *Config) ([]byte, error) {
	var n yaml.Node
	if err := n.Encode(c); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	quote11(&n)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	return b.Bytes(), nil
}

// YAML is the effective configuration: a comment header naming the files
// read, the ignored keys, the refused keys present (with neutral values, or
// the check refuses them) and the warnings, then Marshal(&l.Config).
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
		fmt.Fprintf(&b, "# ignored (%d keys for engines and services tracegrpo does not run; train config --keys says why):\n", len(l.Ignored))
		for _, k := range l.Ignored {
			fmt.Fprintf(&b, "#   %s\n", k)
		}
	}
	var neutral, refused []string
	for _, k := range l.Keys {
		if k.Class != Refused || k.Rule == nil || k.Rule.Guard {
			continue
		}
		if l.IsRefused(k) {
			refused = append(refused, k.Path+" = "+flowText(k.Value))
		} else {
			neutral = append(neutral, k.Path)
		}
	}
	if len(neutral) > 0 {
		fmt.Fprintf(&b, "# refused unless neutral, and neutral here (%d keys): %s\n", len(neutral), strings.Join(neutral, ", "))
	}
	for _, r := range refused {
		fmt.Fprintf(&b, "# REFUSED by train and train config --check: %s\n", r)
	}
	for _, w := range l.Warnings() {
		fmt.Fprintf(&b, "# warning: %s\n", w)
	}
	b.Write(body)
	return b.Bytes(), nil
}

// quote11 quotes every string that OmegaConf's YAML 1.1 reading would type
// as something else ("yes", "012", "1:20"), so that the printed config reads
// back the same.
func quote11(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && n.Style == 0 {
		if tag, _ := yaml11Scalar(n.Value); tag != "!!str" {
			n.Style = yaml.DoubleQuotedStyle
		}
	}
	for _, c := range n.Content {
		quote11(c)
	}
}
