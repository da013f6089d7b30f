// Package cli is the command-line layer every kvdir binary shares: flags,
// their environment variables and an optional YAML config file, the
// common flags (--version, --log-level, --log-format, --config, --help),
// the help text, the exit codes and the signal rule.
//
// A binary declares its flags on a spf13/pflag FlagSet bound to the fields
// of its library's configuration, with that library's defaults as the flag
// defaults:
//
//	cfg := agent.DefaultConfig()
//	p := &cli.Program{Name: "agent", Env: "AGENT", Summary: "...", Getenv: getenv, Stdout: stdout, Stderr: stderr}
//	fs := p.Flags()
//	fs.StringVar(&cfg.WorkerID, "worker-id", cfg.WorkerID, "worker id, unique in the directory")
//	if err := p.Parse(args); err != nil {
//		return p.Exit(err)
//	}
//	if err := cfg.Validate(); err != nil {
//		return p.Exit(cli.Usage(err))
//	}
//
// A setting's value comes from, in order of precedence: the command line,
// the environment, the config file, the default. Every flag --some-flag of
// the binary NAME has the environment variable KVDIR_NAME_SOME_FLAG (see
// EnvVar); an empty variable counts as unset.
//
// Exit codes: ExitOK (0) on success, --help and --version; ExitError (1)
// when the work fails; ExitUsage (2) on a mistake in the flags, the
// environment or the config file, reported as one line "<bin>: <error>"
// and a pointer to --help; ExitInterrupted (130) when a second SIGINT or
// SIGTERM abandons a shutdown under way.
//
// Binaries with subcommands (kvdirctl, kvbench) keep spf13/cobra for the
// command tree and get the same environment scheme, common flags, help
// sections and exit codes through Program.SetupCobra and Program.ExecuteC.
//
// Signals: SignalContext (or WatchSignals on a channel, for a command that
// drives its own shutdown) cancels a context on the first SIGINT or
// SIGTERM; a second one, a second or more later, exits with
// ExitInterrupted at once. A repeat within that second (a terminal's
// Ctrl-C reaching the whole process group twice) counts as the first.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit codes of every kvdir binary.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitInterrupted = 130
)

// Names of the common flags.
const (
	FlagVersion   = "version"
	FlagHelp      = "help"
	FlagLogLevel  = "log-level"
	FlagLogFormat = "log-format"
	FlagConfig    = "config"
)

// ErrHelp and ErrVersion are returned by Parse when --help or --version
// was given; Exit prints the help or the version line for them.
var (
	ErrHelp    = errors.New("help requested")
	ErrVersion = errors.New("version requested")
)

// Source says where a flag's value came from.
type Source int

// Sources, lowest precedence first.
const (
	FromDefault Source = iota
	FromFile
	FromEnv
	FromFlag
)

func (s Source) String() string {
	switch s {
	case FromFile:
		return "config file"
	case FromEnv:
		return "environment"
	case FromFlag:
		return "command line"
	}
	return "default"
}

// Program is one binary's command line. Set the exported fields, declare
// the flags on Flags(), then call Parse.
type Program struct {
	// Name is the binary's name, as typed ("directory", "kvdirctl").
	Name string
	// Env is the NAME of its environment variables KVDIR_NAME_FLAG
	// ("DIRECTORY", "CTL").
	Env string
	// Summary describes the binary: the first paragraphs of --help.
	Summary string
	// Usage is the synopsis, e.g. "directory --node-id ID [flags]"
	// (default "<Name> [flags]").
	Usage string
	// Examples are shown under "Examples:", indented as given.
	Examples string
	// Notes follow the flags in --help (exit status, signals, ...).
	Notes string
	// ConfigFile adds --config FILE: a YAML mapping of flag names to
	// values (see readConfig).
	ConfigFile bool
	// DefaultLogLevel is --log-level's default (default "info").
	DefaultLogLevel string

	// Getenv reads the environment (os.Getenv when nil). Environ, if set,
	// lists it ("KEY=value", as os.Environ): variables of the binary's
	// prefix that no flag has are then reported by Warnings.
	Getenv  func(string) string
	Environ func() []string
	// Stdout and Stderr receive the help and version, and the errors and
	// logs (os.Stdout and os.Stderr when nil).
	Stdout, Stderr io.Writer
	// OldEnv, if set, returns the variable that set flag before the
	// KVDIR_<NAME>_<FLAG> scheme ("" if none). Such a variable, set while
	// the flag's own is not, is a usage error that names the new one
	// (unless it is in another binary's scheme today, see Binaries):
	// a deployment not yet updated fails at once instead of running
	// without its settings.
	OldEnv func(flag string) string

	fs       *pflag.FlagSet
	groups   []group
	common   map[string]bool
	sources  map[string]Source
	warnings []string

	help, version bool
	logLevel      levelValue
	logFormat     formatValue
	configPath    string
	logger        *slog.Logger
	cobraRoot     *cobra.Command // the tree SetupCobra set up
	parsed        bool           // the flags and the environment are read
}

