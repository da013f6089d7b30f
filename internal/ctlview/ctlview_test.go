package ctlview

import (
	"reflect"
	"testing"
)

// TestNoPlainFloats checks that no view has a float64 or float32 field
// (directly, behind a pointer or in a slice): each number is a
// clitable.Float, so that a NaN or infinite value is null in the
// document instead of failing the whole command.
func TestNoPlainFloats(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(path string, tp reflect.Type)
	walk = func(path string, tp reflect.Type) {
		for tp.Kind() == reflect.Pointer || tp.Kind() == reflect.Slice || tp.Kind() == reflect.Array || tp.Kind() == reflect.Map {
			tp = tp.Elem()
		}
		if tp.Kind() == reflect.Float64 || tp.Kind() == reflect.Float32 {
			if tp.PkgPath() == "" {
				t.Errorf("%s is a plain %s: use clitable.Float", path, tp)
			}
			return
		}
		if tp.Kind() != reflect.Struct || seen[tp] {
			return
		}
		seen[tp] = true
		for i := range tp.NumField() {
			f := tp.Field(i)
			walk(path+"."+f.Name, f.Type)
		}
	}
	for _, v := range []any{Status{}, Router{}, BlockSizeMismatch{}, WorkerList{}, WorkerDetail{}, Match{}, SessionList{}, WhoHoldsList{},
		MemberList{}, SnapshotList{}, Change{}, CacheMismatch{}} {
		walk(reflect.TypeOf(v).Name(), reflect.TypeOf(v))
	}
}
