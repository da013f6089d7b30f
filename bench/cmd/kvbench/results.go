package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/benchjson"
)

// argvOf is the argv that reproduces cmd's run: its path and every flag
// set on the command line or from its environment variable, in name
// order. (Flags set from the environment are marked Changed but are not
// in the flag set's record of what Set was called on, so Visit would miss
// them.)
func argvOf(cmd *cobra.Command, args []string) []string {
	argv := strings.Fields(cmd.CommandPath())
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			argv = append(argv, "--"+f.Name+"="+f.Value.String())
		}
	})
	return append(argv, args...)
}

// writeResults records the command in res, checks it and writes it to out
// ("-": standard output).
func writeResults(cmd *cobra.Command, args []string, log *slog.Logger, res *benchjson.Results, out string) error {
	res.Command = argvOf(cmd, args)
	if err := res.Validate(); err != nil {
		return err
	}
	if out != "-" {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return fmt.Errorf("results directory: %w", err)
		}
	}
	if err := benchjson.Write(out, res); err != nil {
		return err
	}
	if out != "-" {
		log.Info("wrote results", "file", out)
	}
	return nil
}

// measureCommand completes cmd, the subcommand of a measuring tool (index,
// directory, agent, router): it takes no arguments, its --out defaults to
// bench/results/<tool>.json, and it runs run and writes the results there.
func measureCommand(cmd *cobra.Command, tool string, log *slog.Logger, run func(context.Context) (*benchjson.Results, error)) *cobra.Command {
	var out string
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		res, err := run(cmd.Context())
		if err != nil {
			return err
		}
		return writeResults(cmd, args, log, res, out)
	}
	cmd.Flags().StringVarP(&out, "out", "o", "bench/results/"+tool+".json", "where to write the JSON results (- for standard output)")
	return cmd
}