// group is a heading of --help: the flags defined from index start on.
type group struct {
	title string
	start int
}

// Flags returns the flag set the binary declares its flags on. Flags show
// in --help in the order they are declared.
func (p *Program) Flags() *pflag.FlagSet {
	if p.fs != nil {
		return p.fs
	}
	fs := pflag.NewFlagSet(p.Name, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	p.fs = fs
	p.common = map[string]bool{}
	p.sources = map[string]Source{}
	return fs
}

// Group starts a heading of --help: the flags declared after it are listed
// under title.
func (p *Program) Group(title string) {
	fs := p.Flags()
	n := 0
	fs.VisitAll(func(*pflag.Flag) { n++ })
	p.groups = append(p.groups, group{title: title, start: n})
}

// addCommon declares the common flags on fs.
func (p *Program) addCommon(fs *pflag.FlagSet, help, version bool) {
	def := p.DefaultLogLevel
	if def == "" {
		def = "info"
	}
	if err := p.logLevel.Set(def); err != nil {
		panic(fmt.Sprintf("cli: DefaultLogLevel: %v", err)) // a programming error
	}
	_ = p.logFormat.Set("text")
	if p.ConfigFile {
		fs.StringVar(&p.configPath, FlagConfig, "", "YAML `FILE` of settings: keys are flag names (lists as YAML sequences); an unknown key is an error")
		p.common[FlagConfig] = true
	}
	fs.Var(&p.logLevel, FlagLogLevel, "log level: debug, info, warn or error")
	fs.Var(&p.logFormat, FlagLogFormat, "log format: text or json (logs go to standard error)")
	p.common[FlagLogLevel], p.common[FlagLogFormat] = true, true
	if version {
		fs.BoolVar(&p.version, FlagVersion, false, "print the version and exit")
		p.common[FlagVersion] = true
	}
	if help {
		fs.BoolVarP(&p.help, FlagHelp, "h", false, "print this help and exit")
		p.common[FlagHelp] = true
	}
}

// noEnv reports whether a flag has no environment variable and no config
// key.
func noEnv(name string) bool { return name == FlagHelp || name == FlagVersion }

// Parse parses args, then sets from the environment and the config file
// what the command line did not set. It returns ErrHelp or ErrVersion if
// those were asked for, and a usage error (see IsUsage) for a bad flag,
// variable or file. Call it once, after declaring the flags (it
// declares the common ones).
func (p *Program) Parse(args []string) error {
	fs := p.Flags()
	p.addCommon(fs, true, true)
	if err := fs.Parse(args); err != nil {
		return Usage(err)
	}
	if p.help {
		return ErrHelp
	}
	if p.version {
		return ErrVersion
	}
	if fs.NArg() > 0 {
		return Usagef("unexpected argument %q (every setting is a --flag)", fs.Arg(0))
	}
	fs.Visit(func(f *pflag.Flag) { p.sources[f.Name] = FromFlag })
	if err := p.applyEnv(fs, func(*pflag.Flag) bool { return true }); err != nil {
		return err
	}
	if p.ConfigFile && strings.TrimSpace(p.configPath) != "" {
		if err := p.applyConfig(fs, strings.TrimSpace(p.configPath)); err != nil {
			return err
		}
	}
	p.checkEnviron(fs)
	p.parsed = true
	return nil
}

// Binaries are the NAMEs of kvdir's binaries in KVDIR_<NAME>_<FLAG>.
var Binaries = []string{"DIRECTORY", "AGENT", "ROUTER", "ENGINESIM", "CTL", "BENCH"}

// anotherBinarys reports whether v is in some binary's KVDIR_<NAME>_
// scheme: a variable of today's scheme, never a stale one (the
// directory's old KVDIR_AGENT_TOKEN is the agent's KVDIR_AGENT_TOKEN now,
// and both may be set in one environment).
func anotherBinarys(v string) bool {
	for _, n := range Binaries {
		if strings.HasPrefix(v, "KVDIR_"+n+"_") {
			return true
		}
	}
	return false
}

// EnvVar returns the environment variable of flag of the binary env:
// EnvVar("AGENT", "worker-id") is KVDIR_AGENT_WORKER_ID.
func EnvVar(env, flag string) string {
	return "KVDIR_" + strings.ToUpper(env) + "_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// EnvVar returns the environment variable of one of p's flags.
func (p *Program) EnvVar(flag string) string { return EnvVar(p.Env, flag) }

func (p *Program) getenv(k string) string {
	if p.Getenv != nil {
		return p.Getenv(k)
	}
	return os.Getenv(k)
}

// applyEnv sets every flag of fs that want selects and the command line
// did not set from its environment variable.
func (p *Program) applyEnv(fs *pflag.FlagSet, want func(*pflag.Flag) bool) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || noEnv(f.Name) || !want(f) {
			return
		}
		name := p.EnvVar(f.Name)
		v := p.getenv(name)
		if strings.TrimSpace(v) == "" {
			if p.OldEnv != nil {
				if old := p.OldEnv(f.Name); old != "" && old != name && !anotherBinarys(old) && strings.TrimSpace(p.getenv(old)) != "" {
					errs = append(errs, fmt.Errorf("environment variable %s is no longer read: rename it %s", old, name))
				}
			}
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s=%q: %w", name, v, err))
			return
		}
		f.Changed = true
		p.sources[f.Name] = FromEnv
	})
	if len(errs) > 0 {
		return Usage(errors.Join(errs...))
	}
	return nil
}

