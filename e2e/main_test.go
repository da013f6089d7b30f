package e2e

import (
	"testing"

	"github.com/kvdir/kvdir/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }
