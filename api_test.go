package idem_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/seed094d4201/idem"
)

// The root package is the user's API: what only this module's
// transactional modes need (a claim in memory only, the Codec on records,
// the options with defaults) goes through internal/seam, never onto Store
// or Ticket, where every user's completion list would offer it.
func TestRootAPIIsTheUsers(t *testing.T) {
	for typ, want := range map[reflect.Type][]string{
		reflect.TypeFor[*idem.Store[int]]():  {"Begin", "Close", "Forget", "Len", "Records", "Resolve", "RunOnce", "Shutdown", "Sweep"},
		reflect.TypeFor[*idem.Ticket[int]](): {"Context", "Do", "Finish", "Release", "Replayed", "Result"},
	} {
		var got []string
		for i := range typ.NumMethod() {
			got = append(got, typ.Method(i).Name)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%v has methods %v, want the user's %v", typ, got, want)
		}
	}
}
