package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envAnnotation marks a subcommand's local flag as having an environment
// variable (the root's persistent flags all have one).
const envAnnotation = "kvdir-cli-env"

// MarkEnv gives the local flag name of a subcommand an environment
// variable, KVDIR_<NAME>_<FLAG> like the global flags.
func MarkEnv(fs *pflag.FlagSet, name string) {
	if err := fs.SetAnnotation(name, envAnnotation, []string{"true"}); err != nil {
		panic(fmt.Sprintf("cli: MarkEnv: %v", err)) // a programming error: no such flag
	}
}

// MarkEnvAll gives every local flag of cmd and of its subcommands an
// environment variable (see MarkEnv).
func MarkEnvAll(cmd *cobra.Command) {
	cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		if !noEnv(f.Name) {
			MarkEnv(cmd.Flags(), f.Name)
		}
	})
	for _, c := range cmd.Commands() {
		MarkEnvAll(c)
	}
}

// SetupCobra makes a cobra command tree follow p: it adds the common
// flags to root (--log-level and --log-format to every command, --version
// to the root), sets from the environment every persistent flag of root
// and every flag marked with MarkEnv that the command line did not set,
// before root's PersistentPreRunE (set that before calling SetupCobra),
// lists the environment variables in every command's help, and makes flag
// errors usage errors. ExecuteC calls it if it was not called.
func (p *Program) SetupCobra(root *cobra.Command) {
	if p.cobraRoot == root {
		return
	}
	p.cobraRoot = root
	p.Flags()                                         // initialise the bookkeeping
	p.addCommon(root.PersistentFlags(), false, false) // cobra adds --version to the root
	root.Version = Version()
	root.SetVersionTemplate(VersionLine(p.Name) + "\n")
	root.SilenceUsage, root.SilenceErrors = true, true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return Usage(err) })
	pre := root.PersistentPreRunE
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		cmd.Flags().Visit(func(f *pflag.Flag) { p.sources[f.Name] = FromFlag })
		if err := p.applyEnv(cmd.Flags(), func(f *pflag.Flag) bool { return p.hasEnv(root, f) }); err != nil {
			return err
		}
		p.parsed = true
		if pre != nil {
			return pre(cmd, args)
		}
		return nil
	}
	help := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		help(cmd, args)
		p.writeCobraEnv(cmd.OutOrStdout(), root, cmd)
	})
}

// ExecuteC runs the cobra command tree root with args as p (see
// SetupCobra), writing to p's Stdout and Stderr. It returns the command
// that ran and its error; a mistake on the command line is a usage error
// that points to that command's --help. Pass the error to Exit.
func (p *Program) ExecuteC(ctx context.Context, root *cobra.Command, args []string) (*cobra.Command, error) {
	p.SetupCobra(root)
	root.SetArgs(args)
	root.SetOut(p.stdout())
	root.SetErr(p.stderr())
	cmd, err := root.ExecuteContextC(ctx)
	if cmd == nil {
		cmd = root
	}
	if err != nil && !IsUsage(err) && isCobraUsage(err) {
		err = Usage(err)
	}
	var ue *usageError
	if errors.As(err, &ue) && ue.command == "" {
		ue.command = cmd.CommandPath()
	}
	return cmd, err
}

// hasEnv reports whether flag f of a command of root has an environment
// variable.
func (p *Program) hasEnv(root *cobra.Command, f *pflag.Flag) bool {
	if noEnv(f.Name) {
		return false
	}
	return root.PersistentFlags().Lookup(f.Name) != nil || f.Annotations[envAnnotation] != nil
}

// isCobraUsage recognises the command-line mistakes cobra reports as plain
// errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "requires at most", "invalid argument"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// writeCobraEnv lists the environment variables of cmd's flags.
func (p *Program) writeCobraEnv(w io.Writer, root, cmd *cobra.Command) {
	var names []string
	seen := map[string]bool{}
	add := func(f *pflag.Flag) {
		if !seen[f.Name] && !f.Hidden && p.hasEnv(root, f) {
			seen[f.Name] = true
			names = append(names, f.Name)
		}
	}
	cmd.LocalFlags().VisitAll(add)
	cmd.InheritedFlags().VisitAll(add)
	if cmd == root {
		root.PersistentFlags().VisitAll(add)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("\nEnvironment variables (a flag on the command line beats its variable; an empty variable counts as unset):\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-34s --%s\n", p.EnvVar(n), n)
	}
	io.WriteString(w, b.String())
}
