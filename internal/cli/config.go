package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// applyConfig reads the YAML config file path and sets every flag that
// neither the command line nor the environment set. The file is a mapping
// whose keys are flag names; a flag whose value is a list (a
// pflag.SliceValue) also takes a YAML sequence, and one that holds pairs
// (see StringMap) a YAML mapping. An unknown or repeated key is an error.
func (p *Program) applyConfig(fs *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return Usagef("read config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Usagef("config file %s: %w", path, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil // an empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return Usagef("config file %s: want a mapping of flag names to values (e.g. \"%s: value\")", path, firstFlag(fs))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return Usagef("config file %s (line %d): keys must be flag names", path, k.Line)
		}
		f := fs.Lookup(k.Value)
		if f == nil || noEnv(k.Value) || k.Value == FlagConfig {
			hint := ""
			if f != nil {
				hint = ": it is a flag only"
			} else if alt := strings.ReplaceAll(strings.ToLower(k.Value), "_", "-"); fs.Lookup(alt) != nil {
				hint = fmt.Sprintf(": did you mean %q?", alt)
			}
			return Usagef("config file %s (line %d): unknown key %q%s", path, k.Line, k.Value, hint)
		}
		if prev, dup := seen[k.Value]; dup {
			return Usagef("config file %s (line %d): key %q already set on line %d", path, k.Line, k.Value, prev)
		}
		seen[k.Value] = k.Line
		set, err := setFromNode(f, v)
		if err != nil {
			return Usagef("config file %s (line %d): key %q: %w", path, v.Line, k.Value, err)
		}
		if set {
			p.sources[f.Name] = FromFile
		}
	}
	return nil
}

// setFromNode sets f from a YAML value, unless a higher source set it; it
// reports whether it did.
func setFromNode(f *pflag.Flag, v *yaml.Node) (bool, error) {
	var text string
	var items []string
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag != "!!null" {
			text = v.Value
		}
	case yaml.SequenceNode:
		if _, ok := f.Value.(pflag.SliceValue); !ok {
			return false, errors.New("want a single value, not a list")
		}
		for _, it := range v.Content {
			if it.Kind != yaml.ScalarNode || strings.Contains(it.Value, ",") {
				return false, fmt.Errorf("line %d: each list item must be one plain value", it.Line)
			}
			items = append(items, it.Value)
		}
		text = strings.Join(items, ",")
	case yaml.MappingNode:
		if _, ok := f.Value.(pairsValue); !ok {
			return false, errors.New("want a single value, not a mapping")
		}
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, a := v.Content[i], v.Content[i+1]
			if k.Kind != yaml.ScalarNode || a.Kind != yaml.ScalarNode {
				return false, fmt.Errorf("line %d: want key: value", k.Line)
			}
			items = append(items, k.Value+"="+a.Value)
		}
		text = strings.Join(items, ",")
	default:
		return false, errors.New("unsupported YAML value (aliases are not supported)")
	}
	if f.Changed {
		return false, nil // the command line or the environment set it
	}
	if err := f.Value.Set(text); err != nil {
		return false, err
	}
	f.Changed = true
	return true, nil
}

func firstFlag(fs *pflag.FlagSet) string {
	name := "flag-name"
	found := false
	fs.VisitAll(func(f *pflag.Flag) {
		if !found && !noEnv(f.Name) {
			name, found = f.Name, true
		}
	})
	return name
}
