package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/docgen"
)

func newDocs(log *slog.Logger) *cobra.Command {
	var (
		check bool
		root  string
	)
	cmd := &cobra.Command{
		Use:   "docs",
		Short: "Rewrite the generated figure tables in the repository's Markdown files from bench/results",
		Long: `Every block of a Markdown file between
  <!-- BEGIN generated: NAME -->
  <!-- END generated: NAME -->
is rendered from the results files in bench/results: NAME is one of
  ` + strings.Join(docgen.Names(), ", ") + `
or the name of a sim or replay report there (demo, sim-demo, ...), whose block is its
Markdown table. With --check nothing is written, and the command fails if any block
differs from what the results give (make docs-check).`,
		Example: `  kvbench docs            # after a benchmark run refreshed bench/results
  kvbench docs --check`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := docgen.FindRoot(root)
			if err != nil {
				return err
			}
			blocks, err := docgen.New(dir).Update(check)
			if err != nil {
				return err
			}
			for _, b := range blocks {
				if check {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: differs from %s\n", b, docgen.ResultsDir)
				} else {
					log.Info("rewrote", "block", b.String())
				}
			}
			if check && len(blocks) > 0 {
				return fmt.Errorf("%d generated blocks differ from the results; run kvbench docs (make docs)", len(blocks))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&check, "check", false, "write nothing; fail if a block differs from the results")
	cmd.Flags().StringVar(&root, "root", ".", "a directory inside the repository")
	return cmd
}
