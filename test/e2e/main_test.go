package e2e

import (
	"testing"

	"github.com/tether-project/tether/test/testbin"
)

func TestMain(m *testing.M) { testbin.Main(m, "test/e2e") }

// tetherBin is the tether binary, built on first use.
var tetherBin = testbin.T
