package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// flagTables are the guides' tables of flags: the first column names the
// flags (after an optional subcommand), and a column headed "environment"
// names their variables.
var flagTables = []struct{ file, binary string }{
	{"cmd/kvdirctl/README.md", "kvdirctl"},
	{"cmd/enginesim/README.md", "enginesim"},
}

var (
	flagRE = regexp.MustCompile(`--[a-z][a-z0-9-]*`)
	envRE  = regexp.MustCompile(`KVDIR_[A-Z0-9_]*[A-Z0-9]`)
	subRE  = regexp.MustCompile("^`([a-z-]+) --")
)

// TestFlagTables checks every flag and variable a guide's flag table
// names against the binary's --help (of the subcommand the row names), so
// that a flag renamed in the code or in the guide fails here.
func TestFlagTables(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries (e2e tier); not with -short")
	}
	buildBin(t)
	for _, ft := range flagTables {
		src, err := os.ReadFile(filepath.Join(root, ft.file))
		if err != nil {
			t.Fatal(err)
		}
		help := map[string]string{}
		helpOf := func(sub string) string {
			if h, ok := help[sub]; ok {
				return h
			}
			args := []string{"--help"}
			if sub != "" {
				args = []string{sub, "--help"}
			}
			out, err := exec.Command(filepath.Join(root, "bin", ft.binary), args...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s %v: %v\n%s", ft.binary, args, err, out)
			}
			help[sub] = string(out)
			return help[sub]
		}
		envCol, rows := -1, 0
		for i, line := range strings.Split(string(src), "\n") {
			if !strings.HasPrefix(line, "|") {
				envCol = -1
				continue
			}
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for k := range cells {
				cells[k] = strings.TrimSpace(cells[k])
			}
			if cells[0] == "flag" {
				for k, c := range cells {
					if c == "environment" {
						envCol = k
					}
				}
				continue
			}
			if !strings.HasPrefix(cells[0], "`") || !strings.Contains(cells[0], "--") {
				continue
			}
			sub := ""
			if m := subRE.FindStringSubmatch(cells[0]); m != nil {
				sub = m[1]
			}
			h := helpOf(sub)
			rows++
			for _, f := range flagRE.FindAllString(cells[0], -1) {
				if !regexp.MustCompile(regexp.QuoteMeta(f) + `\b[^-]`).MatchString(h) {
					t.Errorf("%s:%d: %s: %s %s--help has no flag %s", ft.file, i+1, cells[0], ft.binary, sub+" ", f)
				}
			}
			if envCol >= 0 && envCol < len(cells) {
				for _, e := range envRE.FindAllString(cells[envCol], -1) {
					if !strings.Contains(h, e+" ") {
						t.Errorf("%s:%d: %s: %s %s--help does not list the variable %s", ft.file, i+1, cells[0], ft.binary, sub+" ", e)
					}
				}
			}
		}
		if rows == 0 {
			t.Errorf("%s: no flag table found", ft.file)
		}
		t.Logf("%s: %d flag rows checked against %s --help", ft.file, rows, ft.binary)
	}
}
