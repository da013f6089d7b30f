package grafana

import (
	"slices"
	"strings"
	"testing"
)

// TestDashboardShape checks the dashboard's structure: it loads, every panel
// has an id, a title and a Prometheus data source, every query has a refId,
// and the topics an operator needs have panels (listed below).
func TestDashboardShape(t *testing.T) {
	d, err := Load(DashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q title %q: both are needed for provisioning", d.UID, d.Title)
	}
	hasDS := slices.ContainsFunc(d.Templating.List, func(v struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query any    `json:"query"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	})
	if !hasDS {
		t.Error("no datasource template variable of type prometheus")
	}
	ids := map[int]bool{}
	var titles []string
	queries, panels := 0, 0
	for _, p := range d.AllPanels() {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		titles = append(titles, strings.ToLower(p.Title+" "+p.Description))
		if p.Type == "row" {
			continue
		}
		panels++
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source should be the ${datasource} variable", p.Title)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: grid position %+v", p.Title, p.GridPos)
		}
		refs := map[string]bool{}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: query %q with refId %q (empty, or refId repeated)", p.Title, tg.Expr, tg.RefID)
			}
			refs[tg.RefID] = true
			queries++
		}
	}
	all := strings.Join(titles, "\n")
	for _, topic := range []string{"hit rate", "ttft", "routing decisions", "fallback", "raft", "index", "event lag"} {
		if !strings.Contains(all, topic) {
			t.Errorf("no panel about %q", topic)
		}
	}
	t.Logf("%d panels, %d queries", panels, queries)
}
