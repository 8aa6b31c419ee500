package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/tether-project/tether/cluster/pki"
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
