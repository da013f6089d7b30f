package compose

import (
	"bytes"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvdir/kvdir/internal/testkit"
)

// render runs docker-compose config on docker-compose.yml and the given
// overlay files, with .env's defaults only (none of the caller's KVDIR_
// variables), and decodes the result.
func render(t *testing.T, overlays ...string) Config {
	t.Helper()
	testkit.SkipIfShort(t, "runs docker-compose config")
	bin, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("no docker-compose on PATH")
	}
	args := []string{"--project-directory", ".", "-f", "docker-compose.yml"}
	for _, o := range overlays {
		args = append(args, "-f", o)
	}
	cmd := exec.Command(bin, append(args, "config")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "KVDIR_SECRETS_DIR=/secrets"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("docker-compose %v config: %v: %s", overlays, err, stderr.String())
	}
	var c Config
	if err := yaml.Unmarshal(stdout.Bytes(), &c); err != nil {
		t.Fatalf("decode docker-compose %v config: %v", overlays, err)
	}
	return c
}

func serviceNames(c Config) []string {
	return slices.Sorted(maps.Keys(c.Services))
}

// TestDefaultCluster renders docker-compose.yml alone, the cluster the
// chaos tests run on, and checks that it is still one directory group
// serving every model, with the services the harness names.
func TestDefaultCluster(t *testing.T) {
	c := render(t)
	if err := Check(c); err != nil {
		t.Fatal(err)
	}
	want := []string{"kvdir-agent1", "kvdir-agent2", "kvdir-agent3", "kvdir-agent4", "kvdir-dir1", "kvdir-dir2", "kvdir-dir3",
		"kvdir-engine1", "kvdir-engine2", "kvdir-engine3", "kvdir-engine4", "kvdir-router1", "kvdir-router2"}
	if got := serviceNames(c); !slices.Equal(got, want) {
		t.Errorf("services %v, want %v", got, want)
	}
	groups, _ := Groups(c)
	if len(groups) != 1 || len(groups[0].Models) != 0 {
		t.Errorf("groups %+v, want one serving every model", groups)
	}
	for _, r := range []string{"kvdir-router1", "kvdir-router2"} {
		if cmd := c.Services[r].Command; len(cmd) != 0 {
			t.Errorf("%s: command %v, want none (KVDIR_ROUTER_DIRECTORY only)", r, cmd)
		}
	}
}

