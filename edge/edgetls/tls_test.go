package edgetls

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/edge/config"
)

// What runs unprotected is said at startup: a file without a tls section
// (plaintext, kept working for configurations that predate it), plaintext
// stated, and an embedded NATS server anyone may publish to.
func TestWarningsSayWhatRunsPlaintext(t *testing.T) {
	for _, c := range []struct {
		mode string
		want string
	}{
		{"", "no tls section"},
		{config.TLSModePlaintext, "tls.mode is plaintext"},
	} {
		cfg := config.DefaultConfig()
		cfg.TLS.Mode = c.mode
		cfg.NATS.Embedded = true
		tl, err := Load(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		w := strings.Join(tl.Warnings(&cfg), "\n")
		if !strings.Contains(w, c.want) || !strings.Contains(w, "embedded NATS without TLS") {
			t.Errorf("tls.mode %q: warnings %q, want %q and the embedded NATS server's", c.mode, w, c.want)
		}
		if tl.Scheme() != "http" || tl.Worker != nil || tl.Cluster != nil {
			t.Errorf("tls.mode %q: TLS configured: %+v", c.mode, tl)
		}
	}
}
