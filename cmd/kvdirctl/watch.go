package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/clitable"
)

// watchOpts are the --watch flags of status, workers and sessions.
type watchOpts struct {
	on       bool
	interval time.Duration
}

func (w *watchOpts) addFlags(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&w.on, "watch", "w", false, "refresh every --interval until interrupted (Ctrl-C)")
	cmd.Flags().DurationVar(&w.interval, "interval", 2*time.Second, "refresh interval of --watch")
}

// watchLoop runs show once, or with --watch every interval until ctx ends.
// A table refresh clears a terminal screen (and is separated by a blank line
// when stdout is not a terminal); JSON documents follow each other and YAML
// documents are separated by "---". An error during a watch is shown and the
// watch goes on.
func (a *app) watchLoop(cmd *cobra.Command, w watchOpts, show func(context.Context, io.Writer) error) error {
	ctx := cmd.Context()
	if !w.on {
		return show(ctx, a.out)
	}
	if w.interval <= 0 {
		return usageErrorf("--interval must be positive")
	}
	tty := isTerminal(a.rawOut)
	cmdline := cmd.CommandPath()
	for frame := 0; ; frame++ {
		var buf bytes.Buffer
		err := show(ctx, &buf)
		if ctx.Err() != nil {
			return nil
		}
		switch a.format {
		case clitable.Table:
			if tty {
				io.WriteString(a.rawOut, "\033[H\033[2J")
			} else if frame > 0 {
				io.WriteString(a.out, "\n")
			}
			fmt.Fprintf(a.out, "Every %v: %s    %s\n\n", w.interval, cmdline, a.now().Format(time.TimeOnly))
		case clitable.YAML:
			if frame > 0 {
				io.WriteString(a.out, "---\n")
			}
		}
		a.out.Write(buf.Bytes())
		if err != nil {
			fmt.Fprintf(a.errOut, "kvdirctl: %s (retrying every %v)\n", describe(err, a), w.interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.interval):
		}
	}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