// TestTwoGroups renders docker-compose.yml with groups.yml and checks the
// two groups: kvdir-dir1..3 serving KVDIR_MODEL, kvdir-dir4..6 serving
// KVDIR_MODEL2, each node's Raft membership its own group's; engine 5 and
// agent 5 on the second model and group; both routers naming both groups.
func TestTwoGroups(t *testing.T) {
	c := render(t, "groups.yml")
	if err := Check(c); err != nil {
		t.Fatal(err)
	}
	groups, _ := Groups(c)
	if len(groups) != 2 {
		t.Fatalf("%d groups, want 2: %+v", len(groups), groups)
	}
	want := []Group{
		{Nodes: []string{"kvdir-dir1", "kvdir-dir2", "kvdir-dir3"}, Members: []string{"kvdir-dir1:7001", "kvdir-dir2:7001", "kvdir-dir3:7001"}, Models: []string{"llama3-8b"}},
		{Nodes: []string{"kvdir-dir4", "kvdir-dir5", "kvdir-dir6"}, Members: []string{"kvdir-dir4:7001", "kvdir-dir5:7001", "kvdir-dir6:7001"}, Models: []string{"llama3-70b"}},
	}
	for i, g := range groups {
		if !slices.Equal(g.Nodes, want[i].Nodes) || !slices.Equal(g.Members, want[i].Members) || !slices.Equal(g.Models, want[i].Models) {
			t.Errorf("group %d: %+v, want %+v", i, g, want[i])
		}
	}
	if a, _ := c.Services["kvdir-agent5"].Env("KVDIR_AGENT_DIRECTORY"); a != "kvdir-dir4:7001,kvdir-dir5:7001,kvdir-dir6:7001" {
		t.Errorf("kvdir-agent5 dials %q, want group large", a)
	}
	for _, r := range []string{"kvdir-router1", "kvdir-router2"} {
		got := strings.Join(c.Services[r].Command, " ")
		if got != "--directory-group main=kvdir-dir1:7001,kvdir-dir2:7001,kvdir-dir3:7001 --directory-group large=kvdir-dir4:7001,kvdir-dir5:7001,kvdir-dir6:7001" {
			t.Errorf("%s: command %q, want a --directory-group for main and large", r, got)
		}
	}
	// Every service groups.yml adds is one cluster.sh up knows the image of.
	for _, s := range serviceNames(c) {
		if !strings.HasPrefix(s, "kvdir-dir") && !strings.HasPrefix(s, "kvdir-engine") && !strings.HasPrefix(s, "kvdir-agent") && !strings.HasPrefix(s, "kvdir-router") {
			t.Errorf("service %s: cluster.sh up maps no image to it", s)
		}
	}
	// The secrets it mounts are ones make deploy-secrets writes.
	src, err := os.ReadFile(filepath.Join("..", "gensecrets", "secrets.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"kvdir-dir4"`, `"kvdir-dir5"`, `"kvdir-dir6"`, `"engine5"`} {
		if !bytes.Contains(src, []byte(s)) {
			t.Errorf("deploy/gensecrets issues nothing for %s, which groups.yml mounts", s)
		}
	}
}

// TestCheckFindsMistakes makes, in the two-group configuration, the
// mistakes two groups invite, one at a time, and expects Check to report
// each.
func TestCheckFindsMistakes(t *testing.T) {
	base := render(t, "groups.yml")
	edit := func(c Config, svc string, f func(s *Service)) {
		s := c.Services[svc]
		env := maps.Clone(s.Environment)
		s.Environment = env
		s.Command = slices.Clone(s.Command)
		f(&s)
		c.Services[svc] = s
	}
	for _, tc := range []struct {
		name   string
		mutate func(c Config)
		want   string
	}{
		{"router leaves a group out", func(c Config) {
			edit(c, "kvdir-router1", func(s *Service) { s.Command = s.Command[:2] })
		}, "kvdir-router1: no --directory-group names group kvdir-dir4,kvdir-dir5,kvdir-dir6"},
		{"router with one list", func(c Config) {
			edit(c, "kvdir-router2", func(s *Service) {
				s.Command = nil
				s.Environment["KVDIR_ROUTER_DIRECTORY"] = "kvdir-dir1:7001,kvdir-dir2:7001,kvdir-dir3:7001"
			})
		}, "KVDIR_ROUTER_DIRECTORY names group kvdir-dir1,kvdir-dir2,kvdir-dir3 only, of 2 groups"},
		{"agent in the other model's group", func(c Config) {
			edit(c, "kvdir-agent5", func(s *Service) {
				s.Environment["KVDIR_AGENT_DIRECTORY"] = "kvdir-dir1:7001,kvdir-dir2:7001,kvdir-dir3:7001"
			})
		}, `which does not serve the agent's model "llama3-70b"`},
		{"agent and engine of different models", func(c Config) {
			edit(c, "kvdir-engine5", func(s *Service) { s.Environment["KVDIR_ENGINESIM_MODEL"] = "llama3-8b" })
		}, `kvdir-agent5: KVDIR_AGENT_MODEL "llama3-70b", its engine kvdir-engine5 serves "llama3-8b"`},
		{"members of both groups", func(c Config) {
			edit(c, "kvdir-router1", func(s *Service) { s.Command[3] = "large=kvdir-dir4:7001,kvdir-dir2:7001,kvdir-dir6:7001" })
		}, "is not the members of one directory group"},
		{"initial cluster across groups", func(c Config) {
			edit(c, "kvdir-dir4", func(s *Service) {
				s.Environment["KVDIR_DIRECTORY_INITIAL_CLUSTER"] = "n1=kvdir-dir1:7000,n4=kvdir-dir4:7000,n5=kvdir-dir5:7000,n6=kvdir-dir6:7000"
			})
		}, "is kvdir-dir1, a node of another group"},
		{"model in both groups", func(c Config) {
			for _, n := range []string{"kvdir-dir1", "kvdir-dir2", "kvdir-dir3"} {
				edit(c, n, func(s *Service) { s.Environment["KVDIR_DIRECTORY_MODELS"] = "llama3-8b,llama3-70b" })
			}
		}, "model llama3-70b is also served by group"},
		{"node of a group with another model", func(c Config) {
			edit(c, "kvdir-dir5", func(s *Service) { s.Environment["KVDIR_DIRECTORY_MODELS"] = "llama3-8b" })
		}, `kvdir-dir5: KVDIR_DIRECTORY_MODELS "llama3-8b" differs from its group's`},
		{"agent not waiting for its group", func(c Config) {
			edit(c, "kvdir-agent5", func(s *Service) {
				s.DependsOn = maps.Clone(s.DependsOn)
				delete(s.DependsOn, "kvdir-dir6")
			})
		}, "kvdir-agent5: does not wait for its group's node kvdir-dir6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Services: maps.Clone(base.Services)}
			tc.mutate(c)
			err := Check(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Check: %v, want a finding saying %q", err, tc.want)
			}
		})
	}
}
