package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/ops/operator"
)

// adminTLSFlags are the TLS options of the commands that call an edge's
// admin API over HTTPS (tether operator, tether audit verify).
type adminTLSFlags struct {
	caFile, certFile, keyFile *string
}

func addAdminTLSFlags(fs *flag.FlagSet) adminTLSFlags {
	return adminTLSFlags{
		caFile:   fs.String("cacert", "", "CA certificate (PEM) the edges' HTTPS certificates chain to (default: the system's roots)"),
		certFile: fs.String("cert", "", "client certificate (PEM), for edges with tls.http_client_auth: require"),
		keyFile:  fs.String("key", "", "the client certificate's key (PEM)"),
	}
}

// client is an HTTP client for the flags; nil (the caller's default
// client) when none is set.
func (f adminTLSFlags) client() (*http.Client, error) {
	if *f.caFile == "" && *f.certFile == "" && *f.keyFile == "" {
		return nil, nil
	}
	if (*f.certFile == "") != (*f.keyFile == "") {
		return nil, fmt.Errorf("%w: --cert and --key go together", errUsage)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if *f.caFile != "" {
		pool, err := pki.LoadPool(*f.caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: --cacert: %v", errUsage, err)
		}
		tc.RootCAs = pool
	}
	if *f.certFile != "" {
		kp, err := pki.LoadKeyPair(*f.certFile, *f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: --cert/--key: %v", errUsage, err)
		}
		tc.GetClientCertificate = kp.GetClientCertificate
	}
	return &http.Client{Transport: &http.Transport{Proxy: nil, IdleConnTimeout: 30 * time.Second, TLSClientConfig: tc}}, nil
}

// adminClient is an operator client of the edges' admin API at urls: with
// token, else $TETHER_ADMIN_TOKEN, over the TLS the flags describe.
func (f adminTLSFlags) adminClient(urls []string, token string) (*operator.Client, error) {
	if token == "" {
		token = os.Getenv(operator.EnvAdminToken)
	}
	hc, err := f.client()
	if err != nil {
		return nil, err
	}
	c, err := operator.New(urls, token, hc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, nil
}
