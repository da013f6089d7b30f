package helm

import (
	"testing"

	"github.com/kvdir/kvdir/internal/testkit"
)

// TestMain removes the binaries testkit.Binary builds.
func TestMain(m *testing.M) { testkit.Main(m) }
