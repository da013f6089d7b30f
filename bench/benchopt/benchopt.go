// Package benchopt is the rule most numeric fields of the Options of
// kvbench's measuring tools (bench/indexbench, dirbench, agentbench,
// routerbench) follow: a field left at zero, or set negative, takes the
// tool's default. A field for which a negative value means something else
// takes its default at zero only (cmp.Or).
package benchopt

// Number is the kinds of option fields Default applies to (a
// time.Duration is an int64).
type Number interface {
	~int | ~int64 | ~float64
}

// Default sets *v to def when *v <= 0. A NaN is not <= 0 and stays.
func Default[T Number](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
