package cli

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// StringList is a flag value of comma-separated items (blanks trimmed,
// empty items dropped) stored in *p. In a config file it is also a YAML
// sequence. Declare it with fs.Var(cli.StringList(&cfg.Join), ...).
func StringList(p *[]string) pflag.Value { return &listValue{p: p} }

type listValue struct{ p *[]string }

func (v *listValue) String() string { return strings.Join(*v.p, ",") }
func (v *listValue) Type() string   { return "LIST" }
func (v *listValue) Set(s string) error {
	*v.p = splitList(s)
	return nil
}
func (v *listValue) Append(s string) error    { *v.p = append(*v.p, splitList(s)...); return nil }
func (v *listValue) Replace(s []string) error { *v.p = slices.Clone(s); return nil }
func (v *listValue) GetSlice() []string       { return slices.Clone(*v.p) }

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// pairsValue marks values a config file may give as a YAML mapping.
type pairsValue interface {
	pflag.SliceValue
	pairs()
}

// StringMap is a flag value "key=value,key=value" stored in *p (nil when
// empty); a key given twice is an error. In a config file it is also a
// YAML mapping or a sequence of key=value items.
func StringMap(p *map[string]string) pflag.Value { return &mapValue{p: p} }

type mapValue struct{ p *map[string]string }

func (v *mapValue) pairs() {}
func (v *mapValue) String() string {
	keys := make([]string, 0, len(*v.p))
	for k := range *v.p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + (*v.p)[k])
	}
	return b.String()
}
func (v *mapValue) Type() string { return "KEY=VALUE,..." }
func (v *mapValue) Set(s string) error {
	m, err := parsePairs(splitList(s))
	if err != nil {
		return err
	}
	*v.p = m
	return nil
}
func (v *mapValue) Append(s string) error {
	m, err := parsePairs(append(v.GetSlice(), splitList(s)...))
	if err != nil {
		return err
	}
	*v.p = m
	return nil
}
func (v *mapValue) Replace(items []string) error {
	m, err := parsePairs(items)
	if err != nil {
		return err
	}
	*v.p = m
	return nil
}
func (v *mapValue) GetSlice() []string { return splitList(v.String()) }

func parsePairs(items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(items))
	for _, item := range items {
		k, val, ok := strings.Cut(item, "=")
		k, val = strings.TrimSpace(k), strings.TrimSpace(val)
		if !ok || k == "" || val == "" {
			return nil, fmt.Errorf("item %q: want key=value", item)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("key %q is listed twice", k)
		}
		m[k] = val
	}
	return m, nil
}

// PositiveInt is an int flag value that refuses zero and negative numbers
// (and numbers of 2^31 or more).
func PositiveInt(p *int) pflag.Value { return &posInt{p: p} }

type posInt struct{ p *int }

func (v *posInt) String() string { return strconv.Itoa(*v.p) }
func (v *posInt) Type() string   { return "N" }
func (v *posInt) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	if err != nil || n <= 0 {
		return fmt.Errorf("not a positive integer below 2^31: %q", s)
	}
	*v.p = int(n)
	return nil
}

// PositiveUint64 is a uint64 flag value that refuses zero.
func PositiveUint64(p *uint64) pflag.Value { return &posUint{p: p} }

type posUint struct{ p *uint64 }

func (v *posUint) String() string { return strconv.FormatUint(*v.p, 10) }
func (v *posUint) Type() string   { return "N" }
func (v *posUint) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || n == 0 {
		return fmt.Errorf("not a positive integer: %q", s)
	}
	*v.p = n
	return nil
}

// PositiveDuration is a duration flag value that refuses zero and
// negative durations, and numbers without a unit.
func PositiveDuration(p *time.Duration) pflag.Value { return &posDuration{p: p} }

type posDuration struct{ p *time.Duration }

func (v *posDuration) String() string { return v.p.String() }
func (v *posDuration) Type() string   { return "DURATION" }
func (v *posDuration) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("not a duration: %q (write a number with a unit, e.g. 500ms, 10s, 5m)", s)
	}
	if d <= 0 {
		return fmt.Errorf("duration %q must be positive", s)
	}
	*v.p = d
	return nil
}

// Choice is a string flag value that accepts only one of choices (case
// insensitive; stored as given in choices).
func Choice(p *string, choices ...string) pflag.Value { return &choice{p: p, choices: choices} }

type choice struct {
	p       *string
	choices []string
}

func (v *choice) String() string { return *v.p }
func (v *choice) Type() string   { return strings.Join(v.choices, "|") }
func (v *choice) Set(s string) error {
	for _, c := range v.choices {
		if strings.EqualFold(strings.TrimSpace(s), c) {
			*v.p = c
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %s", s, strings.Join(v.choices, ", "))
}
