package ops

import (
	"testing"

	"github.com/tether-project/tether/test/testbin"
)

func TestMain(m *testing.M) { testbin.Main(m, "test/ops") }

// tetherBin is the tether binary, built on first use.
var tetherBin = testbin.T
