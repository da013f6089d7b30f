// Package benchjson is the one shape of every result file kvbench writes
// (bench/results/*.json): which tool produced it and with what command, the
// machine it ran on, when it started, its headline figures (each with its
// unit and, where there is one, its target), and the tool's own details.
//
// The figure tables in the repository's Markdown files are generated from
// these files (kvbench docs), so a figure is written here once and quoted
// everywhere else.
package benchjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// Results is one run of one benchmark tool.
type Results struct {
	// Tool names the producer, as its kvbench subcommand is spelt
	// ("index", "directory", ...).
	Tool string `json:"tool"`
	// Command is the argv that produced the file.
	Command []string `json:"command"`
	Machine Machine  `json:"machine"`
	// Started is when the run began (UTC).
	Started time.Time `json:"started"`
	Figures []Figure  `json:"figures"`
	// Details holds what only this tool records: the shape it ran at, how
	// each figure was measured, breakdowns.
	Details json.RawMessage `json:"details,omitempty"`
}

// Machine identifies where figures were measured. The host name is not
// recorded: result files are committed.
type Machine struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GOOS       string `json:"goos,omitempty"`
	GOARCH     string `json:"goarch,omitempty"`
	GoVersion  string `json:"go_version"`
	CPUModel   string `json:"cpu_model,omitempty"`
}

// Figure is one measured number.
type Figure struct {
	// Name is the figure's key, unique within its file (snake_case, with
	// the unit as its suffix where it has one: match_p99_us).
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Target   *Target `json:"target,omitempty"`
	Measured float64 `json:"measured"`
	// Note says what was measured, briefly.
	Note string `json:"note,omitempty"`
}

// Directions of a target.
const (
	AtMost  = "at_most"
	AtLeast = "at_least"
)

// Target is the value a figure is meant to stay within.
type Target struct {
	Direction string  `json:"direction"` // AtMost or AtLeast
	Value     float64 `json:"value"`
}

// Max is a target of at most v; Min one of at least v.
func Max(v float64) *Target { return &Target{Direction: AtMost, Value: v} }
func Min(v float64) *Target { return &Target{Direction: AtLeast, Value: v} }

// Met reports whether measured satisfies t.
func (t *Target) Met(measured float64) bool {
	if t.Direction == AtLeast {
		return measured >= t.Value
	}
	return measured <= t.Value
}

// Op is the target's comparison as the docs write it: "<=" or ">=".
func (t *Target) Op() string {
	if t.Direction == AtLeast {
		return ">="
	}
	return "<="
}

// ThisMachine describes the machine running the benchmark.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH,
		GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// New starts the results of a run of tool on this machine, now.
func New(tool string) *Results {
	return &Results{Tool: tool, Machine: ThisMachine(), Started: time.Now().UTC().Truncate(time.Second)}
}

// Measures are a tool's numbers of one run, which put themselves into its
// results as figures and details.
type Measures interface {
	Results(*Results) error
}

// Measure starts the results of a run of tool (see New), runs measure and
// puts what it measured into them.
func Measure[M Measures](tool string, measure func() (M, error)) (*Results, error) {
	res := New(tool)
	m, err := measure()
	if err != nil {
		return nil, err
	}
	if err := m.Results(res); err != nil {
		return nil, err
	}
	return res, nil
}

// Add appends a figure.
func (r *Results) Add(f Figure) { r.Figures = append(r.Figures, f) }

// Figure returns the figure called name.
func (r *Results) Figure(name string) (Figure, bool) {
	for _, f := range r.Figures {
		if f.Name == name {
			return f, true
		}
	}
	return Figure{}, false
}

// SetDetails stores v as the details.
func (r *Results) SetDetails(v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode %s details: %w", r.Tool, err)
	}
	r.Details = bytes.TrimRight(buf.Bytes(), "\n")
	return nil
}

// DecodeDetails decodes the details into v.
func (r *Results) DecodeDetails(v any) error {
	if len(r.Details) == 0 {
		return fmt.Errorf("%s results have no details", r.Tool)
	}
	if err := json.Unmarshal(r.Details, v); err != nil {
		return fmt.Errorf("decode %s details: %w", r.Tool, err)
	}
	return nil
}

// Validate checks what every results file must hold.
func (r *Results) Validate() error {
	var errs []error
	if r.Tool == "" {
		errs = append(errs, errors.New("no tool"))
	}
	if len(r.Command) == 0 {
		errs = append(errs, errors.New("no command"))
	}
	if r.Machine.GoVersion == "" || r.Machine.CPUs <= 0 {
		errs = append(errs, errors.New("no machine"))
	}
	if r.Started.IsZero() {
		errs = append(errs, errors.New("no start time"))
	}
	if len(r.Figures) == 0 {
		errs = append(errs, errors.New("no figures"))
	}
	seen := map[string]bool{}
	for i, f := range r.Figures {
		switch {
		case f.Name == "":
			errs = append(errs, fmt.Errorf("figure %d has no name", i))
		case seen[f.Name]:
			errs = append(errs, fmt.Errorf("figure %s twice", f.Name))
		case math.IsNaN(f.Measured) || math.IsInf(f.Measured, 0):
			errs = append(errs, fmt.Errorf("figure %s is %v", f.Name, f.Measured))
		case f.Target != nil && f.Target.Direction != AtMost && f.Target.Direction != AtLeast:
			errs = append(errs, fmt.Errorf("figure %s: target direction %q", f.Name, f.Target.Direction))
		}
		seen[f.Name] = true
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s results: %w", r.Tool, err)
	}
	return nil
}

// Encode returns v as indented JSON, as result files are written.
func Encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode results: %w", err)
	}
	return buf.Bytes(), nil
}

// Write writes v as indented JSON to path, or to standard output if path
// is "-".
func Write(path string, v any) error {
	b, err := Encode(v)
	if err != nil {
		return err
	}
	if path == "-" {
		if _, err := os.Stdout.Write(b); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
		return nil
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// ReadFile reads a results file.
func ReadFile(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read results: %w", err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("read results %s: %w", path, err)
	}
	return &r, nil
}

// ReadDetails reads a results file and decodes its details into v (a
// tool's own schema); it returns the envelope, for its header fields.
func ReadDetails(path string, v any) (*Results, error) {
	r, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := r.DecodeDetails(v); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