// checkEnviron records a warning for every variable of the binary's
// prefix that is no flag's.
func (p *Program) checkEnviron(fs *pflag.FlagSet) {
	if p.Environ == nil {
		return
	}
	prefix := EnvVar(p.Env, "")
	known := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		if !noEnv(f.Name) {
			known[p.EnvVar(f.Name)] = true
		}
	})
	var unknown []string
	for _, kv := range p.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, prefix) && !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		p.warnings = append(p.warnings, "ignoring unknown environment variable "+k)
	}
}

// Source returns where the value of the flag name came from.
func (p *Program) Source(name string) Source { return p.sources[name] }

// Describe names where the flag's value came from, for error messages:
// "flag --lease", "environment variable KVDIR_DIRECTORY_LEASE", "key
// "lease" in config file c.yaml" or "default of --lease".
func (p *Program) Describe(name string) string {
	switch p.sources[name] {
	case FromFlag:
		return "flag --" + name
	case FromEnv:
		return "environment variable " + p.EnvVar(name)
	case FromFile:
		return fmt.Sprintf("key %q in config file %s", name, p.configPath)
	}
	return "default of --" + name
}

// ConfigPath returns the config file given, "" if none.
func (p *Program) ConfigPath() string { return strings.TrimSpace(p.configPath) }

// Warnings returns what Parse found worth a warning but not an error
// (unknown variables of the binary's prefix). Log them once the logger
// exists.
func (p *Program) Warnings() []string { return p.warnings }

// Warn adds a warning to those Warnings returns.
func (p *Program) Warn(format string, args ...any) {
	p.warnings = append(p.warnings, fmt.Sprintf(format, args...))
}

func (p *Program) stdout() io.Writer {
	if p.Stdout != nil {
		return p.Stdout
	}
	return os.Stdout
}

func (p *Program) stderr() io.Writer {
	if p.Stderr != nil {
		return p.Stderr
	}
	return os.Stderr
}

// usageError is a mistake in the flags, the environment or the config
// file: exit code 2.
type usageError struct {
	err error
	// command is the command whose --help the message points to (default
	// the program's name).
	command string
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// Usage marks err as a usage error (nil stays nil).
func Usage(err error) error {
	if err == nil {
		return nil
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return err
	}
	return &usageError{err: err}
}

// Usagef returns a usage error with the formatted message.
func Usagef(format string, args ...any) error { return &usageError{err: fmt.Errorf(format, args...)} }

// IsUsage reports whether err is a usage error.
func IsUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}

// Exit reports err and returns the exit code: for nil ExitOK; for ErrHelp
// and ErrVersion the help or version on Stdout and ExitOK; for a usage
// error the line "<bin>: <error>", the line "Run '<bin> --help' for
// usage." and ExitUsage; for any other error "<bin>: <error>" and
// ExitError.
func (p *Program) Exit(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrHelp):
		p.WriteHelp(p.stdout())
		return ExitOK
	case errors.Is(err, ErrVersion):
		fmt.Fprintln(p.stdout(), VersionLine(p.Name))
		return ExitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		msg := oneLine(err.Error())
		cmd := ue.command
		if cmd == "" {
			cmd = p.Name
		}
		fmt.Fprintf(p.stderr(), "%s: %s\nRun '%s --help' for usage.\n", p.Name, msg, cmd)
		return ExitUsage
	}
	fmt.Fprintf(p.stderr(), "%s: %s\n", p.Name, err)
	return ExitError
}

// oneLine joins the lines of a message (errors.Join separates with
// newlines, cobra's suggestions follow on indented lines) so that a usage
// error stays on one line.
func oneLine(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		if b.Len() > 0 {
			if prev := b.String(); strings.HasSuffix(prev, "?") || strings.HasSuffix(prev, ":") {
				b.WriteByte(' ')
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(line)
	}
	return b.String()
}
