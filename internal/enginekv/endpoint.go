package enginekv

import (
	"fmt"
	"strconv"
	"strings"
)

// OffsetEndpoint is endpoint for data-parallel rank r, as vLLM's
// offset_endpoint_port: a tcp port moves up by r (port 0 stays 0: any free
// port), an ipc or inproc path gains the suffix _dp<r>.
func OffsetEndpoint(endpoint string, r int) (string, error) {
	switch {
	case strings.HasPrefix(endpoint, "tcp://"):
		i := strings.LastIndexByte(endpoint, ':')
		port, err := strconv.Atoi(endpoint[i+1:])
		if i < len("tcp://") || err != nil || port < 0 || port+r > 65535 {
			return "", fmt.Errorf("%q: want tcp://host:port (rank %d adds %d to the port)", endpoint, r, r)
		}
		if port == 0 || r == 0 {
			return endpoint, nil
		}
		return endpoint[:i+1] + strconv.Itoa(port+r), nil
	case strings.HasPrefix(endpoint, "ipc://"), strings.HasPrefix(endpoint, "inproc://"):
		if r == 0 {
			return endpoint, nil
		}
		return fmt.Sprintf("%s_dp%d", endpoint, r), nil
	}
	return "", fmt.Errorf("%q: want tcp://host:port or ipc://path", endpoint)
}
