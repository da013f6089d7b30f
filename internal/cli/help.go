package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// WriteHelp writes --help: the summary, usage, examples, every flag by
// group with its environment variable and default, the common flags, how
// the environment is read, and the notes.
func (p *Program) WriteHelp(w io.Writer) {
	fs := p.Flags()
	var b strings.Builder
	b.WriteString(strings.TrimSpace(p.Summary))
	b.WriteString("\n\nUsage:\n  ")
	usage := p.Usage
	if usage == "" {
		usage = p.Name + " [flags]"
	}
	b.WriteString(strings.ReplaceAll(strings.TrimSpace(usage), "\n", "\n  "))
	b.WriteString("\n")
	if ex := strings.Trim(p.Examples, "\n"); ex != "" {
		b.WriteString("\nExamples:\n")
		b.WriteString(ex)
		b.WriteString("\n")
	}
	var all []*pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) { all = append(all, f) })
	var own []*pflag.Flag
	var ownTitle []string // title before own[i], "" for none
	gi := 0
	groups := p.groups
	if len(groups) == 0 || groups[0].start > 0 {
		groups = append([]group{{title: "Flags", start: 0}}, groups...)
	}
	for i, f := range all {
		title := ""
		for gi < len(groups) && groups[gi].start <= i {
			title = groups[gi].title
			gi++
		}
		if p.common[f.Name] {
			continue
		}
		own = append(own, f)
		ownTitle = append(ownTitle, title)
	}
	for i, f := range own {
		if ownTitle[i] != "" {
			fmt.Fprintf(&b, "\n%s:\n", ownTitle[i])
		}
		p.writeFlag(&b, f)
	}
	b.WriteString("\nCommon flags:\n")
	for _, f := range all {
		if p.common[f.Name] {
			p.writeFlag(&b, f)
		}
	}
	b.WriteString("\n")
	b.WriteString(p.environmentText())
	if notes := strings.Trim(p.Notes, "\n"); notes != "" {
		b.WriteString("\n")
		b.WriteString(notes)
		b.WriteString("\n")
	}
	io.WriteString(w, b.String())
}

// environmentText explains the environment variables.
func (p *Program) environmentText() string {
	file := ""
	if p.ConfigFile {
		file = ", which beats the config file (--config)"
	}
	return wrap(fmt.Sprintf("Environment: every flag but --help and --version has the environment variable shown beside it: "+
		"%s and the flag's name in capitals, dashes as underscores (--%s is %s); an empty variable counts as unset. "+
		"A flag on the command line beats the environment%s, which beats the default.",
		EnvVar(p.Env, "")+"<FLAG>", FlagLogLevel, p.EnvVar(FlagLogLevel), file), 78) + "\n"
}

// writeFlag writes one flag: its name, placeholder and variable, then its
// usage and default.
func (p *Program) writeFlag(b *strings.Builder, f *pflag.Flag) {
	arg, usage := pflag.UnquoteUsage(f)
	arg = placeholder(f, arg)
	head := "  "
	if f.Shorthand != "" {
		head += "-" + f.Shorthand + ", "
	}
	head += "--" + f.Name
	if arg != "" {
		head += " " + arg
	}
	if !noEnv(f.Name) {
		head += "  (" + p.EnvVar(f.Name) + ")"
	}
	b.WriteString(head)
	b.WriteString("\n")
	if d := defaultText(f); d != "" {
		usage += " (default " + d + ")"
	}
	b.WriteString(indent(wrap(usage, 72), "      "))
	b.WriteString("\n")
}

// placeholder names the value of f in the help.
func placeholder(f *pflag.Flag, arg string) string {
	if f.Value.Type() == "bool" {
		return ""
	}
	if a := f.Annotations[placeholderAnnotation]; len(a) == 1 {
		return a[0]
	}
	switch arg {
	case "string":
		return "STRING"
	case "int", "int64", "uint64", "uint", "int32":
		return "N"
	case "float64", "float32":
		return "NUMBER"
	case "duration":
		return "DURATION"
	case "stringSlice", "strings":
		return "LIST"
	}
	return arg
}

func defaultText(f *pflag.Flag) string {
	if f.Value.Type() == "bool" {
		return ""
	}
	switch f.DefValue {
	case "", "[]", "<nil>", "map[]":
		return ""
	}
	if f.Value.Type() == "stringSlice" {
		return strings.Trim(f.DefValue, "[]")
	}
	return f.DefValue
}

// wrap breaks s into lines of at most width characters, at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	for i, para := range strings.Split(s, "\n") {
		if i > 0 {
			b.WriteByte('\n')
		}
		n := 0
		for j, word := range strings.Fields(para) {
			if j > 0 && n+1+len(word) > width {
				b.WriteByte('\n')
				n = 0
			} else if j > 0 {
				b.WriteByte(' ')
				n++
			}
			b.WriteString(word)
			n += len(word)
		}
	}
	return b.String()
}

func indent(s, pre string) string {
	return pre + strings.ReplaceAll(s, "\n", "\n"+pre)
}

// placeholderAnnotation holds a flag's placeholder in the help.
const placeholderAnnotation = "kvdir-cli-placeholder"

// SetPlaceholder names the value of the flag name in the help ("--raft-addr
// HOST:PORT"), for a usage text without a back-quoted word.
func SetPlaceholder(fs *pflag.FlagSet, name, arg string) {
	if err := fs.SetAnnotation(name, placeholderAnnotation, []string{arg}); err != nil {
		panic(fmt.Sprintf("cli: SetPlaceholder: %v", err)) // a programming error: no such flag
	}
}
