package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// NamedList is one item of a NamedLists flag: a name and its list, as in
// --directory-group NAME=HOST:PORT,HOST:PORT.
type NamedList struct {
	Name  string
	Items []string
}

// NamedLists is a repeatable flag value of NAME=ITEM[,ITEM...] stored in
// *p, in the order given; one value may also hold several, separated by
// ';' (for an environment variable). A name given twice, a name without
// items or an item without a name is an error.
func NamedLists(p *[]NamedList) pflag.Value { return &namedLists{p: p} }

type namedLists struct{ p *[]NamedList }

func (v *namedLists) Type() string { return "NAME=LIST" }

func (v *namedLists) String() string {
	parts := make([]string, len(*v.p))
	for i, n := range *v.p {
		parts[i] = n.Name + "=" + strings.Join(n.Items, ",")
	}
	return strings.Join(parts, ";")
}

func (v *namedLists) Set(s string) error {
	for part := range strings.SplitSeq(s, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		name, list, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return fmt.Errorf("%q: want NAME=ITEM[,ITEM...]", part)
		}
		items := splitList(list)
		if len(items) == 0 {
			return fmt.Errorf("%q: %s has an empty list", part, name)
		}
		for _, n := range *v.p {
			if n.Name == name {
				return fmt.Errorf("%q: the name %s is given twice", part, name)
			}
		}
		*v.p = append(*v.p, NamedList{Name: name, Items: items})
	}
	return nil
}
